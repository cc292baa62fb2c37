"""One process's flash commits: where they go, taking them, and resuming from them.

The piece every integration shares (the Hugging Face and Lightning callbacks, the plain
loop's FlashCommits): it knows the process's rank and whether it writes its host's shared
part (the lowest local rank does, where state is replicated), takes a commit when a step
ends, and on a restart agrees with the other ranks on the step to resume from
(agreement.py) and hands back that step's parts.
"""

from __future__ import annotations

import logging
import os
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from elasticrun.flash import agreement
from elasticrun.flash.agreement import Holdings
from elasticrun.flash.committer import Capture, CommitStats, FlashCommitter
from elasticrun.flash.report import CadenceReporter
from elasticrun.flash.store import (
    KEPT,
    OWN_KEPT,
    SHARED,
    FlashStore,
    flash_directory,
    own_part,
)
from elasticrun.torch.elastic.cadence import BUDGET, Cadence

log = logging.getLogger("elasticrun.flash")


@dataclass(frozen=True)
class Resumed:
    step: int
    shared: Any  # None where state is not replicated
    own: Any  # None where this rank's own part was not found (its RNG states then stay)


class FlashSession:
    def __init__(self, replicated: bool = True, budget: float = BUDGET,
                 directory: Path | None = None) -> None:
        self.replicated = replicated
        self.rank = int(os.environ.get("RANK", "0"))
        self.writes_shared = replicated and int(os.environ.get("LOCAL_RANK", "0")) == 0
        self.directory = directory if directory is not None else flash_directory()
        self._budget = budget
        self._committer: FlashCommitter | None = None

    @property
    def enabled(self) -> bool:
        """Flash commits are taken: under elasticrun, with host snapshots on."""
        return self.directory is not None

    def step_ended(self, step: int, capture: Capture) -> bool:
        """`capture()` gives (the shared state, this rank's own state) when a commit is due;
        the shared state is asked for only where this rank writes it."""
        if self.directory is None:
            return False
        if self._committer is None:
            self._committer = FlashCommitter(FlashStore(self.directory), self.rank,
                                             Cadence(budget=self._budget),
                                             CadenceReporter().written,
                                             OWN_KEPT if self.replicated else KEPT)
        writes_shared = self.writes_shared

        def parts() -> tuple[Any | None, Any]:
            shared, own = capture()
            return (shared if writes_shared else None), own

        return self._committer.step_ended(step, parts)

    def stats(self) -> CommitStats | None:
        return None if self._committer is None else self._committer.stats()

    def flush(self, timeout: float = 60.0) -> bool:
        return True if self._committer is None else self._committer.flush(timeout)

    def resume(self, script_step: int = 0) -> Resumed | None:
        """The flash commit to resume from, if one newer than `script_step` (the step of the
        script's own checkpoint) is held: agreed by every rank (a collective where
        torch.distributed is initialized: every rank calls it)."""
        store = FlashStore(self.directory) if self.directory is not None else None
        mine = Holdings(tuple(store.steps(SHARED)) if store else (),
                        tuple(store.steps(own_part(self.rank))) if store else (), script_step)
        plan = agreement.choose(agreement.gather(mine), self.replicated)
        if plan is None:
            return None
        shared = None
        if self.replicated:
            if store is not None and plan.step in mine.shared:
                part = store.read(plan.step, SHARED)
                shared = None if part is None else part["state"]
            shared = agreement.pass_shared(plan, self.rank, shared)
        own_file = store.read(plan.step, own_part(self.rank)) if store is not None else None
        own = None if own_file is None else own_file["state"]
        ready = shared is not None if self.replicated else own is not None
        if not agreement.confirm(ready):
            log.warning("elasticrun: flash commit of step %d not whole on every rank; "
                        "resuming from the script's own checkpoint", plan.step)
            return None
        if self.rank == 0:  # (the script's own logging may be off: said on stderr)
            checkpoint = f"step {script_step}" if script_step else "none"
            print(f"elasticrun: resuming from the flash commit of step {plan.step} (the "
                  f"script's own checkpoint: {checkpoint})", file=sys.stderr, flush=True)
        return Resumed(plan.step, shared, own)

    def close(self) -> None:
        if self._committer is not None:
            self._committer.close()
