"""Goodput: what failures cost over minutes of training, every tool under one fault schedule.

4 workers on 2 loopback hosts (127.0.0.1 and 127.0.0.2, 2 slots each) train model.py's MLP
(~1.1M parameters, synthetic data; each step also sleeps DEVICE_S = 0.1 s for the
accelerator every worker would have: on this machine's 2 shared cores fewer workers would
otherwise step faster) for goodput_faults.PLAN's 300 s from their first step at full size,
while its faults strike at fixed times from that step: transient worker deaths (SIGKILL)
alternating between the hosts, a hung worker (SIGSTOP), every worker killed at once,
host 127.0.0.2 gone (its workers killed, and out of discovery, or its torchrun launcher
killed) and back 25 s later, and a straggler (one slot of 127.0.0.2 5x slower for 25 s, as
a throttled GPU: model.py's BENCH_SLOW_DIR). The tools (TOOLS), all rank 0 writing every
step's wall time, step and world size:

  elasticrun     scripts/er_soak.py, Horovod-style (er.init, DistributedOptimizer,
                 TorchState, @er.elastic.run), state.commit() every step:
                 elasticrun -np 4 --min-np 2 --host-discovery-script HOSTS.sh (ELASTIC_RANGE)
                 --stragglers evict
  elasticrun, torchrun script
                 scripts/goodput_ddp.py, plain DDP with its own disk checkpoint every
                 CHECKPOINT_EVERY = 10 steps (restart mode): the same line + --max-restarts 100
  elasticrun, torchrun script + flash commits
                 the same script with BENCH_FLASH=1: its one line more, FlashCommits
                 (elasticrun.flash), keeps a flash commit of every step it can afford
  torchrun       the same script, one launcher per host (c10d rendezvous on 127.0.0.1,
                 --nnodes 1:2, last_call_timeout=1, --max-restarts 100,
                 TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1); the script's process group timeout
                 is 60 s, since torchrun has no hang detection

Every tool also runs as long without faults. Goodput = the steps the faulted run's model
holds at the end / the steps the fault-free run made in the same time, both counted from the
first step at full size; "samples goodput" weighs each step by its world size. Per fault:
steps redone (rolled back), seconds below full size, seconds to the first step after it
(goodput_report.py defines each). Draws results/goodput.png (goodput-quick.png). Quick mode
(QUICK_PLAN): 1 worker per host, 10 s, two faults, and not the second and third tools (the
first's launcher with the last's script). BENCH_GOODPUT_TOOLS (names, separated by ";")
runs some tools only.
"""

from __future__ import annotations

import os
import re
import tempfile
import time
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any

from benchlib import SCRIPTS, Jobs, survivors
from goodput_faults import HOSTS, KINDS, PLAN, QUICK_PLAN, Plan
from goodput_report import goodputs, plot, print_report, run_figures, summary
from goodput_tools import (
    DEVICE_S,
    ELASTIC_RANGE,
    MAX_RESTARTS,
    PARAMS,
    START_S,
    Elasticrun,
    Job,
    Tool,
    Torchrun,
)

DDP_SCRIPT = SCRIPTS / "goodput_ddp.py"
EVICT = ("--stragglers", "evict")  # a straggler leaves at a commit (restart mode: a restart)
TOOLS: tuple[Tool, ...] = (
    Elasticrun("elasticrun", SCRIPTS / "er_soak.py", EVICT),
    Elasticrun("elasticrun, torchrun script", DDP_SCRIPT,
               ("--max-restarts", str(MAX_RESTARTS), *EVICT), in_quick=False),
    Elasticrun("elasticrun, torchrun script + flash commits", DDP_SCRIPT,
               ("--max-restarts", str(MAX_RESTARTS), *EVICT), in_quick=False,
               env=(("BENCH_FLASH", "1"),)),
    Torchrun("torchrun", DDP_SCRIPT),
)
PEER = "torchrun"
REACHED = re.compile(r"(kill|stop) \[\d")  # a fault's record when it reached a process


def play(job: Job, t0: float) -> list[dict[str, Any]]:
    """The plan's faults (and restores) at their times from t0, then waits out the run;
    what each fault did, and when (None: the job had ended)."""
    schedule = job.plan.schedule
    records: list[dict[str, Any]] = [{"fault": f.label, "at_s": f.at_s, "time": None,
                                      "did": "not injected: the job had ended"}
                                     for f in schedule]
    actions = sorted([(f.at_s, i, "inject") for i, f in enumerate(schedule)]
                     + [(f.at_s + f.lasts_s, i, "restore")
                        for i, f in enumerate(schedule) if f.lasts_s])
    for at_s, index, action in actions:
        if not job.wait_until(t0 + at_s):
            break
        fault = schedule[index]
        if action == "inject":
            records[index]["time"] = time.time()
            records[index]["did"] = KINDS[fault.kind].inject(job, fault.host)
        else:
            KINDS[fault.kind].restore(job, fault.host)
    job.wait_until(t0 + job.plan.duration_s)
    return records


def run(tool: Tool, plan: Plan) -> dict[str, Any]:
    """One job of the tool under the plan (no faults in it: a fault-free run); its figures."""
    with tempfile.TemporaryDirectory() as tmp, Jobs() as jobs:
        job = Job(tool, plan, jobs, Path(tmp))
        launched = time.time()
        tool.start(job)
        t0 = job.first_full_step()
        faults = [] if t0 is None else play(job, t0)
        ended_at = None if job.running() else time.time()
        ended = job.finish()
        job.poll()
    if left := survivors(jobs.tag):
        raise RuntimeError(f"{tool.name}: processes {left} outlived the benchmark")
    if t0 is None:  # a result too: nothing trained at full size
        t0, ended = launched, f"never at {plan.full} workers within {START_S:g} s: {ended}"
    elif ended_at is not None and ended_at < t0 + plan.duration_s:
        ended = f"ended at {ended_at - t0:.0f} s: {ended}"
    times = [r["time"] for r in faults] or [None] * len(plan.schedule)
    return {**run_figures(job.events, t0, plan.duration_s, plan.full, times), "ended": ended,
            "faults_injected": faults, "start_s": t0 - launched,
            "stop_s": time.time() - t0 - plan.duration_s}


def trial(tool: Tool, plan: Plan) -> dict[str, Any]:
    fault_free, faulted = run(tool, replace(plan, schedule=())), run(tool, plan)
    return {**goodputs(faulted, fault_free), "fault_free": fault_free, "faulted": faulted}


def bench(trials: int, quick: bool) -> dict[str, Any]:
    plan = QUICK_PLAN if quick else PLAN
    wanted = os.environ.get("BENCH_GOODPUT_TOOLS")  # (names hold commas: ";" separates)
    named = None if wanted is None else {name.strip() for name in wanted.split(";")}
    tools = [tool for tool in TOOLS
             if (tool.in_quick or not quick) and (named is None or tool.name in named)]
    runs: dict[str, list[dict[str, Any]]] = {tool.name: [] for tool in tools}
    for _ in range(trials):  # interleaved, so that drift of the machine hits every tool
        for tool in tools:
            runs[tool.name].append(trial(tool, plan))
    summaries = {name: summary(tool_trials) for name, tool_trials in runs.items()}
    labels = [f"{f.at_s:g} s {f.label}" for f in plan.schedule]
    print_report(summaries, PEER, labels,
                 f"goodput: {plan.full} workers on {len(HOSTS)} hosts, ~{PARAMS / 1e6:g}M "
                 f"parameters and {DEVICE_S:g} s of 'device' per step, {plan.duration_s:g} s, "
                 f"{len(plan.schedule)} faults; median of {trials}")
    for name, tool_trials in runs.items():
        for number, result in enumerate(tool_trials, 1):
            for record in result["faulted"]["faults_injected"]:
                if not REACHED.match(record["did"]):
                    print(f"  {name}, trial {number}: {record['fault']}: {record['did']}")
    lines = {tool.name: tool.launch_line(plan.slots) for tool in tools}
    for name, line in lines.items():
        print(f"  {name}: {line}")
    path = plot({name: tool_trials[0] for name, tool_trials in runs.items()},
                [(f.at_s, f.lasts_s, f.kind) for f in plan.schedule],
                f"goodput{'-quick' if quick else ''}.png")
    return {"plan": asdict(plan), "launch_lines": lines,
            "elasticrun_range": list(ELASTIC_RANGE), "summary": summaries,
            "trials": runs, "plot": str(path)}
