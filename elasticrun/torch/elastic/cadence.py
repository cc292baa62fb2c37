"""Pure: how often a flash commit is taken, from what it costs as the job runs.

The rule: a commit every step, unless what it costs the training exceeds BUDGET (2%) of a
step's time; then a commit every k steps (those divisible by k, on every rank alike), the
smallest k that keeps a commit's share of k steps within the budget. A commit's cost is the
time it holds the training thread (the copy of the state, measured at every commit) and,
where the caller says which steps ran while a commit was being written (flash commits),
what the write took from them: how much slower such a step is than one with no write
running, times the number of steps a write spans, and never more than the write lasts.
Where a spare core writes, that is nothing; where the write competes with the training for
the cores, it counts. Each time is
the median of the last few measured (WINDOW): a garbage collection or a one-off slow step
does not move them (and the first copy, which allocates the buffers, is not counted:
committer.py). A commit is also put off while the previous one is still being written (the
writer never queues more than one): the training thread never waits.
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
    copy_s: float = 0.0  # a commit's cost: its copy, and what a write slows steps by
    step_s: float = 0.0  # a step without a copy and with no write running, the recent median
    every: int = 1  # the cadence in force: a commit every `every` steps
    _copies: deque[float] = field(default_factory=lambda: deque(maxlen=WINDOW), repr=False)
    _steps: deque[float] = field(default_factory=lambda: deque(maxlen=WINDOW), repr=False)
    _writing: deque[float] = field(default_factory=lambda: deque(maxlen=WINDOW), repr=False)
    _spans: deque[int] = field(default_factory=lambda: deque(maxlen=WINDOW), repr=False)
    _writes: deque[float] = field(default_factory=lambda: deque(maxlen=WINDOW), repr=False)
    _span = 0  # steps since the last commit that ran while its write did

    def copied(self, seconds: float) -> None:
        """A commit's copy on the training thread took `seconds`."""
        self._copies.append(seconds)
        self._spans.append(self._span)
        self._span = 0
        self._decide()

    def wrote(self, seconds: float) -> None:
        """A commit's write took `seconds`: what it can take from the steps is at most that
        (a step slower beside a write by more is slowed by something else: load)."""
        self._writes.append(seconds)

    def stepped(self, seconds: float, writing: bool = False) -> None:
        """One step's time, the copy not included; `writing`: a commit's write ran meanwhile
        (on another thread, it may have taken CPU time or memory bandwidth from the step)."""
        if seconds <= 0.0:
            return
        if writing:
            self._writing.append(seconds)
            self._span += 1
        else:
            self._steps.append(seconds)
            self.step_s = statistics.median(self._steps)
        self._decide()

    def due(self, step: int) -> bool:
        """Whether step `step`'s commit is due: steps divisible by the cadence, so that ranks
        with the same cadence commit the same steps. While every step so far ran beside a
        write, one is put off: a step with no write running is what the others are weighed
        against."""
        if not self._steps and len(self._writing) >= 2:
            return False
        return step % self.every == 0

    @property
    def cost(self) -> float:
        """The commits' share of the training time at the cadence in force."""
        if self.step_s <= 0.0:
            return 0.0
        return self.copy_s / (self.every * self.step_s + self.copy_s)

    def _decide(self) -> None:
        if not self._copies or not self._steps:
            return
        # A commit costs its copy, and the time its write takes from the steps it overlaps:
        # each of them slower than a step with no write, by the medians.
        slowed = max(0.0, statistics.median(self._writing) - self.step_s) \
            if self._writing else 0.0
        taken = slowed * statistics.median(self._spans)
        if self._writes:
            taken = min(taken, statistics.median(self._writes))
        self.copy_s = statistics.median(self._copies) + taken
        if self.copy_s <= 0.0:
            return
        # cost / (k * step + cost) <= budget  <=>  k >= cost * (1 - budget) / (budget * step)
        needed = self.copy_s * (1.0 - self.budget) / (self.budget * self.step_s)
        self.every = max(1, math.ceil(needed - 1e-9))
