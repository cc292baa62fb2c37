"""Restart mode on real jobs: unmodified torchrun-style scripts (their own DDP loop and
checkpoint) under elasticrun. A worker killed or stopped: every worker restarts from the
script's checkpoint, forked again from the job's template; a script that never calls
er.init() runs as long as it runs, whatever the driver's timers."""

from __future__ import annotations

import re
import signal
import time
from pathlib import Path

from tests.integration.harness import PYTHON, REPO, run_job
from tests.integration.watched import Watched, watch

DDP = str(REPO / "tests" / "trainers" / "scripts" / "ddp_checkpoint.py")
SHORT_TIMERS = ["--start-timeout", "1", "--collective-timeout", "1", "--init-timeout", "1",
                "--hang-timeout", "1", "--stuck-timeout", "1"]


def ddp(out: Path, steps: int, sleep: float) -> list[str]:
    """The script and its arguments (torchrun's form: no `python` in front)."""
    return [DDP, "--steps", str(steps), "--save-every", "5", "--out", str(out),
            "--step-sleep", str(sleep)]


def signalled_mid_training(tmp_path: Path, launcher: list[str],
                           sig: signal.Signals) -> Watched:
    """The job trains past its first checkpoint (step 5); then one worker gets `sig`, and
    every worker starts again from that checkpoint."""
    python = [PYTHON] if launcher[0] == "-np" else []
    job = watch([*launcher, *python, *ddp(tmp_path / "out", 30, 0.15)])
    job.wait_for(r"step 7 rank 0 restart 0")
    signalled_at = time.monotonic()
    job.signal_a_worker(sig)
    job.wait_for(r"start resumed_from=5 world=2", timeout=60)
    assert time.monotonic() - signalled_at < 20  # loose: a loaded machine (benchmarks/)
    return job


def test_a_script_that_never_calls_init_outlives_every_driver_timer(tmp_path: Path) -> None:
    """Today's regression: the backstop for rounds nobody joins killed such scripts at
    --start-timeout + the collective timeout + 5 s. Here every timer is 1 s (the backstop
    7 s) and the script trains for more than 10 s."""
    result = run_job(["-np", "2", *SHORT_TIMERS, PYTHON, *ddp(tmp_path, 8, 1.3)],
                     timeout=120)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "[0]<stdout>:done steps=8 world=2" in result.stdout
    assert result.duration > 10.0


def test_slow_set_up_before_init_is_not_a_failure(tmp_path: Path) -> None:
    """A Horovod-style script loading its data for longer than every driver timer before
    er.init() joins and trains; only --init-timeout (1800 s) bounds a late member."""
    script = tmp_path / "slow_setup.py"
    script.write_text(
        "import time\n"
        "time.sleep(9)  # loading a dataset\n"
        "import torch\nimport elasticrun.torch as er\n"
        "er.init()\n"
        "print('sum', er.allreduce(torch.ones(1), op=er.Sum).item(), flush=True)\n")
    result = run_job(["-np", "2", "--start-timeout", "1", "--collective-timeout", "1",
                      PYTHON, str(script)], timeout=90)
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.count("sum 2.0") == 2


def test_a_killed_worker_restarts_every_worker_from_the_scripts_checkpoint(
        tmp_path: Path) -> None:
    job = signalled_mid_training(tmp_path, ["-np", "2", "--max-restarts", "2"],
                                 signal.SIGKILL)
    assert job.finish() == 0, job.stderr[-3000:]
    out, err = job.out, job.stderr
    assert "restarting every worker (restart 1 of --max-restarts 2)" in err
    assert "round 2: world size 2 on localhost:2 (2 new worker(s))" in err
    assert "[0]<stdout>:step 6 rank 0 restart 1" in out  # resumed after step 5
    assert "[1]<stdout>:step 30 rank 1 restart 1" in out
    assert "[0]<stdout>:done steps=30 world=2" in out


def test_a_stopped_worker_is_found_and_every_worker_restarts(tmp_path: Path) -> None:
    """SIGSTOP: nothing ends, nothing closes. The others' footholds see their training
    threads asleep in one wait, the driver probes the round and asks the host: stopped."""
    job = signalled_mid_training(tmp_path, ["-np", "2", "--max-restarts", "1"],
                                 signal.SIGSTOP)
    assert job.finish() == 0, job.stderr[-3000:]
    err = job.stderr
    assert re.search(r"rank \d on host localhost hung: its process is stopped \(SIGSTOP\); "
                     r"restarting every worker \(restart 1 of --max-restarts 1\)", err), err
    assert "[1]<stdout>:step 30 rank 1 restart 1" in job.out


def test_torchruns_form_restarts_within_max_restarts_then_fails_naming_it(
        tmp_path: Path) -> None:
    job = signalled_mid_training(
        tmp_path, ["--standalone", "--nproc-per-node", "2", "--max-restarts", "1"],
        signal.SIGKILL)
    job.wait_for(r"step 8 rank 0 restart 1")
    job.signal_a_worker(signal.SIGKILL)
    assert job.finish() == 1
    errors = [line for line in job.err if line.startswith("elasticrun: error:")]
    assert len(errors) == 1 and "was killed by SIGKILL; --max-restarts 1 spent" in errors[0]


def test_the_root_cause_is_what_record_wrote(tmp_path: Path) -> None:
    """torchrun's @record writes the exception to TORCHELASTIC_ERROR_FILE; the job's failure
    names it, and the file (in /tmp, no --log-dir) is gone afterwards."""
    script = tmp_path / "recorded.py"
    script.write_text(
        "import os\n"
        "import torch.distributed as dist\n"
        "from torch.distributed.elastic.multiprocessing.errors import record\n\n"
        "@record\ndef main():\n"
        "    dist.init_process_group('gloo')\n"
        "    print('error file', os.environ['TORCHELASTIC_ERROR_FILE'], flush=True)\n"
        "    dist.barrier()  # both have printed\n"
        "    if dist.get_rank() == 1:\n"
        "        raise RuntimeError('bad batch 7')\n"
        "    dist.barrier()\n\n"
        "main()\n")
    result = run_job(["--nproc-per-node", "2", str(script)], timeout=90)
    assert result.returncode == 1
    assert len(result.error_lines()) == 1, result.stderr
    assert "rank 1 on host localhost failed: RuntimeError: bad batch 7; the workers never " \
           "called er.init(), so they can only be restarted, and --max-restarts is 0" \
           in result.error_lines()[0]
    assert "first failure" not in result.error_lines()[0]  # named once
    files = re.findall(r"error file (\S+)", result.stdout)
    assert len(files) == 2 and all(f.startswith("/tmp/torchelastic-error-") for f in files)
    assert not any(Path(f).exists() for f in files)


def test_every_worker_gets_torchruns_environment(tmp_path: Path) -> None:
    probe = tmp_path / "env.py"
    probe.write_text(
        "import os\nnames = ['RANK', 'LOCAL_RANK', 'WORLD_SIZE', 'LOCAL_WORLD_SIZE', "
        "'GROUP_RANK', 'GROUP_WORLD_SIZE', 'ROLE_RANK', 'ROLE_WORLD_SIZE', 'ROLE_NAME', "
        "'TORCHELASTIC_RESTART_COUNT', 'TORCHELASTIC_MAX_RESTARTS', 'TORCHELASTIC_RUN_ID', "
        "'TORCHELASTIC_USE_AGENT_STORE']\n"
        "print(' '.join(f'{n}={os.environ[n]}' for n in names), flush=True)\n")
    result = run_job(["--nproc-per-node=2", "--rdzv-id", "job7", "--role", "trainer",
                      "--max-restarts", "3", str(probe)], timeout=60)
    assert result.returncode == 0, result.stderr[-2000:]
    lines = sorted(line for line in result.stdout.splitlines() if "RANK=" in line)
    assert lines == [
        f"RANK={r} LOCAL_RANK={r} WORLD_SIZE=2 LOCAL_WORLD_SIZE=2 GROUP_RANK=0 "
        f"GROUP_WORLD_SIZE=1 ROLE_RANK={r} ROLE_WORLD_SIZE=2 ROLE_NAME=trainer "
        f"TORCHELASTIC_RESTART_COUNT=0 TORCHELASTIC_MAX_RESTARTS=3 TORCHELASTIC_RUN_ID=job7 "
        f"TORCHELASTIC_USE_AGENT_STORE=False" for r in (0, 1)]
