"""A moment for Gloo's threads before a script's process group is destroyed (torch 2.13).

Every backward stashes a Python object (a contextvars context) in its thread's state
(torch/autograd/graph.py, `_engine_run_backward`), and each Gloo collective started
during it, DDP's gradient allreduces among them, keeps a copy of that state. Gloo's worker
thread drops its last reference to a finished collective a moment after the caller has seen
it complete, and dropping that object needs the GIL. A script that ends right after its
last step destroys the group at once (`destroy_process_group`, then DDP's reducer freed),
and the group's destructor joins Gloo's threads while holding the GIL: if one of them is
still dropping a collective, neither moves again (pytorch/pytorch#180700). Measured here:
2 of 15 clean 2-worker runs of a plain DDP script hung at exit when torch._dynamo was
imported before the script started, as a worker template does.

`destroy_process_group` is given a pause first, the GIL released, in which Gloo's
threads finish with what they hold; the script's own call is unchanged otherwise. And a
group the script leaves to the interpreter's end (a Hugging Face Trainer does) is destroyed
so, at exit, while the interpreter is whole: destroyed during its finalisation instead,
Gloo's threads can abort the process after a successful run ("terminate called without an
active exception", seen once in the suite's Trainer jobs). elasticrun does the same for
its own groups (torch/world/runtime.py). A script that calls er.init() gets all of it back
as it was (elasticrun tears its rounds' groups down itself, and a pause there would slow
every recovery).
"""

from __future__ import annotations

import atexit
import contextlib
import functools
import sys
import time
from collections.abc import Callable
from typing import Any

SETTLE_S = 0.05  # the GIL is handed over within milliseconds: ample, and cheap at exit


def settle_before_destroy() -> None:
    """Wraps torch.distributed.destroy_process_group (if torch.distributed is imported)."""
    dist = sys.modules.get("torch.distributed")
    original = getattr(dist, "destroy_process_group", None)
    if dist is None or original is None or hasattr(original, "_elasticrun_original"):
        return
    dist.destroy_process_group = _settling(original)  # type: ignore[attr-defined]
    atexit.register(destroy_left_group)  # first registered: it runs after the script's


def restore() -> None:
    """Undoes settle_before_destroy()."""
    atexit.unregister(destroy_left_group)
    dist = sys.modules.get("torch.distributed")
    original = getattr(getattr(dist, "destroy_process_group", None), "_elasticrun_original",
                       None)
    if original is not None:
        dist.destroy_process_group = original  # type: ignore[union-attr]


def destroy_left_group() -> None:
    """At exit: the default group, if the script left it, is destroyed (with the pause)."""
    dist = sys.modules.get("torch.distributed")
    if dist is None or not dist.is_available() or not dist.is_initialized():
        return
    with contextlib.suppress(Exception):  # a group that fails to go is abandoned, as before
        dist.destroy_process_group()


def _settling(destroy: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(destroy)
    def destroy_process_group(*args: Any, **kwargs: Any) -> Any:
        time.sleep(SETTLE_S)
        return destroy(*args, **kwargs)

    destroy_process_group._elasticrun_original = destroy  # type: ignore[attr-defined]
    return destroy_process_group
