"""Workers forked from the worker template (launch/local/forked.py, worker/template.py) are the
processes `python script.py` would have been: same argv, path, environment, working
directory, stdin, session, exit codes and tracebacks, fresh seeds; and they die with the
template. Real template, real forks."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
from pathlib import Path

import pytest

from elasticrun.launch.local.forked import ForkedProcess, Forker, forkable, template_env
from elasticrun.launch.local.launcher import die_with_parent
from elasticrun.worker.template import cuda_driver_loaded
from tests.integration.harness import REPO

SCRIPT = REPO / "tests" / "integration" / "scripts" / "describe_self.py"


def test_only_plain_python_scripts_and_modules_are_forked(tmp_path: Path) -> None:
    (tmp_path / "train.py").write_text("")
    assert forkable(["python", "train.py", "--lr", "1"], tmp_path)
    assert forkable(["/venv/bin/python3.11", str(tmp_path / "train.py")], tmp_path)
    assert forkable(["python3", "-m", "pkg.train"], tmp_path)
    assert not forkable(["python", "-u", "train.py"], tmp_path)  # interpreter options
    assert not forkable(["python", "missing.py"], tmp_path)  # python's own message, code 2
    assert not forkable(["bash", "train.py"], tmp_path)
    assert not forkable(["python"], tmp_path)
    assert not forkable(["python", "-m", "bad name"], tmp_path)


def test_a_template_that_loaded_the_cuda_driver_does_not_fork() -> None:
    cpu = "7f0-7f1 r-xp 0 08:01 1 /venv/lib/python3.11/site-packages/torch/lib/libtorch.so\n"
    assert not cuda_driver_loaded(cpu)
    assert not cuda_driver_loaded(cpu + "7f2-7f3 r-xp 0 08:01 2 /usr/lib/libcudart.so.12\n")
    assert cuda_driver_loaded(cpu + "7f2-7f3 r-xp 0 08:01 2 /usr/lib/x86_64-linux-gnu/"
                                    "libcuda.so.550.54.15\n")
    with open("/proc/self/maps") as maps:  # the test process: torch imported, no driver
        assert not cuda_driver_loaded(maps.read())


def test_the_template_gets_the_jobs_environment_without_per_worker_values() -> None:
    env = {"PATH": "/bin", "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1", "RANK": "3",
           "ELASTICRUN_RANK": "3", "ELASTICRUN_SECRET": "s", "HOROVOD_RANK": "3",
           "MASTER_PORT": "1", "CUDA_VISIBLE_DEVICES": "3"}
    assert template_env(env) == {"PATH": "/bin", "PYTHONUNBUFFERED": "1",
                                 "OMP_NUM_THREADS": "1"}


async def test_elasticrun_worker_template_0_turns_it_off(tmp_path: Path) -> None:
    forker = Forker(signal.SIGTERM, die_with_parent(signal.SIGTERM))
    env = {**os.environ, "ELASTICRUN_WORKER_TEMPLATE": "0"}
    assert await forker.start([sys.executable, str(SCRIPT), "0"], env, tmp_path) is None
    assert not forker._templates  # none was started


async def _describe(forker: Forker, tmp_path: Path, how: str, rank: int
                    ) -> tuple[ForkedProcess, dict[str, object]]:
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "RANK": str(rank), "MY_VAR": "job"}
    env.pop("PYTHONPATH", None)
    process = await forker.start([sys.executable, str(SCRIPT), how, "extra"], env, tmp_path)
    assert isinstance(process, ForkedProcess)
    line = await asyncio.wait_for(process.stdout.readline(), 60)
    return process, json.loads(line)


async def test_a_forked_worker_is_the_process_python_would_have_started(tmp_path: Path
                                                                        ) -> None:
    forker = Forker(signal.SIGTERM, die_with_parent(signal.SIGTERM))
    try:
        first, seen = await _describe(forker, tmp_path, "3", 0)
        second, other = await _describe(forker, tmp_path, "0", 1)
        assert seen["argv"] == [str(SCRIPT), "3", "extra"] and seen["name"] == "__main__"
        assert seen["file"] == str(SCRIPT) and seen["path0"] == str(SCRIPT.parent)
        assert seen["cwd"] == str(tmp_path) and seen["stdin"] == "/dev/null"
        assert seen["sid"] == seen["pid"] == first.pid  # a session of its own
        env = seen["env"]
        assert isinstance(env, dict) and env["RANK"] == "0" and env["MY_VAR"] == "job"
        assert other["env"]["RANK"] == "1" and "PYTHONPATH" not in env  # type: ignore[index]
        assert len(forker._templates) == 1  # one template serves every rank
        assert seen["seed"] != other["seed"]  # fresh torch seeds, as new processes have
        assert await first.stderr.readline() == b"to stderr\n"
        assert await asyncio.wait_for(first.wait(), 30) == 3
        assert await asyncio.wait_for(second.wait(), 30) == 0
        assert first.returncode == 3
    finally:
        await forker.close()


async def test_an_uncaught_exception_prints_the_users_frames_and_exits_1(tmp_path: Path
                                                                          ) -> None:
    forker = Forker(signal.SIGTERM, die_with_parent(signal.SIGTERM))
    try:
        process, _ = await _describe(forker, tmp_path, "raise", 0)
        assert await asyncio.wait_for(process.wait(), 30) == 1
        err = (await process.stderr.read()).decode()
        assert err.startswith("to stderr\nTraceback (most recent call last):\n"
                              f'  File "{SCRIPT}", line'), err
        assert "ValueError: a user error" in err and "runpy" not in err
        assert "template" not in err
    finally:
        await forker.close()


async def test_stopped_and_killed_workers_and_a_lost_template(tmp_path: Path) -> None:
    forker = Forker(signal.SIGTERM, die_with_parent(signal.SIGTERM))
    try:
        process, _ = await _describe(forker, tmp_path, "stop", 0)
        await process.stop(grace_period=5.0)
        assert process.returncode == -signal.SIGTERM
        survivor, _ = await _describe(forker, tmp_path, "stop", 1)
        [template] = [t for t in forker._templates.values() if t is not None]
        os.kill(template.process.pid, signal.SIGKILL)  # the worker's parent-death signal
        assert await asyncio.wait_for(survivor.wait(), 30) == 255  # its code is unknown
        for _ in range(100):
            if not os.path.exists(f"/proc/{survivor.pid}"):
                break
            await asyncio.sleep(0.05)
        else:
            pytest.fail("the worker outlived its template")
        env = {**os.environ, "PYTHONUNBUFFERED": "1", "MY_VAR": "job"}
        env.pop("PYTHONPATH", None)
        assert await forker.start([sys.executable, str(SCRIPT), "0"], env,
                                  tmp_path) is None  # its workers are exec'd from now on
    finally:
        await forker.close()


async def _preloaded(tmp_path: Path, script: str, extra_env: dict[str, str]) -> list[str]:
    """What a forked worker of `script` found imported before its first line ran."""
    path = tmp_path / "train.py"
    path.write_text("import sys\n"
                    "print(' '.join(m for m in ('yaml', 'mine', 'also_mine', 'threader') "
                    "if m in sys.modules), flush=True)\n" + script)
    forker = Forker(signal.SIGTERM, die_with_parent(signal.SIGTERM))
    env = {**os.environ, "PYTHONPATH": f"{REPO}:{tmp_path}", **extra_env}
    try:
        process = await forker.start([sys.executable, str(path)], env, tmp_path)
        assert isinstance(process, ForkedProcess)
        line = await asyncio.wait_for(process.stdout.readline(), 60)
        assert await asyncio.wait_for(process.wait(), 30) == 0
        return line.decode().split()
    finally:
        await forker.close()


async def test_the_template_imports_what_the_script_imports_of_installed_packages(
        tmp_path: Path) -> None:
    """A worker forked after a restart does not import transformers again: the template
    did. Never the user's own modules (their import may do anything)."""
    (tmp_path / "mine.py").write_text("")
    (tmp_path / "also_mine.py").write_text("")
    script = "import yaml\nimport mine\nimport also_mine\n"
    got = await _preloaded(tmp_path, script, {"ELASTICRUN_PRELOAD": "mine"})
    assert got == ["yaml", "mine"]  # also_mine: the user's own, and not named
    # (ELASTICRUN_PRELOAD=0, and which modules count as installed: tests/unit/test_preload.py)


async def test_a_template_that_cannot_fork_safely_after_them_starts_over_without(
        tmp_path: Path) -> None:
    """An import that starts a thread: a lock it holds at a fork stays held in the child,
    so the template begins again with torch alone, and the worker imports it itself."""
    (tmp_path / "threader.py").write_text(
        "import threading, time\n"
        "threading.Thread(target=time.sleep, args=(3600,), daemon=True).start()\n")
    got = await _preloaded(tmp_path, "import yaml\nimport threader\n",
                           {"ELASTICRUN_PRELOAD": "threader"})
    assert got == []
