"""Pure: the flash commits' cadence in force, as the workers report it, for /status.

A worker that takes flash commits (elasticrun.flash: the Hugging Face and Lightning
callbacks, FlashCommits) reports its cadence now and then (PATH_FLASH): a commit every
`every` steps, what a commit's copy and a step take, how many it wrote. /status shows the
job's: the sparsest cadence of any live worker, with the costs behind it.
"""

from __future__ import annotations

from collections.abc import Container
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class CadenceReport:
    every: int  # a commit every `every` steps
    copy_s: float  # a commit's copy on the training thread (recent median)
    step_s: float  # a step without the copy (recent median)
    commits: int  # commits written so far
    skipped: int  # commits put off while the previous one was still being written


class FlashCadences:
    def __init__(self) -> None:
        self._reports: dict[str, CadenceReport] = {}

    def report(self, worker: str, report: CadenceReport) -> None:
        self._reports[worker] = report

    def summary(self, live: Container[str]) -> dict[str, Any] | None:
        """The job's cadence over its live workers (None: none takes flash commits)."""
        for worker in [w for w in self._reports if w not in live]:
            del self._reports[worker]  # gone: a restarted worker reports anew
        if not self._reports:
            return None
        sparsest = max(self._reports.values(), key=lambda r: (r.every, r.copy_s))
        cost = sparsest.copy_s / (sparsest.every * sparsest.step_s + sparsest.copy_s) \
            if sparsest.step_s > 0 else 0.0
        return {"every_steps": sparsest.every, "copy_ms": round(sparsest.copy_s * 1e3, 3),
                "step_ms": round(sparsest.step_s * 1e3, 3), "cost": round(cost, 4),
                "workers": len(self._reports),
                "commits": sum(r.commits for r in self._reports.values()),
                "skipped": sum(r.skipped for r in self._reports.values())}
