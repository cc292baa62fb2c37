"""Host-change notices: the rank-0 process long-polls the driver for the latest notice.

Notices carry a strictly increasing sequence number. A round records the highest
notice it already reflects, so a notice is pending exactly when the latest known
number is higher; nothing is lost when a notice arrives during a reset.
"""

from __future__ import annotations

import logging
import threading
import time

from elasticrun import protocol
from elasticrun.worker.client import DriverClient, DriverUnreachableError, RequestRefusedError

log = logging.getLogger("elasticrun.notices")


class NoticeWatcher:
    def __init__(self, client: DriverClient) -> None:
        self._client = client
        self._latest = 0
        self._active = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="elasticrun-notices",
                                        daemon=True)
        self._thread.start()

    @property
    def latest(self) -> int:
        return self._latest

    def set_active(self, active: bool) -> None:
        """Only the rank-0 process polls; the others stay idle."""
        if active:
            self._active.set()
        else:
            self._active.clear()

    def _loop(self) -> None:
        while True:
            self._active.wait()
            try:
                reply = self._client.call(
                    protocol.PATH_NOTICES,
                    {"after": self._latest, "timeout": protocol.MAX_POLL_S},
                    wait=protocol.MAX_POLL_S,
                )
                self._latest = max(self._latest, int(reply["seq"]))
            except (DriverUnreachableError, RequestRefusedError) as exc:
                log.debug("notice poll failed: %s", exc)
                time.sleep(1.0)
