"""Joins the job, allreduces a tensor on this worker's device (its GPU when it has one) and
prints what carried it: {"rank", "backend", "device", "sum"} as one JSON line."""

from __future__ import annotations

import json

import torch

import elasticrun.torch as er
from elasticrun.torch.world import runtime

er.init()
session = runtime.current().session
assert session is not None
device = runtime.current().device or torch.device("cpu")
total = er.allreduce(torch.full((3,), float(er.rank() + 1), device=device), op=er.Sum)
print(json.dumps({"rank": er.rank(), "backend": session.backend, "device": str(total.device),
                  "sum": total.tolist()}), flush=True)
er.shutdown()
