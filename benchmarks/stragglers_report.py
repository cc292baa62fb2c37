"""The stragglers benchmark's report (benchmarks/stragglers.py): each part's summary over
its trials, and its table.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from typing import Any

from benchlib import median, print_table
from stragglers_jobs import COST_MODES, COST_STEP_S, EVICT_FLAGS, STEP_S, Case, Timing


def middle(trials: Sequence[dict[str, Any]], key: str) -> float | None:
    """The median of a key over the trials that have a number for it."""
    values = [t[key] for t in trials if isinstance(t.get(key), (int, float))
              and not isinstance(t.get(key), bool)]
    return median(values) if values else None


def tally(trials: Sequence[dict[str, Any]], key: str) -> str:
    """A key's values and how many trials had each: "evicted" or "kept x1, evicted x2"."""
    counts = Counter(str(t[key]) for t in trials)
    if len(counts) == 1:
        return next(iter(counts))
    return ", ".join(f"{value} x{n}" for value, n in sorted(counts.items()))


DETECTION_KEYS = ("detection_s", "slowdown", "projected_gain", "eviction_s",
                  "before_steps_per_s", "while_steps_per_s", "after_steps_per_s", "speedup")


def detection_summary(trials: list[dict[str, Any]]) -> dict[str, Any]:
    return {"detected": sum(t["detected"] for t in trials), "trials": len(trials),
            "action": tally(trials, "action"), "exit": tally(trials, "exit"),
            **{key: middle(trials, key) for key in DETECTION_KEYS}}


def _number(value: float | None) -> float | str:
    return "-" if value is None else value


def detection_rows(results: dict[str, dict[str, Any]], all_cases: list[Case]
                   ) -> list[list[Any]]:
    rows = []
    for case in all_cases:
        s = results[case.key]["summary"]
        rows.append([f"{case.factor:g}x", case.script.name, case.mode,
                     f"{s['detected']}/{s['trials']}", *(
                         _number(s[k]) for k in DETECTION_KEYS[:4]), s["action"],
                     *(_number(s[k]) for k in DETECTION_KEYS[4:]), s["exit"]])
    return rows


def print_detection(results: dict[str, dict[str, Any]], all_cases: list[Case],
                    timing: Timing, trials: int) -> None:
    print_table(f"stragglers: one of 4 workers (2 hosts x 2 on loopback) slowed after "
                f"{timing.steady_s:g} s of training (--step-s {STEP_S:g}); --stragglers "
                f"evict {' '.join(EVICT_FLAGS)} (DDP: report); median of {trials}",
                ["slowed", "script", "mode", "detected", "detect s", "slowdown", "gain",
                 "evict s", "action", "before st/s", "while st/s", "after st/s",
                 "after/while", "exit"],
                detection_rows(results, all_cases))
    print("  detect s: slowdown -> `straggler` event; slowdown, gain, action: the event's; "
          "evict s: slowdown -> the round at world size 3; before: steps/s at 4 before the "
          "slowdown; while: at 4 after it; after: at 3 after the eviction")


def cost_summary(trials: list[dict[str, Any]]) -> dict[str, Any]:
    ratios = [t["ratio"] for t in trials if t["ratio"] is not None]
    return {**{f"{mode}_steps_per_s": middle([t[mode] for t in trials], "steps_per_s")
               for mode in COST_MODES},
            "ratio": median(ratios) if ratios else None,
            "ratio_min": min(ratios, default=None), "ratio_max": max(ratios, default=None)}


def print_cost(summary: dict[str, Any], timing: Timing, trials: int) -> None:
    spread = "" if summary["ratio_min"] is None else \
        f"{summary['ratio_min']:.3f}-{summary['ratio_max']:.3f}"
    print_table(f"stragglers: the measurement's cost, elasticrun.torch script, --step-s "
                f"{COST_STEP_S:g}, no slowdown, {timing.cost_s:g} s a run, order alternating; "
                f"median of {trials}",
                ["off steps/s", "report steps/s", "report/off", "min-max"],
                [[_number(summary["off_steps_per_s"]), _number(summary["report_steps_per_s"]),
                  _number(summary["ratio"]), spread]])


def quiet_summary(trials: list[dict[str, Any]]) -> dict[str, Any]:
    return {"stragglers": sum(t["stragglers"] for t in trials),
            "cleared": sum(t["cleared"] for t in trials), "trials": len(trials),
            "exit": tally(trials, "exit"), "pause_taken": tally(trials, "pause_taken"),
            "steps_per_s": middle(trials, "steps_per_s")}


def print_quiet(summary: dict[str, Any], timing: Timing) -> None:
    print_table(f"stragglers: false alarms, --stragglers report, {timing.quiet_s:g} s: one "
                f"worker paused {timing.pause_s:g} s at {timing.pause_at_s:g} s, every "
                f"worker {timing.slow_all:g}x slower from {timing.slow_all_at_s:g} s for "
                f"{timing.slow_all_s:g} s",
                ["runs", "straggler events", "cleared events", "pause taken", "steps/s",
                 "exit"],
                [[summary["trials"], summary["stragglers"], summary["cleared"],
                  summary["pause_taken"], _number(summary["steps_per_s"]), summary["exit"]]])
