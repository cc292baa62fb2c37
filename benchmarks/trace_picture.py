"""One recovery, as the Timeline recorded it: `python benchmarks/trace_picture.py [--quick]
[--trace FILE]`.

Runs a real job of 3 workers on 3 loopback "hosts" (er_train.py, a TorchState committed
every COMMIT_EVERY steps) with `--timeline-filename`; the worker of the third host SIGKILLs
itself halfway between two commits. Then draws the trace around the recovery into
results/timeline-recovery.png: a lane per worker (its elastic events, its collectives, its
fusion buckets) and the driver's lane (rounds, the failure, host events), on one time axis
with the kill at t = 0. The trace's seconds around the kill are kept as
results/timeline-recovery.json (open it in https://ui.perfetto.dev). `--trace FILE` only
draws a trace.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from benchlib import RESULTS, SCRIPTS, Jobs, bench_env, elasticrun_command, read_events  # noqa: E402

COMMIT_EVERY = 6
KILL_STEP = 15  # halfway between the commits at steps 12 and 18
BEFORE_S, AFTER_S = 0.12, 0.06  # drawn before the kill, and after the first commit after it
MIN_WIDTH_S = 0.003  # shorter events are drawn this wide, so that they show
KEEP_S = 2.0  # the saved trace keeps the events this close to the kill
COLORS = {
    "commit": "tab:green", "restore": "tab:red", "sync": "tab:purple", "reset": "tab:orange",
    "rendezvous": "gold", "build group": "tab:brown", "leave": "tab:gray",
}
ROWS = (("elastic", "elastic · rounds"), ("collective", "collectives"), ("fusion", "fusion"))
DRIVER_MARKS = {"worker failed": "red", "host blacklisted": "red", "round 1 broken": "red",
                "round 2 opened": "tab:blue", "round 2 formed": "tab:green"}


def run_job(trace: Path, quick: bool) -> float:
    """Runs the job; returns the wall-clock time of the kill."""
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "events.jsonl"
        env = bench_env({"BENCH_OUT": str(out), "BENCH_PARAMS": "1e5" if quick else "1e6",
                         "BENCH_STEPS": "30", "BENCH_COMMIT_EVERY": str(COMMIT_EVERY),
                         "BENCH_KILL_STEP": str(KILL_STEP), "BENCH_KILL_RANK": "2"})
        flags = ["-H", "localhost:1,127.0.0.1:1,127.0.0.2:1", "--min-np", "2",
                 "--timeline-filename", str(trace)]
        with Jobs() as jobs:
            jobs.start(elasticrun_command(flags, SCRIPTS / "er_train.py"), env)
            jobs.wait(300, "timeline picture job", progress=out)
        return float(next(e["time"] for e in read_events(out) if e["event"] == "kill"))


def depths(events: list[dict[str, Any]]) -> list[int]:
    """How many of the other events (of one row) each event lies within."""
    spans = [(e["ts"], e["ts"] + e.get("dur", 0)) for e in events]
    return [sum(1 for j, (a, b) in enumerate(spans)
                if j != i and a <= start and end <= b and (a, b) != (start, end))
            for i, (start, end) in enumerate(spans)]


def clusters(marks: dict[str, float], within: float = 0.02) -> list[tuple[float, list[str]]]:
    """Driver marks close in time share one line and one label."""
    groups: list[tuple[float, list[str]]] = []
    for name, t in sorted(marks.items(), key=lambda item: item[1]):
        if groups and t - groups[-1][0] < within:
            groups[-1][1].append(name)
        else:
            groups.append((t, [name]))
    return groups


def draw(events: list[dict[str, Any]], kill_s: float | None, path: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = {e["pid"]: e["args"]["name"] for e in events if e["name"] == "process_name"}
    marks = {e["name"]: e["ts"] / 1e6 for e in events
             if e["pid"] == 1 and e["ph"] == "i" and e["name"] in DRIVER_MARKS}
    zero = kill_s if kill_s is not None else marks["worker failed"]
    first_commit = min((e["ts"] / 1e6 for e in events
                        if e["name"] == "commit" and e["ts"] / 1e6 > marks["round 2 formed"]),
                       default=marks["round 2 formed"] + 0.1)
    end = first_commit - zero + AFTER_S

    workers = sorted((pid for pid in names if pid != 1), key=lambda pid: names[pid])
    rows: list[tuple[int, str, str]] = [(1, "driver", f"{names[1]}\nrounds")]
    rows += [(pid, kind, f"{names[pid]}\n{label}" if kind == "elastic" else label)
             for pid in workers for kind, label in ROWS]
    height = {(pid, kind): len(rows) - i for i, (pid, kind, _) in enumerate(rows)}
    figure, axes = plt.subplots(figsize=(13, 0.45 * len(rows) + 2.0))
    labelled: set[str] = set()
    shown = [e for e in events if e["ph"] == "X" and e["pid"] in names
             and e["ts"] / 1e6 - zero <= end
             and (e["ts"] + e.get("dur", 0)) / 1e6 - zero >= -BEFORE_S]

    def row_of(event: dict[str, Any]) -> tuple[tuple[int, str], str, str]:
        pid, cat, name = event["pid"], event["cat"], event["name"]
        if pid == 1:
            return (1, "driver"), "lightsteelblue", "driver: round rendezvous"
        if cat in ("elastic", "round"):
            return (pid, "elastic"), COLORS.get(name, "tab:olive"), name
        if cat == "fusion":
            return (pid, "fusion"), "skyblue", "fusion bucket (launch → done)"
        return (pid, "collective"), "tab:blue", "collective (launch, wait)"

    by_row: dict[tuple[int, str], list[dict[str, Any]]] = {}
    for event in shown:
        by_row.setdefault(row_of(event)[0], []).append(event)
    for key, row_events in by_row.items():
        # Events within others (reset holds leave, rendezvous, build group) are drawn
        # thinner, on top of them.
        for depth, event in sorted(zip(depths(row_events), row_events, strict=True),
                                   key=lambda item: item[0]):
            _, color, label = row_of(event)
            half = 0.38 * 0.62 ** depth
            width = max(event.get("dur", 0) / 1e6, MIN_WIDTH_S)
            axes.broken_barh([(event["ts"] / 1e6 - zero, width)],
                             (height[key] - half, 2 * half), facecolors=color,
                             edgecolors="black", linewidth=0.3,
                             label=None if label in labelled else label)
            labelled.add(label)
    for event in events:  # the workers' instants: a failed collective, an interrupt
        if event["ph"] == "i" and event["pid"] in workers and event["name"] != "CYCLE":
            t = event["ts"] / 1e6 - zero
            if -BEFORE_S <= t <= end:
                y = height[(event["pid"], "elastic")] + 0.42
                axes.plot([t], [y], marker="v", color="black", markersize=5)
                axes.annotate(event["name"], (t, y), xytext=(-4, 2), ha="right",
                              textcoords="offset points", fontsize=7)
    for pid in workers:  # the killed worker: what it had not sent yet died with it
        last = max(((e["ts"] + e.get("dur", 0)) / 1e6 for e in events
                    if e["pid"] == pid and e["ph"] != "M"), default=zero)
        if last < zero:
            axes.annotate(f"SIGKILLed: its events of the last {(zero - last) * 1e3:.0f} ms "
                          f"were not sent yet (workers send every 0.5 s) and died with it",
                          (max(last - zero, -BEFORE_S), height[(pid, "collective")]),
                          xytext=(8, 0),
                          textcoords="offset points", fontsize=8, va="center",
                          color="dimgray", bbox={"facecolor": "white", "edgecolor": "none"})
    top = len(rows) + 0.5
    lines = [(0.0, ["SIGKILL"], "black")] if kill_s is not None else []
    lines += [(t - zero, group, DRIVER_MARKS[group[0]]) for t, group in clusters(marks)]
    for index, (t, group, color) in enumerate(lines):
        axes.axvline(t, color=color, linestyle="-" if group == ["SIGKILL"] else "--",
                     linewidth=1.0)
        text = " · ".join(group) + ("" if group == ["SIGKILL"] else f"  {t * 1e3:+.0f} ms")
        axes.annotate(text, (t, top + 0.15 + 0.55 * (index % 2)), fontsize=7.5, ha="left",
                      xytext=(2, 0), textcoords="offset points", color=color,
                      annotation_clip=False)
    axes.set_yticks([height[(pid, kind)] for pid, kind, _ in rows],
                    [label for _, _, label in rows], fontsize=7.5)
    for pid in workers:
        axes.axhline(height[(pid, "elastic")] + 0.5, color="gray", linewidth=0.6)
    axes.set_xlim(-BEFORE_S, end)
    axes.set_ylim(0.45, top)
    axes.set_xlabel("seconds since the SIGKILL (wall clock: every lane on one axis)")
    axes.set_title("One recovery in elasticrun's Timeline: 3 workers, the third SIGKILLed "
                   "between two commits", pad=40)
    axes.legend(fontsize=7.5, loc="upper left", bbox_to_anchor=(1.005, 1.0), frameon=False)
    figure.tight_layout()
    path.parent.mkdir(exist_ok=True)
    figure.savefig(path, dpi=110)
    plt.close(figure)
    return path


def window(events: list[dict[str, Any]], kill_s: float) -> list[dict[str, Any]]:
    """The metadata and the events of the seconds around the kill (what the picture shows)."""
    return [e for e in events if e["ph"] == "M" or abs(e["ts"] / 1e6 - kill_s) < KEEP_S]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="a smaller model (smoke)")
    parser.add_argument("--trace", type=Path, help="draw this trace; run no job")
    args = parser.parse_args(argv)
    suffix = "-quick" if args.quick else ""
    if args.trace is None:
        with tempfile.TemporaryDirectory() as tmp:
            trace = Path(tmp) / "timeline.json"
            kill_s = run_job(trace, args.quick)
            events = window(json.loads(trace.read_text()), kill_s)
        RESULTS.mkdir(exist_ok=True)
        # The Trace Event Format's object form: Perfetto opens it; otherData holds the kill.
        (RESULTS / f"timeline-recovery{suffix}.json").write_text(json.dumps(
            {"traceEvents": events, "otherData": {"sigkill_at_s": kill_s}}))
    else:
        data = json.loads(args.trace.read_text())
        events = data["traceEvents"] if isinstance(data, dict) else data
        kill_s = data.get("otherData", {}).get("sigkill_at_s") if isinstance(data, dict) \
            else None
    print(draw(events, kill_s, RESULTS / f"timeline-recovery{suffix}.png"))


if __name__ == "__main__":
    main()
