"""A process's random number generators' states (Python's, NumPy's, torch's CPU and CUDA),
as Hugging Face's Trainer saves them with a checkpoint, to take and to put back."""

from __future__ import annotations

import random
import sys
from typing import Any

import torch


def rng_states() -> dict[str, Any]:
    states: dict[str, Any] = {"python": random.getstate(), "cpu": torch.random.get_rng_state()}
    numpy = sys.modules.get("numpy")
    if numpy is not None:
        states["numpy"] = numpy.random.get_state()
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        states["cuda"] = torch.cuda.random.get_rng_state_all()
    return states


def set_rng_states(states: dict[str, Any]) -> None:
    random.setstate(states["python"])
    torch.random.set_rng_state(states["cpu"])
    numpy = sys.modules.get("numpy")
    if numpy is not None and "numpy" in states:
        numpy.random.set_state(states["numpy"])
    if "cuda" in states and torch.cuda.is_available():
        torch.cuda.random.set_rng_state_all(states["cuda"])
