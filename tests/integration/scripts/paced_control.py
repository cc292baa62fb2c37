"""The control files of the paced scripts (paced_train.py, paced_ddp.py): a "device time"
per step that a test changes per worker, for stragglers.

Each step sleeps --step-s (the device's work), times a factor read from DIR: the file
`slow-<pid>` slows this worker alone, `slow-all` every worker (its text: the factor, e.g.
"5"). A file `pause-<pid>` (its text: seconds) pauses this worker once, then is removed.
DIR/stop ends training at the next step. Each step prints
"step N rank R size W host H pid P t=T".
"""

from __future__ import annotations

import argparse
import os
import time
from pathlib import Path

import torch


def parse() -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    parser.add_argument("--control", type=Path, required=True)
    parser.add_argument("--step-s", type=float, default=0.1)
    parser.add_argument("--steps", type=int, default=100000)
    return parser.parse_args()


def factor(control: Path, name: str) -> float:
    try:
        return float((control / name).read_text() or "1")
    except (FileNotFoundError, ValueError):
        return 1.0


def device_time(control: Path, step_s: float) -> None:
    """This step's work on the "device": `step_s`, slowed as the control files say."""
    pause = control / f"pause-{os.getpid()}"
    if pause.exists():
        seconds = factor(control, pause.name)
        pause.unlink(missing_ok=True)
        time.sleep(seconds)
    time.sleep(step_s * factor(control, f"slow-{os.getpid()}") * factor(control, "slow-all"))


def stopping(control: Path) -> torch.Tensor:
    return torch.tensor([float((control / "stop").exists())])


def batch(step: int) -> torch.Tensor:
    return torch.randn(8, 16, generator=torch.Generator().manual_seed(step))


def said(step: int, rank: int, size: int) -> None:
    print(f"step {step} rank {rank} size {size} host {os.environ.get('ELASTICRUN_HOSTNAME')} "
          f"pid {os.getpid()} t={time.time():.3f}", flush=True)
