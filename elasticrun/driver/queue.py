"""One event queue in front of the round machine.

Each event goes to the machine with the time it is handled at; each action it returns goes
to `act`, in order. Events posted while acting (or by timers) wait their turn behind: the
machine never sees an event re-entrantly. Timers the machine sets come back as TimerFired.
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from collections.abc import Callable

from elasticrun.driver.rounds.actions import Action, SetTimer
from elasticrun.driver.rounds.events import Event, TimerFired


class EventQueue:
    def __init__(self, handle: Callable[[Event, float], list[Action]],
                 act: Callable[[Action], None]) -> None:
        self._handle = handle
        self._act = act
        self._queue: deque[Event] = deque()
        self._draining = False
        self._timers: set[asyncio.TimerHandle] = set()
        self.closed = False

    def post(self, event: Event) -> None:
        """Handles `event` now, or after the one being handled. An exception from the
        machine or an action drops what is queued and propagates."""
        if self.closed:
            return
        self._queue.append(event)
        if self._draining:
            return
        self._draining = True
        try:
            while self._queue:
                for action in self._handle(self._queue.popleft(), time.monotonic()):
                    if isinstance(action, SetTimer):
                        self._set_timer(action)
                    else:
                        self._act(action)
        except BaseException:
            self._queue.clear()
            raise
        finally:
            self._draining = False

    def close(self) -> None:
        """No event is handled any more; pending timers are cancelled."""
        self.closed = True
        for timer in self._timers:
            timer.cancel()
        self._timers.clear()

    def _set_timer(self, action: SetTimer) -> None:
        fired = TimerFired(action.timer)

        def fire() -> None:
            self._timers.discard(handle)
            self.post(fired)

        handle = asyncio.get_running_loop().call_later(
            max(0.0, action.at - time.monotonic()), fire)
        self._timers.add(handle)
