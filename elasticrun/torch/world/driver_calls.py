"""The calls this worker makes to the driver outside a join: that it holds its round's
committed state (and which commit it restored, from where), that it completed its first
commit, that its own error ends it, and whether its round broke.

`DriverCalls` is a mixin of `Runtime` (runtime.py). A driver that refuses a call (it is
being stopped) changes nothing here; only the sync report lets an unreachable driver raise.
"""

from __future__ import annotations

import logging
from typing import Protocol

from elasticrun import protocol
from elasticrun.worker.client import DriverClient, DriverUnreachableError, RequestRefusedError
from elasticrun.worker.notices import NoticeWatcher, ask_round_broken
from elasticrun.worker.pace import PaceReporter

log = logging.getLogger("elasticrun.worker")


class Caller(Protocol):
    """What the calls need of the runtime."""

    client: DriverClient | None
    worker_id: str
    notices: NoticeWatcher | None
    pace: PaceReporter | None
    restored: tuple[int, str] | None

    @property
    def round(self) -> int: ...


class DriverCalls:
    """The driver calls of a `Caller` (without a driver, none is made)."""

    # The commit this worker's last sync restored (number, where from): told to the
    # driver with its next sync report.
    restored: tuple[int, str] | None = None

    def report_synced(self: Caller) -> None:
        """Tells the driver that this worker holds its round's committed state, so that
        rank 0 of a later round is always one that does."""
        if self.client is None:
            return
        if self.pace is not None:
            self.pace.meter.restart()  # (the sync's waits say nothing of the members' pace)
        report: dict[str, object] = {"worker_id": self.worker_id, "round": self.round}
        if self.restored is not None:
            report["restored_commit"], report["restored_from"] = self.restored
            self.restored = None
        try:
            self.client.call(protocol.PATH_SYNCED, report)
        except RequestRefusedError as exc:  # it is being stopped: nothing to hold for
            log.debug("the driver did not take the sync report: %s", exc)

    def report_trained(self: Caller) -> None:
        """Tells the driver that this worker completed its first commit (best effort)."""
        if self.client is None:
            return
        try:
            self.client.call(protocol.PATH_TRAINED, {"worker_id": self.worker_id})
        except (RequestRefusedError, DriverUnreachableError) as exc:
            log.debug("the driver did not take the first-commit report: %s", exc)

    def note_restored(self: Caller, commit: int, source: str) -> None:
        """This worker's sync restored commit `commit` from `source` (a host, a directory)."""
        self.restored = (commit, source)

    def failing(self: Caller, failure: str, unrecoverable: bool = False) -> None:
        """Tells the driver that this worker's own error ends it (best effort);
        `unrecoverable`: the job cannot go on from its committed state."""
        if self.client is None:
            return
        try:
            self.client.call(protocol.PATH_FAILING,
                             {"worker_id": self.worker_id, "failure": failure,
                              "unrecoverable": unrecoverable})
        except (RequestRefusedError, DriverUnreachableError) as exc:
            log.debug("the driver did not take the failure report: %s", exc)

    def round_broken(self: Caller, within: float) -> bool:
        """Whether the driver says this worker's current round broke, waiting at most
        `within` seconds for it to say so."""
        number = self.round
        if self.client is None or number == 0:
            return False
        if self.notices is not None and self.notices.broken_round >= number:
            return True
        after = self.notices.latest if self.notices is not None else 0
        return ask_round_broken(self.client, number, within, after)
