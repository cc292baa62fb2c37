"""Several `elasticrun` launchers of one torchrun-form job on this machine, started at the
same moment, as torchrun's users start one per node (PyTorch's own launcher test starts
two on one host): every launcher is a node, one of them hosts the driver.

Every launcher carries the job's test tag (harness.job_env), and so does all it starts.
"""

from __future__ import annotations

import re
import subprocess
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from tests.integration.harness import PYTHON, REPO, SCRIPTS, free_port, job_env

SCRIPT = SCRIPTS / "torchrun_style.py"
LINE = re.compile(r"^torchrun-style rank=(\d+) world=(\d+) sum=(\S+)$", re.MULTILINE)


@dataclass(frozen=True)
class Launched:
    codes: list[int | None]  # None: killed at the deadline
    outs: list[str]
    errs: list[str]
    tag: str

    def ranks(self) -> dict[int, tuple[int, float]]:
        """Each rank's world size and all-reduced sum, from every launcher's console."""
        return {int(rank): (int(world), float(total))
                for out in self.outs for rank, world, total in LINE.findall(out)}

    def describe(self) -> str:
        return "\n".join(f"launcher {n}: exit {code}\n{err[-3000:]}"
                         for n, (code, err) in enumerate(zip(self.codes, self.errs, strict=True)))


def launch_at_once(tmp: Path, launchers: int, nproc: int, timeout: float = 120.0,
                   extra: Sequence[str] = (), script: Path = SCRIPT) -> Launched:
    """`launchers` launchers of one `--nnodes N --nproc-per-node nproc` job, started back
    to back; waits (bounded) for all of them."""
    env, tag = job_env()
    line = [PYTHON, "-m", "elasticrun", "--nnodes", str(launchers), "--nproc-per-node",
            str(nproc), "--rdzv-backend", "c10d", "--rdzv-endpoint", f"127.0.0.1:{free_port()}",
            "--rdzv-id", f"at-once-{uuid.uuid4().hex[:8]}", *extra, str(script)]
    files = [(open(tmp / f"out{n}", "w+b"), open(tmp / f"err{n}", "w+b"))  # noqa: SIM115
             for n in range(launchers)]
    procs = [subprocess.Popen(line, env=env, cwd=REPO, stdin=subprocess.DEVNULL, stdout=out,
                              stderr=err) for out, err in files]
    deadline = time.monotonic() + timeout
    codes: list[int | None] = []
    for proc in procs:
        try:
            codes.append(proc.wait(max(0.1, deadline - time.monotonic())))
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
            codes.append(None)
    outs, errs = [], []
    for out, err in files:
        for file, texts in ((out, outs), (err, errs)):
            file.seek(0)
            texts.append(file.read().decode(errors="replace"))
            file.close()
    return Launched(codes, outs, errs, tag)
