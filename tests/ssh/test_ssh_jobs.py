"""Whole jobs through the SSH launcher, against a real sshd on loopback.

The hosts are ~/.ssh/config aliases of 127.0.0.1 ("sshhost1", ...): not local names, so
the driver reaches them over SSH exactly as it would reach another machine.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

from elasticrun.worker.host_template import BOOT as TEMPLATE_BOOT
from tests.integration.harness import (
    PYTHON,
    SCRIPTS,
    assert_no_orphans,
    run_job,
    start_job,
)
from tests.integration.progress import check_job
from tests.ssh.conftest import SSHServer

TRAIN = [PYTHON, str(SCRIPTS / "elastic_train.py")]


@pytest.fixture
def ssh_home(tmp_path: Path, sshd: SSHServer) -> Path:
    """A HOME whose ssh config names sshhost1/sshhost2 (the sshd) and deadhost (nobody)."""
    home = tmp_path / "home"
    ssh_dir = home / ".ssh"
    ssh_dir.mkdir(parents=True)
    dead_port = sshd.free_port()
    ssh_dir.joinpath("config").write_text("".join(
        f"Host {alias}\n  HostName 127.0.0.1\n  Port {port}\n  IdentityFile {sshd.client_key}\n"
        for alias, port in (("sshhost1", sshd.port), ("sshhost2", sshd.port),
                            ("deadhost", dead_port))))
    ssh_dir.joinpath("known_hosts").write_text(sshd.known_hosts_line())
    return home


def env_for(home: Path, **extra: str) -> dict[str, str]:
    return {"HOME": str(home), "TRAIN_EPOCHS": "2", "TRAIN_SAMPLES": "32", **extra}


def test_job_over_ssh_trains_with_prefixed_output_and_no_secret_on_command_lines(
        ssh_home: Path) -> None:
    result = run_job(["-H", "sshhost1:2", "--start-timeout", "60",
                      PYTHON, str(SCRIPTS / "check_optimizer.py")],
                     {"HOME": str(ssh_home)})
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.count("optimizer-equivalence ok") == 2
    assert "secret-in-cmdline False" in result.stdout
    assert "secret-in-cmdline True" not in result.stdout
    hashes = {line.split()[-1] for line in result.stdout.splitlines() if "params" in line}
    assert len(hashes) == 1
    assert all(line.startswith(("[0]<", "[1]<")) for line in result.stdout.splitlines())


def test_elastic_failure_across_local_and_ssh_hosts(tmp_path: Path, ssh_home: Path) -> None:
    """The SSH host's worker is SIGKILLed; the job finishes on the local host."""
    result = run_job(["-H", "localhost:2,sshhost1:2", "--min-np", "2", "--start-timeout", "60",
                      *TRAIN], env_for(ssh_home, FAULTS="3:2:sigkill"), log_dir=tmp_path / "logs")
    assert result.returncode == 0, result.stderr[-3000:]
    views = check_job(result.records, samples=32, epochs=2)
    assert [v.size for v in views][:2] == [4, 3]  # then its slot's new worker joins
    assert set(views[0].hosts_by_rank.values()) == {"localhost", "sshhost1"}
    assert sorted(views[1].hosts_by_rank.values()) == ["localhost", "localhost", "sshhost1"]
    assert "slot sshhost1[0] gets a new worker" in result.stderr


def test_unreachable_host_is_one_line_and_the_job_goes_on(tmp_path: Path,
                                                          ssh_home: Path) -> None:
    result = run_job(["-H", "localhost:2,deadhost:2", "--min-np", "2", "--start-timeout", "60",
                      *TRAIN], env_for(ssh_home), log_dir=tmp_path / "logs")
    assert result.returncode == 0, result.stderr[-3000:]
    lines = [line for line in result.stderr.splitlines()
             if "deadhost" in line and "round" not in line]
    assert len(lines) == 1 and "connection refused" in lines[0], lines
    assert "Traceback" not in result.stderr
    assert {v.size for v in check_job(result.records, samples=32, epochs=2)} == {2}


def test_unknown_host_key_is_refused_unless_accepted(tmp_path: Path, ssh_home: Path) -> None:
    (ssh_home / ".ssh" / "known_hosts").write_text("")
    args = ["-H", "localhost:1,sshhost1:1", "--min-np", "1", "--start-timeout", "60", *TRAIN]
    refused = run_job(args, env_for(ssh_home), log_dir=tmp_path / "refused")
    assert refused.returncode == 0, refused.stderr[-3000:]
    assert "known_hosts" in refused.stderr and "sshhost1 failed" in refused.stderr
    accepted = run_job(["--ssh-accept-new-host-keys", *args], env_for(ssh_home),
                       log_dir=tmp_path / "accepted")
    assert accepted.returncode == 0, accepted.stderr[-3000:]
    assert "sshhost1 failed" not in accepted.stderr, accepted.stderr[-3000:]
    assert "127.0.0.1" in (ssh_home / ".ssh" / "known_hosts").read_text()


def test_changed_host_key_is_one_line_and_the_job_goes_on(tmp_path: Path, ssh_home: Path,
                                                         sshd: SSHServer) -> None:
    other_key = sshd.keygen(tmp_path / "impostor")
    (ssh_home / ".ssh" / "known_hosts").write_text(sshd.known_hosts_line(other_key))
    result = run_job(["-H", "localhost:1,sshhost1:1", "--min-np", "1", "--start-timeout", "60",
                      "--ssh-accept-new-host-keys", *TRAIN], env_for(ssh_home),
                     log_dir=tmp_path / "logs")
    assert result.returncode == 0, result.stderr[-3000:]
    lines = [line for line in result.stderr.splitlines() if "HAS CHANGED" in line]
    assert len(lines) == 1 and "sshhost1" in lines[0]
    assert (ssh_home / ".ssh" / "known_hosts").read_text() == sshd.known_hosts_line(other_key)


def test_working_dir_and_remote_python_are_used_remotely(tmp_path: Path,
                                                         ssh_home: Path) -> None:
    workdir = tmp_path / "a dir with spaces"
    workdir.mkdir()
    result = run_job(["-H", "sshhost1:1", "--working-dir", str(workdir), "--remote-python",
                      PYTHON, "sh", "-c", 'echo "cwd=$(pwd)"'], {"HOME": str(ssh_home)})
    assert result.returncode == 0, result.stderr[-3000:]
    assert f"[0]<stdout>:cwd={workdir}" in result.stdout


def training_over_ssh(home: Path) -> tuple[subprocess.Popen[str], str]:
    """A job of two SSH workers that train forever, once they have taken a step."""
    proc, tag = start_job(["-H", "sshhost1:2", "--start-timeout", "60",
                           PYTHON, str(SCRIPTS / "sleepy_train.py")], {"HOME": str(home)})
    assert proc.stdout is not None
    deadline = time.monotonic() + 90
    for line in proc.stdout:
        if "step" in line or time.monotonic() > deadline:
            break
    return proc, tag


def test_ctrl_c_leaves_no_remote_process(ssh_home: Path) -> None:
    proc, tag = training_over_ssh(ssh_home)
    proc.send_signal(signal.SIGINT)
    proc.communicate(timeout=30)
    assert proc.returncode == 130
    assert_no_orphans(tag)


def test_killed_driver_leaves_no_remote_process(ssh_home: Path) -> None:
    """SIGKILL gives the driver no chance to stop anyone: the SSH connection's end does."""
    proc, tag = training_over_ssh(ssh_home)
    proc.kill()
    proc.communicate(timeout=30)
    assert_no_orphans(tag, within=15)


@pytest.mark.parametrize("template", ["1", "0"])
def test_ssh_workers_fork_from_their_hosts_template(tmp_path: Path, ssh_home: Path,
                                                    template: str) -> None:
    """Python workers on an SSH host are forked by the host's worker template (torch already
    imported when the script starts), unless ELASTICRUN_WORKER_TEMPLATE=0; either way the
    job's processes, the template's too, are gone at its end (run_job checks)."""
    script = tmp_path / "where.py"
    script.write_text(
        "import os, sys\n"
        "preloaded = 'torch' in sys.modules\n"
        "import elasticrun.torch as er\n"
        "er.init()\n"
        "parent = open(f'/proc/{os.getppid()}/cmdline').read().replace(chr(0), ' ')\n"
        "print('preloaded', preloaded, 'by template', 'host_template' in parent, flush=True)\n"
        "er.shutdown()\n")
    result = run_job(["-H", "sshhost1:2", "--start-timeout", "60", PYTHON, str(script)],
                     {"HOME": str(ssh_home), "ELASTICRUN_WORKER_TEMPLATE": template})
    assert result.returncode == 0, result.stderr[-3000:]
    forked = template == "1"
    assert result.stdout.count(f"preloaded {forked} by template {forked}") == 2, result.stdout


def test_a_hosts_template_whose_channel_closes_while_it_imports_ends_at_once(
        tmp_path: Path) -> None:
    """The job ended (or its launcher died) just after the host's first worker started its
    template: the template's stdin (its SSH channel) ends while it still imports torch. It
    exits then, without finishing the imports or serving: not seconds later, when a check
    for orphans may already have looked."""
    env = {**os.environ, "TMPDIR": str(tmp_path)}
    proc = subprocess.Popen([PYTHON, "-c", TEMPLATE_BOOT], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env)
    # its environment, then the end of its stdin at once
    out, err = proc.communicate((json.dumps({"env": env}) + "\n").encode(), timeout=60)
    assert proc.returncode == 0, err.decode()[-2000:]
    assert out == b""  # it never printed its socket's path: it ended during the imports
    assert list(tmp_path.iterdir()) == []  # nor made its directory
