"""Gloo process-group rebuild: through the driver's store against torch's TCPStore.

What elasticrun does on every reset is build a new Gloo group through the driver's
HTTP key-value store. For N real ranks (one elasticrun job per N, all on this host), the
worker (scripts/gloo_build_worker.py) times, per trial and per store, building a new group
of all N ranks and running one small allreduce on it; process start-up and the first join
are not timed. Reported per N: the median over trials of the slowest rank's time (the
group is usable when the last rank has it), for both stores, their ratio, and how many
driver-store requests one rank made per build. The first trial of each store is a warm-up
and is discarded. Target: 16 ranks in under 1 s (Horovod reports 15.8 s for 16 ranks).
"""

from __future__ import annotations

import tempfile
from collections import defaultdict
from pathlib import Path
from typing import Any

from benchlib import (
    SCRIPTS,
    Jobs,
    bench_env,
    elasticrun_command,
    median,
    print_table,
    read_events,
)

WORKER = SCRIPTS / "gloo_build_worker.py"
STORES = ("driver", "tcp")


def run_job(size: int, trials: int, out: Path) -> list[dict[str, Any]]:
    """One elasticrun job of `size` workers doing `trials` builds per store (+1 warm-up)."""
    env = bench_env({"BENCH_TRIALS": str(trials + 1), "BENCH_OUT": str(out)})
    command = elasticrun_command(["-np", str(size), "-H", f"localhost:{size}"], WORKER)
    with Jobs() as jobs:
        jobs.start(command, env)
        jobs.wait(300, f"gloo benchmark job ({size} ranks)")
    return read_events(out)


def slowest_rank(records: list[dict[str, Any]]) -> dict[str, list[float]]:
    """Per store: for each timed trial (warm-up dropped), the slowest rank's seconds."""
    by_trial: dict[tuple[str, int], float] = defaultdict(float)
    for r in records:
        if r["trial"] > 0:
            key = (r["store"], r["trial"])
            by_trial[key] = max(by_trial[key], r["seconds"])
    return {store: [s for (name, _), s in sorted(by_trial.items()) if name == store]
            for store in STORES}


def requests_per_build(records: list[dict[str, Any]]) -> dict[str, int]:
    """Driver-store requests of one rank's build, by operation (the most any rank made)."""
    worst: dict[str, int] = {}
    for r in records:
        if r["store"] == "driver" and r["trial"] > 0:
            for op, count in r["requests"].items():
                worst[op] = max(worst.get(op, 0), count)
    return worst


def bench(trials: int, quick: bool) -> dict[str, Any]:
    sizes = [2] if quick else [2, 4, 8, 16, 32]
    results: dict[str, Any] = {"trials": trials, "sizes": {}}
    rows = []
    with tempfile.TemporaryDirectory(prefix="elasticrun-gloo-") as tmp:
        for size in sizes:
            records = run_job(size, trials, Path(tmp) / f"np{size}.jsonl")
            slowest = slowest_rank(records)
            requests = requests_per_build(records)
            driver, tcp = median(slowest["driver"]), median(slowest["tcp"])
            results["sizes"][str(size)] = {"slowest_rank_s": slowest, "driver_s": driver,
                                           "tcp_s": tcp, "driver_requests": requests,
                                           "records": records}
            rows.append([size, driver, tcp, f"{driver / tcp:.1f}x",
                         sum(requests.values()),
                         " ".join(f"{op}={n}" for op, n in sorted(requests.items()))])
    print_table("Gloo group build + one allreduce, slowest rank, median seconds",
                ["ranks", "driver store", "TCPStore", "driver/TCP", "requests/rank",
                 "by op"], rows)
    return results
