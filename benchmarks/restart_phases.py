"""The restart benchmark's reading of a job (benchmarks/restart.py): the lines its scripts
print, and where a restart's time went, from those lines, the moments the benchmark saw
(kill, old workers gone, first new one spawned, first step after) and elasticrun's event log.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from benchlib import median, read_events

DDP_PHASES = ("stop_s", "spawn_s", "interpreter_s", "imports_s", "rendezvous_s", "model_s",
              "checkpoint_s", "first_step_s")
HF_PHASES = ("stop_s", "spawn_s", "setup_s", "first_step_s")
ER_SPLIT = ("noticed_s", "stopped_s")  # elasticrun's driver events, from the kill

PHASE = re.compile(r"phase (\w+) ([\d.]+) restart=(\d+)(.*)$")
DDP_STEP = re.compile(r"step (\d+) ([\d.]+) restart=(\d+)")
HF_STEP = re.compile(r"step (\d+) rank (\d+) restart (\d+)")
DDP_DONE = re.compile(r"phase done [\d.]+ restart=[1-9]")
HF_DONE = re.compile(r"done steps=\d+ world=\d+")
HF_START = re.compile(r"start resumed_from=(\d+) world=(\d+)")
FIELD = re.compile(r"(\w+)=(\S+)")


def fields(text: str) -> dict[str, str]:
    return dict(FIELD.findall(text))


def ddp_numbers(lines: list[tuple[float, str]], marks: dict[str, float]) -> dict[str, Any]:
    phases: dict[str, tuple[float, dict[str, str]]] = {}
    last_step, after = 0, []
    for _, line in lines:
        if (match := PHASE.search(line)) and match.group(3) == "1":
            found = fields(match.group(4))
            if match.group(1) != "start" or found.get("rank") == "0":
                phases.setdefault(match.group(1), (float(match.group(2)), found))
        elif step := DDP_STEP.search(line):
            if step.group(3) == "0":
                last_step = max(last_step, int(step.group(1)))
            else:
                after.append(float(step.group(2)))
    at = {name: stamp for name, (stamp, _) in phases.items()}
    resumed_from = int(phases["checkpoint"][1]["step"])
    chain = [marks["killed"], marks["gone"], marks["spawned"], at["start"], at["imports"],
             at["init"], at["model"], at["checkpoint"], marks["resumed"]]
    breakdown = {name: b - a for name, a, b in zip(DDP_PHASES, chain, chain[1:], strict=False)}
    return {"resume_s": marks["resumed"] - marks["killed"], **breakdown,
            "steps_lost": last_step - resumed_from, "resumed_from": resumed_from,
            "steady_step_s": _steady(after), "params": int(phases["model"][1]["params"])}


def hf_numbers(lines: list[tuple[float, str]], marks: dict[str, float]) -> dict[str, Any]:
    killed = marks["killed"]
    last_step = max(int(m.group(1)) for _, line in lines
                    if (m := HF_STEP.search(line)) and m.group(2) == "0" and m.group(3) == "0")
    started, resumed_from = next((t, int(m.group(1))) for t, line in lines
                                 if t > killed and (m := HF_START.search(line)))
    after = [t for t, line in lines
             if (m := HF_STEP.search(line)) and m.group(2) == "0" and m.group(3) == "1"]
    chain = [killed, marks["gone"], marks["spawned"], started, marks["resumed"]]
    breakdown = {name: b - a for name, a, b in zip(HF_PHASES, chain, chain[1:], strict=False)}
    return {"resume_s": marks["resumed"] - killed, **breakdown,
            "steps_lost": last_step - resumed_from, "resumed_from": resumed_from,
            "steady_step_s": _steady(after)}


def _steady(steps: list[float]) -> float:
    """The median interval between the restarted job's steps, its first step left out."""
    intervals = [b - a for a, b in zip(steps[1:], steps[2:], strict=False)]
    return median(intervals) if intervals else 0.0


def driver_split(event_log: Path, killed: float) -> dict[str, float]:
    """From elasticrun's event log: kill -> the driver's restart decision -> the new round
    (every old worker stopped)."""
    events = [e for e in read_events(event_log) if e["time"] > killed]
    restarting = next(e["time"] for e in events if e["type"] == "round_restarting")
    opened = next(e["time"] for e in events
                  if e["type"] == "round_started" and e["time"] >= restarting)
    return {"noticed_s": restarting - killed, "stopped_s": opened - killed}
