"""The driver's word to a worker between collectives: hosts changed, or your round broke.

A watcher thread in every worker long-polls the driver. Host-change notices carry a
strictly increasing sequence number; a round records the highest notice it reflects,
so a notice is pending exactly when the latest known number is higher, and nothing is
lost when one arrives during a reset. When the driver declares the worker's round
broken (a member failed), the watcher calls `on_round_broken` so that a worker blocked
in a collective is released at once instead of at the collective timeout. When the driver
has not answered for the driver timeout, it is gone: the watcher calls `on_driver_lost`.
When a round stalls, the driver probes its members through these polls: a watcher answers
a probe at once, with what `liveness` says (worker/liveness.py).
"""

from __future__ import annotations

import logging
import os
import signal
import sys
import threading
import time
from collections import deque
from collections.abc import Callable
from typing import Any, NoReturn

from elasticrun import protocol
from elasticrun.worker.client import DriverClient, DriverUnreachableError, RequestRefusedError

log = logging.getLogger("elasticrun.notices")


class NoticeWatcher:
    def __init__(
        self,
        client: DriverClient,
        current_round: Callable[[], int],
        on_round_broken: Callable[[int], None],
        on_driver_lost: Callable[[str], None],
        worker_id: str = "",
        liveness: Callable[[], dict[str, Any]] | None = None,
    ) -> None:
        self._client = client
        self._worker_id = worker_id
        self._liveness = liveness  # what this worker says when a stalled round is probed
        self._probe = 0  # the newest probe of a stalled round the driver asked
        self._answered = 0  # the newest probe this watcher answered
        self._probed_at = (0, 0.0)  # (round, time.monotonic()) of the newest probe
        self._current_round = current_round
        self._on_round_broken = on_round_broken
        self._on_driver_lost = on_driver_lost
        # Short enough that a driver that stopped answering is noticed within the timeout.
        self._poll_s = min(protocol.MAX_POLL_S, max(1.0, client.unreachable_timeout / 2))
        self._latest = 0
        self._notices: deque[protocol.Notice] = deque(maxlen=64)
        self._handled_broken = 0
        self._stopped = False
        self._thread = threading.Thread(target=self._loop, name="elasticrun-notices",
                                        daemon=True)

    @property
    def latest(self) -> int:
        """The highest host-change notice number the driver has announced."""
        return self._latest

    def notices_after(self, seq: int) -> list[protocol.Notice]:
        """The notices newer than `seq` that this watcher received (the newest 64)."""
        return [notice for notice in list(self._notices) if notice.seq > seq]

    @property
    def broken_round(self) -> int:
        """The highest round the driver has said broke (0: none yet)."""
        return self._handled_broken

    def probed(self, round_number: int, since: float) -> bool:
        """Whether the driver probed round `round_number` after `since` (time.monotonic())."""
        number, at = self._probed_at
        return number == round_number and at >= since

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        """Its current poll is its last (it ends within the poll's bound)."""
        self._stopped = True

    def _loop(self) -> None:
        while not self._stopped:
            watched = max(self._current_round(), self._handled_broken + 1)
            payload: dict[str, Any] = {"after": self._latest, "round": watched,
                                       "timeout": self._poll_s, "worker_id": self._worker_id,
                                       "probe_ack": self._probe}
            if self._probe > self._answered and self._liveness is not None:
                payload["liveness"] = self._liveness()  # the answer to a probe
                self._answered = self._probe
            try:
                reply = self._client.call(protocol.PATH_NOTICES, payload, wait=self._poll_s)
            except DriverUnreachableError as exc:
                self._on_driver_lost(str(exc))
                return
            except RequestRefusedError as exc:
                log.debug("notice poll failed: %s", exc)
                time.sleep(1.0)
                continue
            # Kept before `latest` moves on: whoever sees a newer `latest` finds its notice.
            self._notices.extend(notice for notice in map(protocol.Notice.from_json,
                                                          reply.get("notices", ()))
                                 if notice.seq > self._latest)
            self._latest = max(self._latest, int(reply["seq"]))
            probe = int(reply.get("probe", 0))
            if probe > self._probe:
                self._probe = probe
                self._probed_at = (watched, time.monotonic())
            broken = int(reply.get("broken_round", 0))
            if broken >= watched:
                self._handled_broken = broken
                self._on_round_broken(broken)


def ask_round_broken(client: DriverClient, number: int, within: float, after: int = 0
                     ) -> bool:
    """Whether the driver says round `number` broke, waiting at most `within` seconds for it
    to say so (its notices long-poll answers at once then). `after`: the latest host-change
    notice known (a newer one does not end the wait)."""
    deadline = time.monotonic() + within
    while True:
        wait = max(0.0, deadline - time.monotonic())
        try:
            reply = client.call(protocol.PATH_NOTICES,
                                {"after": after, "round": number, "timeout": wait}, wait=wait)
        except RequestRefusedError as exc:
            log.debug("asking whether round %d broke failed: %s", number, exc)
            return False
        if int(reply.get("broken_round", 0)) >= number:
            return True
        after = max(after, int(reply.get("seq", after)))  # a host-change notice
        if time.monotonic() >= deadline:
            return False


def stop_for_good(rank: int, reason: str) -> NoReturn:
    """The driver is gone: nobody will ever tell this worker what to do again. It stops,
    with everything it started, instead of waiting forever."""
    try:
        sys.stderr.write(f"elasticrun: rank {rank}: {reason}; the driver is gone, so this "
                         f"worker stops\n")
        sys.stderr.flush()
    finally:
        if os.getpgrp() == os.getsid(0):  # our own session, as elasticrun started us
            os.killpg(os.getpgrp(), signal.SIGKILL)
        os._exit(1)
