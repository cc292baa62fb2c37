"""The pace of a torchrun-style script, from its DDP models' own timings (for the foothold).

A script that never calls er.init() runs torch's collectives, out of elasticrun's sight;
but DDP's reducer times every backward pass (host clocks on CPU, CUDA events on a GPU),
once asked to sample each iteration. Its gradient reduction minus the part that overlapped
the backward computation is what the training thread waited for its peers. After an
optimizer step (torch's global step hook: any optimizer, in a plain loop, a Hugging Face or
a Lightning Trainer), at most every SAMPLE_S, that wait and the time since the previous
step go to the pace meter (worker/pace.py). A script with no DDP model reports nothing.
"""

from __future__ import annotations

import functools
import logging
import time
import weakref
from typing import Any

from elasticrun.worker.pace import PaceMeter

log = logging.getLogger("elasticrun.worker")

SAMPLE_S = 0.2  # a step is looked at no more often (reading the reducer's timings: ~50 us)
NS = 1e-9


class DdpPace:
    def __init__(self, meter: PaceMeter) -> None:
        self.meter = meter
        self._models: weakref.WeakSet[Any] = weakref.WeakSet()
        self._last_step: float | None = None
        self._next_sample = 0.0
        self._undo: list[Any] = []

    def install(self) -> None:
        """Adopts every DDP model the script builds from now on, and samples its steps."""
        from torch.nn.parallel import DistributedDataParallel
        from torch.optim.optimizer import register_optimizer_step_post_hook

        original = DistributedDataParallel.__init__
        adopt = self._adopt

        @functools.wraps(original)
        def init(model: Any, *args: Any, **kwargs: Any) -> None:
            original(model, *args, **kwargs)
            adopt(model)

        DistributedDataParallel.__init__ = init  # type: ignore[method-assign,assignment]
        handle = register_optimizer_step_post_hook(self._stepped)
        self._undo = [lambda: setattr(DistributedDataParallel, "__init__", original),
                      handle.remove]

    def uninstall(self) -> None:
        for undo in self._undo:
            undo()
        self._undo = []

    def _adopt(self, model: Any) -> None:
        try:
            model._set_ddp_runtime_logging_sample_rate(1)
        except (AttributeError, RuntimeError) as exc:  # (a DDP without its logger)
            log.debug("no pace from this DDP model: %s", exc)
            return
        self._models.add(model)

    def _stepped(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        now = time.monotonic()
        last, self._last_step = self._last_step, now
        if last is None or now < self._next_sample or not self._models:
            return
        self._next_sample = now + SAMPLE_S
        waited = 0.0
        for model in list(self._models):
            try:
                data = model._get_ddp_logging_data()
            except RuntimeError:
                continue
            blocked = int(data.get("backward_comm_time", 0)) \
                - int(data.get("backward_compute_comm_overlap_time", 0))
            waited += max(0, blocked) * NS
        self.meter.sampled(waited, now - last)
