"""Benchmarks, side by side with torchrun: `python benchmarks/run.py [NAME...] [--trials N]
[--quick]`.

Each prints a table of medians over trials (with ratios against the peer measured in the
same run) and writes its raw numbers as JSON to benchmarks/results/<name>.json.

recovery    4 workers (2 hosts x 2 on loopback), ~10M parameters, one SIGKILLed mid-epoch:
            kill -> first step after recovery, steps lost, with a breakdown; torchrun
            (c10d rendezvous, --max-restarts, disk checkpoint) does the same. Also draws
            results/recovery-timeline.png.
recovery-dist  the same 4 workers, one job per model size (~1.1M, ~10.2M) and fault (SIGKILL,
            SIGSTOP) suffering >= 30 faults: fault -> first step after as p50/p90/p99/max,
            its phases, and at 10.2M the overhead over one steady step.
scaleup     a host added by discovery: change -> first step at the larger world size,
            with a breakdown; torchrun's answer (a second agent; every worker restarts).
overhead    training throughput of the elastic script (commit every step / every 10)
            against plain DDP under torchrun, and commit cost by model size.
optimizer   DistributedOptimizer on a 6-layer transformer and a 12-layer conv net:
            samples/s with gradient hooks (overlap=True) and without, against DDP under
            torchrun; gradient bytes per step and step time with Compression.fp16.
rendezvous  slot assignment for N simulated workers speaking the real protocol.
gloo        Gloo process-group build through the driver's store against torch's TCPStore.
gpu         (on a GPU machine) recovery over NCCL with its breakdown, throughput against
            DDP over NCCL, and commits kept on the device or in pinned host memory.
timeline    the same 2-worker elastic job with --timeline-filename and without: step time
            and the timeline's overhead in percent.
launchers   the same job through the local, SSH and agent launchers: host added -> first
            step at the new size, kill -> first step after (SSH and agents on hosts in
            network namespaces, as root).
slurm       on a real Slurm cluster in network namespaces (root): workers started with srun
            one step each (--launcher slurm) against agents started by srun, one per node.
liveness    hang detection's cost to the driver at N simulated workers: steady state, and
            a lasting stall of one hung worker (share of one core).
torchft     4 CPU workers, ~1M parameters, one SIGKILLed and one SIGSTOPped (a hang)
            mid-step, against torchft (its Lighthouse, Manager and Gloo group, from PyPI into
            benchmarks/.venv-torchft): failure -> first step after, steps lost, steps/s.
driver_restart  4 local workers under --state-dir, the driver SIGKILLed and resumed 2 s
            later: steps trained meanwhile and their rate, resumed driver serving -> all
            re-adopted, steps lost, exit status; torchrun's agent killed and run again (its
            workers from their checkpoint); re-adoption at 256 and 1,024 simulated workers.
restart     a torchrun-style script (plain DDP with its own checkpoint at ~1M and ~10M
            parameters; a Hugging Face Trainer), 2 workers, one SIGKILLed: kill -> first
            step of the restarted job under elasticrun and torchrun (the same launch line),
            broken down into stop, spawn, imports, rendezvous, set-up, checkpoint load.
hostile     what outsiders can make a running driver spend: its RSS and CPU idle, under 40
            unsigned 4 MiB POSTs at a time, and with 1,000 half-header connections held.
goodput     4 workers (2 hosts x 2 on loopback), ~1M parameters, 5 minutes under one fault
            schedule (worker deaths, a hang, every worker lost, a host away and back):
            goodput (steps the final model holds / a fault-free run's steps in the same
            time), steps redone and time below full size per fault, for elasticrun with a
            Horovod-style script, elasticrun with a torchrun script, and torchrun. Also
            draws results/goodput.png.
flash       flash commits: a Hugging Face Trainer, a Lightning fit and a plain DDP loop at
            their default disk-checkpoint cadence, 2 workers, one SIGKILLed at step 37:
            steps redone and kill -> first step under elasticrun with --flash and under
            torchrun (and an elasticrun.torch script committing every step); and the cost
            of FlashCommits.commit() every step at ~1M, ~10M and ~100M parameters (steps/s
            against the same loop without it, the cadence, the copy's time).
stragglers  4 workers (2 hosts x 2 on loopback), one made 1.5x, 2x and 5x slower mid-run
            under --stragglers evict --min-np 2: slowdown -> `straggler` event, its
            slowdown and action, steps/s before, while slowed and after the eviction (world
            size 3); the same detection for a torchrun-style DDP script at 5x (report);
            the measurement's cost (--stragglers off against report, steps/s); false
            alarms in a run with a 4 s pause of one worker and a job-wide 3x slowdown.
"""

from __future__ import annotations

import argparse
import importlib
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from benchlib import RESULTS  # noqa: E402

BENCHMARKS = {
    "recovery": "recovery",
    "recovery-dist": "recovery_dist",
    "scaleup": "scaleup",
    "overhead": "overhead",
    "optimizer": "optimizer_throughput",
    "rendezvous": "rendezvous_scale",
    "gloo": "gloo_build",
    "timeline": "timeline_overhead",
    "gpu": "gpu",
    "launchers": "launchers",
    "slurm": "slurm_launch",
    "liveness": "liveness_scale",
    "torchft": "torchft_compare",
    "driver_restart": "driver_restart",
    "restart": "restart",
    "hostile": "hostile",
    "goodput": "goodput",
    "flash": "flash",
    "stragglers": "stragglers",
}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("names", nargs="*", metavar="NAME",
                        help=f"benchmarks to run: {', '.join(BENCHMARKS)} [default: all]")
    parser.add_argument("--trials", type=int, default=3)
    parser.add_argument("--quick", action="store_true", help="tiny sizes, one trial (smoke)")
    args = parser.parse_args(argv)
    unknown = [name for name in args.names if name not in BENCHMARKS]
    if unknown:
        parser.error(f"unknown benchmark {unknown[0]!r}; expected one of {', '.join(BENCHMARKS)}")
    trials = 1 if args.quick else args.trials
    RESULTS.mkdir(exist_ok=True)
    for name in args.names or list(BENCHMARKS):
        module = importlib.import_module(BENCHMARKS[name])
        result = module.bench(trials, args.quick)
        (RESULTS / f"{name}{'-quick' if args.quick else ''}.json").write_text(
            json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
