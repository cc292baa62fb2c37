"""The goodput benchmark's figures (benchmarks/goodput.py), drawn from rank 0's progress
lines alone (wall time, global step, world size, and who wrote it): the steps a model
contains at a time, what each fault cost, the tables and the plot.

Two consecutive lines *continue* each other when the same process wrote both in the same
round (elasticrun's round; a torchrun-style worker's process) and the step went up by one;
anything else (a rollback, a new round, a restarted job) ends a *break*.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from benchlib import RESULTS, median, print_table

BIN_S = 1.0  # the plot's steps/s bins


@dataclass(frozen=True)
class Line:
    time: float
    step: int
    size: int
    writer: tuple[int, int]  # (pid, round)


def progress(events: list[dict[str, Any]]) -> list[Line]:
    """Rank 0's step lines, in time order (the events are)."""
    return [Line(e["time"], e["step"], e["size"], (e["pid"], e.get("round", 0)))
            for e in events if e["event"] == "step" and e["rank"] == 0]


def continues(a: Line, b: Line) -> bool:
    return b.writer == a.writer and b.step == a.step + 1


def kept(lines: Sequence[Line], t: float) -> list[Line]:
    """The steps the model holds at time t, each as the line that reported it: every step
    done by then, less those rolled back by then or later (a later line at or below a step
    shows that training resumed from before it)."""
    held: list[Line] = []
    for line in lines:
        while held and held[-1].step >= line.step:
            held.pop()
        if line.time <= t:
            held.append(line)
    return held


def below_full_s(lines: Sequence[Line], start: float, end: float, full: int) -> float:
    """Seconds of [start, end] not spent in steps at full size that continue the one
    before; after the last line, if none came after `end`, nothing was trained."""
    below = 0.0
    for a, b in itertools.pairwise(lines):
        if b.time > start and a.time < end and not (continues(a, b) and b.size == full):
            below += min(b.time, end) - max(a.time, start)
    if lines and lines[-1].time < end:
        below += end - max(lines[-1].time, start)
    return below


def fault_cost(lines: Sequence[Line], start: float, end: float, full: int) -> dict[str, Any]:
    """What the fault at `start` cost, up to the next fault (or the end) at `end`: steps
    redone (each rollback: the step reached before it minus the step resumed from), time
    below full size, and the time to the first step after its first break."""
    pairs = [(a, b) for a, b in itertools.pairwise(lines) if start < b.time <= end]
    breaks = [b for a, b in pairs if not continues(a, b)]
    return {"redone_steps": sum(a.step - (b.step - 1) for a, b in pairs if b.step <= a.step),
            "below_full_s": below_full_s(lines, start, end, full),
            "first_step_s": breaks[0].time - start if breaks else None}


def run_figures(events: list[dict[str, Any]], t0: float, duration_s: float, full: int,
                fault_times: Sequence[float | None]) -> dict[str, Any]:
    """One run's figures over [t0, t0 + duration_s]; a fault never injected costs None."""
    lines = progress(events)
    end = t0 + duration_s
    trained = [line for line in kept(lines, end) if line.time > t0]
    injected = [t for t in fault_times if t is not None]
    until = dict(zip(injected, [*injected[1:], end], strict=False))
    costs = [None if t is None else fault_cost(lines, t, until[t], full) for t in fault_times]
    return {"steps": len(trained), "steps_per_s": len(trained) / duration_s,
            # each step weighed by its world size: the samples it trained, in full steps
            "full_steps": sum(line.size for line in trained) / full,
            "below_full_s": below_full_s(lines, t0, end, full), "faults": costs,
            "series": series(lines, t0, end)}


def series(lines: Sequence[Line], t0: float, end: float) -> dict[str, list[Any]]:
    """Per BIN_S from t0: steps done per second, and the world size of the bin's last step
    (0: none done)."""
    bins = int((end - t0) / BIN_S)
    rate, size = [0.0] * bins, [0] * bins
    for line in lines:
        index = int((line.time - t0) / BIN_S)
        if 0 <= index < bins:
            rate[index] += 1 / BIN_S
            size[index] = line.size
    return {"t": [i * BIN_S for i in range(bins)], "steps_per_s": rate, "size": size}


def goodputs(faulted: dict[str, Any], fault_free: dict[str, Any]) -> dict[str, float | None]:
    """Steps held at the end over the fault-free run's steps; and the same with each step
    weighed by its world size (on this machine's shared cores fewer workers step faster,
    so steps alone flatter a job that shrinks)."""
    return {"goodput": faulted["steps"] / fault_free["steps"] if fault_free["steps"] else None,
            "samples_goodput": faulted["full_steps"] / fault_free["full_steps"]
            if fault_free["full_steps"] else None}


# --- over trials --------------------------------------------------------------------------
def _median_or_none(values: list[Any]) -> float | None:
    known = [v for v in values if v is not None]
    return median(known) if known else None


def summary(trials: list[dict[str, Any]]) -> dict[str, Any]:
    """One tool's medians over trials: the run's figures and each fault's."""
    faulted = [t["faulted"] for t in trials]
    fault_free = [t["fault_free"] for t in trials]
    count = len(faulted[0]["faults"])
    per_fault = [{key: _median_or_none([(run["faults"][i] or {}).get(key) for run in faulted])
                  for key in ("redone_steps", "below_full_s", "first_step_s")}
                 for i in range(count)]
    return {"goodput": _median_or_none([t["goodput"] for t in trials]),
            "samples_goodput": _median_or_none([t["samples_goodput"] for t in trials]),
            "steps": median(run["steps"] for run in faulted),
            "fault_free_steps": median(run["steps"] for run in fault_free),
            "fault_free_steps_per_s": median(run["steps_per_s"] for run in fault_free),
            "below_full_s": median(run["below_full_s"] for run in faulted),
            "faults": per_fault,
            "ended": [t["faulted"]["ended"] for t in trials]}


def _ratio(ours: float | None, theirs: float | None) -> str:
    return f"{ours / theirs:.2f}x" if ours and theirs else "-"


def _with_ratio(ours: float | None, theirs: float | None, is_peer: bool) -> list[Any]:
    return ["-" if ours is None else ours, "" if is_peer else _ratio(ours, theirs)]


def print_report(summaries: dict[str, dict[str, Any]], peer: str, labels: list[str],
                 title: str) -> None:
    theirs = summaries.get(peer, {})
    print_table(title, ["", "goodput", f"vs {peer}", "samples goodput", f"vs {peer}",
                        "final steps", "fault-free steps", "fault-free steps/s",
                        "below full s", "ended"],
                [[tool, *_with_ratio(s["goodput"], theirs.get("goodput"), tool == peer),
                  *_with_ratio(s["samples_goodput"], theirs.get("samples_goodput"),
                               tool == peer),
                  s["steps"], s["fault_free_steps"], s["fault_free_steps_per_s"],
                  s["below_full_s"], "; ".join(sorted(set(s["ended"])))[:90]]
                 for tool, s in summaries.items()])
    rows = []
    for index, label in enumerate(labels):
        peer_first = (theirs.get("faults") or [{}] * len(labels))[index].get("first_step_s")
        for tool, s in summaries.items():
            cost = s["faults"][index]
            rows.append([label if tool == next(iter(summaries)) else "", tool,
                         *("-" if cost[k] is None else cost[k]
                           for k in ("redone_steps", "below_full_s", "first_step_s")),
                         "" if tool == peer else _ratio(peer_first, cost["first_step_s"])])
    print_table(f"  per fault: steps redone, seconds below full size, seconds to the first "
                f"step after it ({peer}'s time / the tool's)",
                ["fault", "", "redone", "below full s", "-> first step s", f"{peer} / it"], rows)


def plot(trials: dict[str, dict[str, Any]], faults: list[tuple[float, float, str]],
         name: str) -> Path:
    """Per tool (its first trial): steps/s and world size over time, the fault-free run's
    steps/s faint behind them; each fault (at, lasts, label) a vertical line, a lasting one
    shaded while it lasts."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, rows = plt.subplots(len(trials), 1, figsize=(10, 2.8 * len(trials)), sharex=True,
                                squeeze=False)
    for axes, (tool, trial) in zip(rows[:, 0], trials.items(), strict=True):
        faulted, free = trial["faulted"]["series"], trial["fault_free"]["series"]
        axes.step(free["t"], free["steps_per_s"], where="post", color="0.7", linewidth=0.8,
                  label="steps/s, fault-free run")
        axes.step(faulted["t"], faulted["steps_per_s"], where="post", color="tab:blue",
                  linewidth=0.9, label="steps/s")
        axes.set_ylim(bottom=0, top=1.25 * max(free["steps_per_s"] + faulted["steps_per_s"]
                                               + [1]))
        axes.set_ylabel("steps/s")
        sizes = axes.twinx()
        sizes.step(faulted["t"], faulted["size"], where="post", color="tab:green",
                   linewidth=1.2, label="world size")
        sizes.set_ylim(0, max(faulted["size"] + [1]) + 1)
        sizes.set_ylabel("world size", color="tab:green")
        for at, lasts, label in faults:
            axes.axvline(at, color="tab:red", linestyle="--", linewidth=0.8)
            if lasts:
                axes.axvspan(at, at + lasts, color="tab:red", alpha=0.08)
            axes.text(at, 0.98, f" {label}", transform=axes.get_xaxis_transform(),
                      va="top", ha="left", fontsize="x-small", color="tab:red")
        axes.set_title(f"{tool}: goodput {_figure(trial['goodput'])}, samples goodput "
                       f"{_figure(trial['samples_goodput'])}", fontsize="small")
        handles = axes.get_legend_handles_labels()
        more = sizes.get_legend_handles_labels()
        axes.legend(handles[0] + more[0], handles[1] + more[1], loc="lower left",
                    fontsize="x-small")
    rows[-1, 0].set_xlabel("seconds since training started at full size")
    figure.tight_layout()
    RESULTS.mkdir(exist_ok=True)
    path = RESULTS / name
    figure.savefig(path, dpi=100)
    plt.close(figure)
    return path


def _figure(value: float | None) -> str:
    return "-" if value is None else f"{value:.3f}"
