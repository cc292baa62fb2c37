"""A DistributedOptimizer may be built before init() (README: slow set-up goes before
init, so that it does not hold the round back); it trains once init() has run. In a
process of its own: init() and shutdown() change process-wide state."""

from __future__ import annotations

import os
import subprocess
import sys

SCRIPT = """
import torch, elasticrun.torch as er
model = torch.nn.Linear(2, 1)
optimizer = er.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                    named_parameters=model.named_parameters())
assert not er.is_initialized()
er.init()
model(torch.ones(1, 2)).sum().backward()
optimizer.step()
print("trained", model.weight.grad.tolist())
er.shutdown()
"""


def test_an_optimizer_built_before_init_trains_after_it() -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("ELASTICRUN_", "HOROVOD_"))}
    result = subprocess.run([sys.executable, "-c", SCRIPT], env=env, capture_output=True,
                            text=True, timeout=120, check=False)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "trained [[1.0, 1.0]]" in result.stdout
