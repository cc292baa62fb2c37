"""Signal handlers on an event loop that give back what was there before.

asyncio's `remove_signal_handler` leaves SIGINT at Python's default handler and other
signals at SIG_DFL, whatever they were before: a process that ignored SIGINT (started in
the background by a shell, under nohup) would no longer, and `elasticrun.run` would change
its caller's handlers. `handling` puts the previous ones back."""

from __future__ import annotations

import asyncio
import contextlib
import signal
import threading
from collections.abc import Callable, Iterator, Mapping
from typing import Any


@contextlib.contextmanager
def handling(loop: asyncio.AbstractEventLoop,
             handlers: Mapping[signal.Signals, tuple[Callable[..., object], tuple[Any, ...]]]
             ) -> Iterator[None]:
    """While inside, each signal calls its `(callback, args)` on `loop`."""
    before = {sig: signal.getsignal(sig) for sig in handlers}
    for sig, (callback, args) in handlers.items():
        loop.add_signal_handler(sig, callback, *args)
    try:
        yield
    finally:
        for sig, previous in before.items():
            loop.remove_signal_handler(sig)
            # only the main thread sets handlers (a loop in another thread only relays them)
            if threading.current_thread() is threading.main_thread() and previous is not None:
                signal.signal(sig, previous)
