"""SSHLauncher against a real sshd on 127.0.0.1 (see conftest.py)."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from elasticrun.job.errors import SpawnError
from elasticrun.launch.ssh.launcher import SSHLauncher, SSHProcess, SSHSettings
from tests.integration import harness

HOST = "127.0.0.1"
TAG_VAR = "ELASTICRUN_SSH_TEST_TAG"
REPO = Path(__file__).resolve().parents[2]

if TYPE_CHECKING:
    from conftest import SSHServer


# --- helpers ---------------------------------------------------------------------------


def settings_for(sshd: SSHServer, **overrides: Any) -> SSHSettings:
    base = SSHSettings(port=sshd.port, identity_file=sshd.client_key,
                       known_hosts=sshd.known_hosts, config_file=sshd.empty_config,
                       connect_timeout=5.0, connect_attempts=1, stop_grace_period=2.0)
    return dataclasses.replace(base, **overrides)


def tagged_pids(tag: str) -> list[int]:
    return harness.tagged_pids(tag, TAG_VAR)


def count_tagged(tag: str, expected: int, within: float = 5.0) -> int:
    """How many processes carry `tag`, waiting (bounded) for `expected`: a process caught
    in the middle of execve briefly has no readable environment."""
    deadline = time.monotonic() + within
    while (count := len(tagged_pids(tag))) != expected and time.monotonic() < deadline:
        time.sleep(0.05)
    return count


def wait_until_gone(tag: str, within: float = 5.0) -> list[int]:
    deadline = time.monotonic() + within
    while (left := tagged_pids(tag)) and time.monotonic() < deadline:
        time.sleep(0.05)
    return left


async def read_line(proc: SSHProcess, timeout: float = 10.0) -> bytes:
    return await asyncio.wait_for(proc.stdout.readline(), timeout)


async def wait_code(proc: SSHProcess, timeout: float = 10.0) -> int:
    return await asyncio.wait_for(proc.wait(), timeout)


async def spawn_ready(spawner: SSHLauncher, script: str, env: dict[str, str],
                      cwd: Path) -> SSHProcess:
    """Runs `sh -c script`; the script prints "ready" once its processes are up."""
    proc = await spawner.spawn(HOST, ["sh", "-c", script], env, cwd)
    assert await read_line(proc) == b"ready\n"
    return proc


@pytest.fixture
def tag() -> Iterator[str]:
    """A unique tag in each test's worker environment; nothing carrying it may survive."""
    value = uuid.uuid4().hex
    yield value
    assert wait_until_gone(value) == [], "remote processes left behind"


@pytest.fixture
def env(tag: str) -> dict[str, str]:
    return {"PATH": os.environ["PATH"], TAG_VAR: tag}


@pytest.fixture
async def spawner(sshd: SSHServer) -> AsyncIterator[SSHLauncher]:
    spawner = SSHLauncher(settings_for(sshd))
    yield spawner
    await spawner.close()


async def connect_error(settings: SSHSettings, tmp_path: Path) -> tuple[str, float]:
    """The SpawnError message of one spawn with `settings`, and how long it took."""
    spawner = SSHLauncher(settings)
    started = time.monotonic()
    try:
        with pytest.raises(SpawnError) as info:
            await spawner.spawn(HOST, ["true"], {"PATH": os.environ["PATH"]}, tmp_path)
    finally:
        await spawner.close()
    message = str(info.value)
    assert "\n" not in message
    return message, time.monotonic() - started


# --- running commands ---------------------------------------------------------------------

WEIRD = "a b \"double\" 'single' $HOME `id` \\ back\nsecond line\ttab ünï"

REPORT = """
import json, os, sys
print(json.dumps({"weird": os.environ["WEIRD"], "cwd": os.getcwd(), "argv": sys.argv[1:]}))
sys.stdout.flush()
sys.stderr.write("to stderr\\n")
sys.exit(int(os.environ["CODE"]))
"""


@pytest.mark.parametrize("code", [0, 3])
async def test_runs_command_with_env_cwd_args_and_exit_code(
    spawner: SSHLauncher, env: dict[str, str], tmp_path: Path, code: int
) -> None:
    cwd = tmp_path / "dir with 'quotes' and spaces"
    cwd.mkdir()
    env.update(WEIRD=WEIRD, CODE=str(code))
    proc = await spawner.spawn(HOST, [sys.executable, "-c", REPORT, WEIRD, ""], env, cwd)
    assert await wait_code(proc) == code
    report = json.loads(await asyncio.wait_for(proc.stdout.read(), 5))
    assert report == {"weird": WEIRD, "cwd": str(cwd), "argv": [WEIRD, ""]}
    assert await asyncio.wait_for(proc.stderr.read(), 5) == b"to stderr\n"


async def test_secret_is_on_no_command_line(
    spawner: SSHLauncher, env: dict[str, str], tag: str, tmp_path: Path
) -> None:
    secret = f"secret-{uuid.uuid4().hex}"
    env["ELASTICRUN_SECRET"] = secret
    proc = await spawn_ready(spawner, "sleep 30 & echo ready; wait", env, tmp_path)
    needle = secret.encode()
    seen_in_environ = False
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            assert needle not in (entry / "cmdline").read_bytes(), entry
            seen_in_environ |= needle in (entry / "environ").read_bytes()
        except OSError:
            continue
    assert seen_in_environ, "the worker should have the secret in its environment"
    await proc.stop(1.0)


async def test_output_is_complete_for_large_volumes(
    spawner: SSHLauncher, env: dict[str, str], tmp_path: Path
) -> None:
    size = 3_000_000
    proc = await spawner.spawn(HOST, ["head", "-c", str(size), "/dev/zero"], env, tmp_path)
    data = await asyncio.wait_for(proc.stdout.read(), 20)
    assert len(data) == size
    assert await wait_code(proc) == 0


async def test_missing_working_directory_is_exit_127(
    spawner: SSHLauncher, env: dict[str, str], tmp_path: Path
) -> None:
    proc = await spawner.spawn(HOST, ["true"], env, tmp_path / "nope")
    assert await wait_code(proc) == 127
    err = (await asyncio.wait_for(proc.stderr.read(), 5)).decode()
    assert "cannot change to directory" in err and "nope" in err
    assert err.count("\n") == 1


async def test_missing_command_is_exit_127(
    spawner: SSHLauncher, env: dict[str, str], tmp_path: Path
) -> None:
    proc = await spawner.spawn(HOST, ["no-such-command-xyz"], env, tmp_path)
    assert await wait_code(proc) == 127
    err = (await asyncio.wait_for(proc.stderr.read(), 5)).decode()
    assert "no-such-command-xyz" in err and "command not found" in err


async def test_workers_share_a_connection_until_max_sessions(
    sshd: SSHServer, spawner: SSHLauncher, env: dict[str, str], tmp_path: Path
) -> None:
    procs = await asyncio.gather(*(
        spawn_ready(spawner, "echo ready; exec sleep 30", env, tmp_path)
        for _ in range(sshd.max_sessions + 1)
    ))
    transports = {id(p.channel.get_transport()) for p in procs}
    assert len(transports) == 2  # MaxSessions on the first, one more on a second
    await asyncio.gather(*(p.stop(1.0) for p in procs))
    assert [p.returncode for p in procs] == [128 + signal.SIGTERM] * len(procs)


# --- stopping -------------------------------------------------------------------------------


async def test_stop_ends_the_whole_remote_tree(
    spawner: SSHLauncher, env: dict[str, str], tag: str, tmp_path: Path
) -> None:
    proc = await spawn_ready(spawner, "sleep 300 & sleep 300 & echo ready; wait", env, tmp_path)
    assert count_tagged(tag, 3) == 3
    started = time.monotonic()
    await proc.stop(5.0)
    assert time.monotonic() - started < 3.0  # SIGTERM was enough, no need for the grace
    assert proc.returncode == 128 + signal.SIGTERM
    assert wait_until_gone(tag) == []


async def test_stop_kills_a_tree_ignoring_sigterm_after_the_grace(
    spawner: SSHLauncher, env: dict[str, str], tag: str, tmp_path: Path
) -> None:
    script = "trap '' TERM; sleep 300 & echo ready; wait"
    proc = await spawn_ready(spawner, script, env, tmp_path)
    started = time.monotonic()
    await proc.stop(1.0)
    elapsed = time.monotonic() - started
    assert 0.9 <= elapsed < 4.0
    assert proc.returncode == 128 + signal.SIGKILL
    assert wait_until_gone(tag) == []


def parent_pid(pid: int) -> int:
    stat = Path(f"/proc/{pid}/stat").read_text()
    return int(stat.rsplit(")", 1)[1].split()[1])


async def test_sigterm_to_the_remote_bootstrap_ends_the_tree(
    spawner: SSHLauncher, env: dict[str, str], tag: str, tmp_path: Path
) -> None:
    proc = await spawn_ready(spawner, "sleep 300 & echo ready; wait", env, tmp_path)
    assert count_tagged(tag, 2) == 2
    tagged = tagged_pids(tag)
    bootstraps = {parent_pid(pid) for pid in tagged} - set(tagged)
    assert len(bootstraps) == 1
    os.kill(bootstraps.pop(), signal.SIGTERM)
    assert await wait_code(proc) == 128 + signal.SIGTERM
    assert wait_until_gone(tag) == []


async def test_lost_connection_ends_the_remote_tree(
    spawner: SSHLauncher, env: dict[str, str], tag: str, tmp_path: Path
) -> None:
    proc = await spawn_ready(spawner, "sleep 300 & sleep 300 & echo ready; wait", env, tmp_path)
    transport = proc.channel.get_transport()
    assert transport is not None
    await asyncio.to_thread(transport.close)
    assert await wait_code(proc) == 255
    assert wait_until_gone(tag) == []


async def test_closing_the_spawner_ends_running_workers(
    sshd: SSHServer, env: dict[str, str], tag: str, tmp_path: Path
) -> None:
    spawner = SSHLauncher(settings_for(sshd))
    procs = [await spawn_ready(spawner, "sleep 300 & echo ready; wait", env, tmp_path)
             for _ in range(2)]
    assert count_tagged(tag, 4) == 4
    await spawner.close()
    assert [await wait_code(p) for p in procs] == [255, 255]
    assert wait_until_gone(tag) == []
    with pytest.raises(SpawnError, match="closed"):
        await spawner.spawn(HOST, ["true"], env, tmp_path)


async def test_stop_after_exit_is_harmless(
    spawner: SSHLauncher, env: dict[str, str], tmp_path: Path
) -> None:
    proc = await spawner.spawn(HOST, ["true"], env, tmp_path)
    assert await wait_code(proc) == 0
    await asyncio.wait_for(proc.stop(1.0), 2.0)
    assert await proc.wait() == 0


DRIVER = """
import asyncio, json, sys
from pathlib import Path
from elasticrun.launch.ssh.launcher import SSHSettings, SSHLauncher

async def main():
    args = json.loads(sys.argv[1])
    settings = SSHSettings(port=args["port"], identity_file=Path(args["key"]),
                           known_hosts=Path(args["known_hosts"]),
                           config_file=Path(args["config"]))
    proc = await SSHLauncher(settings).spawn(
        "127.0.0.1", ["sh", "-c", "sleep 300 & sleep 300 & echo ready; wait"],
        args["env"], Path(args["cwd"]))
    sys.stdout.write((await proc.stdout.readline()).decode())
    sys.stdout.flush()
    await asyncio.sleep(300)

asyncio.run(main())
"""


def test_killed_driver_leaves_no_remote_processes(
    sshd: SSHServer, env: dict[str, str], tag: str, tmp_path: Path
) -> None:
    args = {"port": sshd.port, "key": str(sshd.client_key), "known_hosts": str(sshd.known_hosts),
            "config": str(sshd.empty_config), "env": env, "cwd": str(tmp_path)}
    driver = subprocess.Popen([sys.executable, "-c", DRIVER, json.dumps(args)],
                              stdout=subprocess.PIPE, cwd=REPO)
    try:
        assert driver.stdout is not None
        assert driver.stdout.readline() == b"ready\n"
        assert count_tagged(tag, 3) == 3
    finally:
        driver.kill()
        driver.wait()
    assert wait_until_gone(tag) == []


# --- connecting -----------------------------------------------------------------------------


async def test_unknown_host_key_is_refused(sshd: SSHServer, tmp_path: Path) -> None:
    known = tmp_path / "known_hosts"
    known.write_text("")
    message, elapsed = await connect_error(
        settings_for(sshd, known_hosts=known, connect_attempts=3), tmp_path)
    assert "attempts" not in message and elapsed < 3.0  # not retried
    assert message.startswith(f"cannot reach host 127.0.0.1:{sshd.port} over SSH: ")
    assert "not in known_hosts" in message and "--ssh-accept-new-host-keys" in message
    assert known.read_text() == ""


async def test_new_host_key_is_accepted_and_recorded_when_asked(
    sshd: SSHServer, env: dict[str, str], tmp_path: Path
) -> None:
    known = tmp_path / "new" / "known_hosts"
    for accept in (True, False):  # the second spawner finds the recorded key
        spawner = SSHLauncher(settings_for(sshd, known_hosts=known, accept_new_host_keys=accept))
        try:
            proc = await spawner.spawn(HOST, ["true"], env, tmp_path)
            assert await wait_code(proc) == 0
        finally:
            await spawner.close()
        assert known.read_text() == sshd.known_hosts_line()


@pytest.mark.parametrize("accept", [False, True])
async def test_changed_host_key_is_always_an_error(
    sshd: SSHServer, tmp_path: Path, accept: bool
) -> None:
    known = tmp_path / "known_hosts"
    known.write_text(sshd.known_hosts_line(sshd.keygen(tmp_path / "other_key")))
    before = known.read_text()
    message, _ = await connect_error(
        settings_for(sshd, known_hosts=known, accept_new_host_keys=accept), tmp_path)
    assert "HOST KEY FOR 127.0.0.1 HAS CHANGED" in message
    assert known.read_text() == before


async def test_connection_refused_fails_within_bounded_time(
    sshd: SSHServer, tmp_path: Path
) -> None:
    port = sshd.free_port()
    message, elapsed = await connect_error(
        settings_for(sshd, port=port, connect_attempts=2), tmp_path)
    assert message == (f"cannot reach host 127.0.0.1:{port} over SSH: connection refused "
                       f"(after 2 attempts)")
    assert elapsed < 3.0


async def test_silent_server_times_out(sshd: SSHServer, tmp_path: Path) -> None:
    with socket.socket() as listener:  # accepts connections (backlog) but never speaks
        listener.bind((HOST, 0))
        listener.listen(4)
        port = listener.getsockname()[1]
        message, elapsed = await connect_error(
            settings_for(sshd, port=port, connect_timeout=0.5), tmp_path)
    assert message.startswith(f"cannot reach host 127.0.0.1:{port} over SSH: ")
    assert "banner" in message
    assert elapsed < 3.0


async def test_every_attempt_ends_within_the_start_timeout(sshd: SSHServer, tmp_path: Path
                                                          ) -> None:
    """Three attempts of 1 s each would take ~4.5 s with their back-off; the start timeout
    (connect_total) gives the host up after 1.5 s."""
    with socket.socket() as listener:  # accepts connections (backlog) but never speaks
        listener.bind((HOST, 0))
        listener.listen(4)
        port = listener.getsockname()[1]
        message, elapsed = await connect_error(
            settings_for(sshd, port=port, connect_timeout=1.0, connect_attempts=3,
                         connect_total=1.5), tmp_path)
    assert "banner" in message and "attempts" not in message, message
    assert elapsed < 3.0


async def test_wrong_client_key_is_authentication_failed(
    sshd: SSHServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("SSH_AUTH_SOCK", raising=False)
    wrong = tmp_path / "wrong_key"
    sshd.keygen(wrong)
    message, elapsed = await connect_error(
        settings_for(sshd, identity_file=wrong, connect_attempts=3), tmp_path)
    assert message.startswith(f"cannot reach host 127.0.0.1:{sshd.port} over SSH: "
                              "authentication failed")
    assert "attempts" not in message and elapsed < 3.0  # not retried


async def test_ssh_config_gives_hostname_port_user_and_key(
    sshd: SSHServer, env: dict[str, str], tmp_path: Path
) -> None:
    config = tmp_path / "ssh_config"
    config.write_text(f"Host node-a\n  HostName 127.0.0.1\n  Port {sshd.port}\n"
                      f"  User root\n  IdentityFile {sshd.client_key}\n")
    spawner = SSHLauncher(SSHSettings(known_hosts=sshd.known_hosts, config_file=config))
    try:
        proc = await spawner.spawn("node-a", ["sh", "-c", "exit 5"], env, tmp_path)
        assert await wait_code(proc) == 5
    finally:
        await spawner.close()


@pytest.mark.skipif(shutil.which("ssh") is None, reason="needs the ssh client")
async def test_ssh_config_proxy_command(
    sshd: SSHServer, env: dict[str, str], tmp_path: Path
) -> None:
    jump = (f"ssh -F /dev/null -o BatchMode=yes -o UserKnownHostsFile={sshd.known_hosts} "
            f"-i {sshd.client_key} -p {sshd.port} -W %h:%p root@127.0.0.1")
    config = tmp_path / "ssh_config"
    config.write_text(f"Host behind\n  HostName 127.0.0.1\n  ProxyCommand {jump}\n")
    spawner = SSHLauncher(settings_for(sshd, config_file=config))
    try:
        proc = await spawner.spawn("behind", ["sh", "-c", "echo via proxy"], env, tmp_path)
        assert await read_line(proc) == b"via proxy\n"
        assert await wait_code(proc) == 0
    finally:
        await spawner.close()


# --- asking the host what a worker's process does (hang detection) ----------------------


async def test_inspect_tells_running_stopped_and_gone(
    spawner: SSHLauncher, env: dict[str, str], tmp_path: Path, tag: str
) -> None:
    from elasticrun.system.process_view import ProcessState

    env["ELASTICRUN_WORKER_ID"] = "w-inspect"
    proc = await spawn_ready(spawner, "echo ready; exec sleep 60", env, tmp_path)
    assert (await proc.inspect()).state is ProcessState.RUNNING
    [pid] = tagged_pids(tag)
    os.kill(pid, signal.SIGSTOP)
    view = await proc.inspect()
    assert (view.state, view.detail) == (ProcessState.STOPPED, "stopped (SIGSTOP)")
    os.kill(pid, signal.SIGKILL)
    assert await wait_code(proc) == 128 + signal.SIGKILL
    assert (await proc.inspect()).state is ProcessState.GONE


async def test_inspect_on_a_full_connection_cannot_tell_rather_than_unreachable(
    sshd: SSHServer, spawner: SSHLauncher, env: dict[str, str], tmp_path: Path
) -> None:
    """The probe needs one more session on the worker's connection: where sshd's MaxSessions
    is reached, the host cannot tell (it answered), it is not unreachable (seen in CI: a
    worker of a full connection failed as hung)."""
    from elasticrun.system.process_view import ProcessState

    env["ELASTICRUN_WORKER_ID"] = "w-full"
    procs = await asyncio.gather(*(
        spawn_ready(spawner, "echo ready; exec sleep 30", env, tmp_path)
        for _ in range(sshd.max_sessions)))
    try:
        view = await procs[0].inspect()
        assert view.state is ProcessState.UNKNOWN and "no SSH session" in view.detail, view
    finally:
        await asyncio.gather(*(p.stop(1.0) for p in procs))


async def test_inspect_behind_a_slow_login_shell_cannot_tell_rather_than_unreachable(
    sshd: SSHServer, spawner: SSHLauncher, env: dict[str, str], tmp_path: Path
) -> None:
    """The probe runs through the user's login shell, which runs their ~/.bashrc first
    (conda, pyenv: seconds on a loaded host; a minute each in CI, behind a stale pyenv
    lock). The host answered (its sshd opened the channel): it cannot tell, it is not
    unreachable. The probe's shell ends by itself once its start-up is over."""
    from elasticrun.launch.ssh.process import INSPECT_WAIT_S
    from elasticrun.system.process_view import ProcessState

    env["ELASTICRUN_WORKER_ID"] = "w-slow-shell"
    proc = await spawn_ready(spawner, "echo ready; exec sleep 30", env, tmp_path)
    bashrc = sshd.session_home / ".bashrc"
    bashrc.write_text(f"sleep {INSPECT_WAIT_S + 3:g}\n")
    try:
        view = await proc.inspect()
        assert view.state is ProcessState.UNKNOWN and "slow login shell" in view.detail, view
    finally:
        bashrc.unlink()
        await proc.stop(1.0)
        deadline = time.monotonic() + INSPECT_WAIT_S + 10
        while probe_shells("ELASTICRUN_WORKER_ID=w-slow-shell") and time.monotonic() < deadline:
            await asyncio.sleep(0.1)
    assert not probe_shells("ELASTICRUN_WORKER_ID=w-slow-shell"), "the probe's shell stayed"


def probe_shells(needle: str) -> list[int]:
    """Processes whose command line holds `needle` (the probe's shell names the worker)."""
    found = []
    for entry in Path("/proc").iterdir():
        try:
            if entry.name.isdigit() and needle.encode() in (entry / "cmdline").read_bytes():
                found.append(int(entry.name))
        except OSError:
            continue
    return found
