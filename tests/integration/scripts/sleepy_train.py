"""Trains forever: an allreduce and a "step N" line every ~0.2 s (for signal tests)."""

from __future__ import annotations

import time

import torch

import elasticrun.torch as er


def main() -> None:
    er.init()
    step = 0
    while True:
        er.allreduce(torch.ones(1))
        print(f"step {step}", flush=True)
        step += 1
        time.sleep(0.2)


if __name__ == "__main__":
    main()
