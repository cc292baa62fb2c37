"""The docs' round-machine diagram stays true: its states are the machine's phases, and
every timer the machine sets is named in the text beside it."""

from __future__ import annotations

import re
from pathlib import Path

from elasticrun.driver.rounds.actions import TimerKind
from elasticrun.driver.rounds.state import JobPhase

PAGE = Path(__file__).resolve().parents[2] / "docs" / "concepts" / "how-it-works.md"


def _diagram() -> str:
    text = PAGE.read_text()
    match = re.search(r"```mermaid\nstateDiagram-v2\n(.*?)```", text, re.S)
    assert match, f"{PAGE.name} has no mermaid state diagram"
    return match.group(1)


def test_the_diagram_states_are_the_job_phases() -> None:
    states = set()
    for line in _diagram().splitlines():
        if "-->" in line:
            left, right = line.split("-->")
            states |= {left.strip(), right.split(":")[0].strip()}
    states.discard("[*]")
    assert states == {phase.value for phase in JobPhase}


def test_every_timer_is_named_beside_the_diagram() -> None:
    text = PAGE.read_text()
    assert [kind.value for kind in TimerKind if f"`{kind.value}`" not in text] == []
