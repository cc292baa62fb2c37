"""Flash commits' pure parts: the cadence rule (cadence.py) and which commit a restarted
job resumes from (agreement.choose), as tables."""

from __future__ import annotations

import pytest

from elasticrun.flash.agreement import Holdings, Plan, choose
from elasticrun.torch.elastic.cadence import Cadence


@pytest.mark.parametrize("copy_s,step_s,every", [
    (0.0001, 0.1, 1),  # 0.1% of a step: every step
    (0.002, 0.1, 1),  # 2% exactly: still every step
    (0.003, 0.1, 2),  # 3%: every other step keeps it within 2%
    (0.05, 0.1, 25),  # half a step: every 25 steps
    (1.0, 0.1, 490),
])
def test_the_cadence_keeps_the_copy_within_two_percent(copy_s: float, step_s: float,
                                                        every: int) -> None:
    cadence = Cadence()
    cadence.stepped(step_s)
    cadence.copied(copy_s)
    assert cadence.every == every
    assert cadence.cost <= 0.02 + 1e-9
    if every > 1:  # and no more often than needed
        assert copy_s / ((every - 1) * step_s + copy_s) > 0.02


def test_a_write_that_slows_the_steps_it_overlaps_counts_in_the_cost() -> None:
    """A 0.1 ms copy, but its write makes the 3 steps it spans 10 ms slower each: 30 ms a
    commit, so every 15th step (a write on a spare core, slowing nothing, would cost only
    the copy: every step)."""
    cadence = Cadence()
    for _ in range(5):
        cadence.stepped(0.1)
        cadence.copied(0.0001)
        for _ in range(3):
            cadence.stepped(0.11, writing=True)
    assert cadence.every == 15
    spare = Cadence()
    for _ in range(5):
        spare.stepped(0.1)
        spare.copied(0.0001)
        for _ in range(3):
            spare.stepped(0.1, writing=True)
    assert spare.every == 1


def test_a_write_never_takes_more_than_it_lasts() -> None:
    """Steps beside a 1 ms write 10 ms slower (load from elsewhere): the write is charged
    its 1 ms, not the 10."""
    cadence = Cadence()
    for _ in range(5):
        cadence.stepped(0.1)
        cadence.copied(0.0001)
        cadence.wrote(0.001)
        cadence.stepped(0.11, writing=True)
    assert cadence.copy_s == pytest.approx(0.0011)
    assert cadence.every == 1


def test_writes_that_never_end_between_steps_still_get_weighed() -> None:
    """Every step so far ran beside a write: a commit is put off, so that a step with no
    write running is measured; then the slowed steps count."""
    cadence = Cadence()
    cadence.copied(0.0001)
    cadence.stepped(0.2, writing=True)
    cadence.stepped(0.2, writing=True)
    assert not cadence.due(2) and not cadence.due(3)
    cadence.stepped(0.1)
    assert cadence.due(4)
    cadence.copied(0.0001)  # the commit of step 4: its write spanned 2 steps before
    assert cadence.every > 1  # each of them 0.1 s slower


def test_commits_fall_on_the_same_steps_on_every_rank() -> None:
    cadence = Cadence(every=3)
    assert [step for step in range(1, 10) if cadence.due(step)] == [3, 6, 9]


def test_a_one_off_slow_copy_weighs_little() -> None:
    cadence = Cadence()
    cadence.stepped(0.1)
    for _ in range(20):
        cadence.copied(0.0005)
    cadence.copied(0.05)  # a first allocation, a page fault storm
    assert cadence.every <= 3


def test_nothing_is_decided_before_both_costs_are_known() -> None:
    cadence = Cadence()
    cadence.copied(5.0)
    assert cadence.every == 1 and cadence.cost == 0.0
    cadence.stepped(0.0)  # ignored
    assert cadence.every == 1


def holds(shared: tuple[int, ...] = (), own: tuple[int, ...] = (), script: int = 0) -> Holdings:
    return Holdings(shared, own, script)


@pytest.mark.parametrize("ranks,replicated,plan", [
    # one host, both steps whole: the newest
    ([holds((36, 37), (36, 37)), holds((36, 37), (36, 37))], True, Plan(37, {})),
    # the script's own checkpoint is as new or newer: it decides
    ([holds((36, 37), script=37), holds((36, 37), script=37)], True, None),
    ([holds((36, 37), script=40), holds((36, 37), script=0)], True, None),
    # nothing kept (a new job, or host snapshots off)
    ([holds(), holds()], True, None),
    # a node replaced: its ranks get the shared part from the lowest rank that has it
    ([holds((36, 37)), holds((36, 37)), holds(), holds()], True, Plan(37, {2: 0, 3: 0})),
    # hosts one commit apart: the newest, sent to the host behind
    ([holds((35, 36)), holds((36, 37))], True, Plan(37, {0: 1})),
    # each rank's own state (shards): a step every rank holds
    ([holds(own=(36, 37)), holds(own=(35, 36))], False, Plan(36, {})),
    ([holds(own=(36, 37)), holds(own=())], False, None),
    ([holds(own=(36, 37), script=36), holds(own=(36, 37), script=36)], False, Plan(37, {})),
])
def test_every_rank_resumes_from_the_same_commit(ranks: list[Holdings], replicated: bool,
                                                 plan: Plan | None) -> None:
    assert choose(ranks, replicated) == plan
