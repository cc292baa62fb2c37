"""Tells the driver the flash commits' cadence in force (PATH_FLASH, for /status): from the
writer thread, never the training thread; when the cadence changes, else every REPORT_S.
A driver that does not answer costs a bounded wait of the writer thread, and a log line at
debug level."""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Mapping

from elasticrun import protocol
from elasticrun.flash.committer import CommitStats
from elasticrun.worker.client import DriverClient, DriverUnreachableError, RequestRefusedError

log = logging.getLogger("elasticrun.flash")

REPORT_S = 10.0
TIMEOUT_S = 2.0


class CadenceReporter:
    def __init__(self, env: Mapping[str, str] | None = None) -> None:
        env = os.environ if env is None else env
        self._worker = env.get(protocol.ENV_WORKER_ID, "")
        self._client: DriverClient | None = None
        if self._worker and protocol.ENV_RENDEZVOUS_ADDR in env:
            self._client = DriverClient.from_env().bounded(TIMEOUT_S)
        self._last = 0.0
        self._every = 0

    def written(self, stats: CommitStats) -> None:
        now = time.monotonic()
        if self._client is None or (stats.every == self._every and now - self._last < REPORT_S):
            return
        self._last, self._every = now, stats.every
        try:
            self._client.call(protocol.PATH_FLASH, {
                "worker_id": self._worker, "every": stats.every, "copy_s": stats.copy_s,
                "step_s": stats.step_s, "commits": stats.commits, "skipped": stats.skipped})
        except (DriverUnreachableError, RequestRefusedError, OSError) as exc:
            log.debug("the driver did not take the flash cadence: %s", exc)
