"""GPU tests: they run on a machine with a CUDA GPU (the device tool's machine) and are
skipped, each with its reason, everywhere else. All ranks share cuda:0; for NCCL each rank
is given its own NCCL host identity (NCCL_HOSTID), so that NCCL accepts several ranks of one
communicator on one GPU and connects them over its socket transport on loopback."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist

NO_CUDA = "needs a CUDA GPU (torch.cuda.is_available() is False here); run tests/gpu on " \
          "the GPU machine"
NO_NCCL = "needs torch with NCCL (torch.distributed.is_nccl_available() is False)"


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    reason = NO_CUDA if not torch.cuda.is_available() else \
        NO_NCCL if not dist.is_nccl_available() else None
    if reason is None:
        return
    for item in items:
        if "tests/gpu/" in str(item.path).replace("\\", "/"):
            item.add_marker(pytest.mark.skip(reason=reason))
