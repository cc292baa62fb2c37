"""The recovery timeline plot: steps per second over time, the kill at t = 0, each tool's
reset and resume marked, elasticrun and torchrun on the same axes."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from benchlib import RESULTS

BIN_S = 0.5
COLORS = {"elasticrun": "tab:blue", "torchrun": "tab:orange"}


def steps_per_second(step_times: list[float], start: float, end: float) -> tuple[list[float],
                                                                                  list[float]]:
    """Completed steps in BIN_S-wide bins from start to end, as a rate."""
    bins = max(1, int((end - start) / BIN_S) + 1)
    counts = [0] * bins
    for t in step_times:
        index = int((t - start) / BIN_S)
        if 0 <= index < bins:
            counts[index] += 1
    return [start + i * BIN_S for i in range(bins)], [c / BIN_S for c in counts]


def plot_recovery(timelines: dict[str, dict[str, Any]], name: str) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    start = min(min(t["steps"]) for t in timelines.values())
    figure, axes = plt.subplots(figsize=(9, 4))
    for tool, timeline in timelines.items():
        color = COLORS.get(tool, "gray")
        # Each line ends with its job's last step: after that it trained no more.
        times, rates = steps_per_second(timeline["steps"], start, max(timeline["steps"]))
        axes.step(times, rates, where="post", color=color, label=f"{tool}: steps/s")
        for mark, style in (("reset", ":"), ("resume", "--")):
            if mark in timeline["marks"]:
                axes.axvline(timeline["marks"][mark], color=color, linestyle=style,
                             label=f"{tool}: {mark} ({timeline['marks'][mark]:.2f} s)")
    axes.axvline(0.0, color="red", label="worker SIGKILLed")
    axes.set_xlabel("seconds since the kill")
    axes.set_ylabel("training steps per second (rank 0)")
    axes.set_title("Recovery from a SIGKILLed worker: elasticrun vs torchrun")
    axes.legend(fontsize="small", loc="upper right")
    figure.tight_layout()
    RESULTS.mkdir(exist_ok=True)
    path = RESULTS / name
    figure.savefig(path, dpi=100)
    plt.close(figure)
    return path
