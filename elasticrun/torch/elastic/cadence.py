"""Pure: how often a flash commit is taken, from what it costs as the job runs.

The rule: a commit every step, unless the time it holds the training thread (the copy of
the state, measured at every commit) exceeds BUDGET (2%) of a step's time; then a commit
every k steps (those divisible by k, on every rank alike), the smallest k that keeps the
copy's share of k steps within the budget. Both costs are the medians of the last few
measured (WINDOW): a garbage collection or a one-off slow step does not move them (and the
first copies, which allocate their buffers, are not counted: committer.py). A commit is
also put off while the previous one is still being written (the writer never queues more
than one): the training thread never waits.
"""

from __future__ import annotations

import math
import statistics
from collections import deque
from dataclasses import dataclass, field

BUDGET = 0.02  # the share of the training time flash commits may take
WINDOW = 9  # measurements a cost is the median of


@dataclass
class Cadence:
    budget: float = BUDGET
    copy_s: float = 0.0  # a commit's copy (training thread time), the recent median
    step_s: float = 0.0  # a step without the copy, the recent median
    every: int = 1  # the cadence in force: a commit every `every` steps
    _copies: deque[float] = field(default_factory=lambda: deque(maxlen=WINDOW), repr=False)
    _steps: deque[float] = field(default_factory=lambda: deque(maxlen=WINDOW), repr=False)

    def copied(self, seconds: float) -> None:
        self._copies.append(seconds)
        self.copy_s = statistics.median(self._copies)
        self._decide()

    def stepped(self, seconds: float) -> None:
        """One step's time, the copy not included."""
        if seconds <= 0.0:
            return
        self._steps.append(seconds)
        self.step_s = statistics.median(self._steps)
        self._decide()

    def due(self, step: int) -> bool:
        """Whether step `step`'s commit is due: steps divisible by the cadence, so that ranks
        with the same cadence commit the same steps."""
        return step % self.every == 0

    @property
    def cost(self) -> float:
        """The copy's share of the training time at the cadence in force."""
        if self.step_s <= 0.0:
            return 0.0
        return self.copy_s / (self.every * self.step_s + self.copy_s)

    def _decide(self) -> None:
        if self.step_s <= 0.0 or self.copy_s <= 0.0:
            return
        # copy / (k * step + copy) <= budget  <=>  k >= copy * (1 - budget) / (budget * step)
        needed = self.copy_s * (1.0 - self.budget) / (self.budget * self.step_s)
        self.every = max(1, math.ceil(needed - 1e-9))

