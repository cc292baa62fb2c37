"""Runs PyTorch's own tests of torchrun with the `elasticrun` command in torchrun's place:

    python -m tests.torchrun_suite.run DIR [PYTEST ARGS...]

DIR is `test/distributed/launcher` of a PyTorch checkout at torch 2.13 (test_run.py and
bin/); the files are PyTorch's and are not kept in this repository. The tests need
`expecttest` (`pip install expecttest`). swap.py swaps the launcher; nothing else changes.

Left out, each with the reason (NOT_APPLICABLE): the tests that mock torchrun's internals in
the test process (the mocks cannot reach another program), and those that start no launcher.
The files the numbers in docs/migrating/torchrun.md were taken with are named by SHA256
(PINNED); another version runs too, with a warning.
"""

from __future__ import annotations

import hashlib
import sys
from pathlib import Path

import pytest

REVISION = "0943060f697571f4138524985287f9d51d109c60"  # pytorch/pytorch's test_run.py
PINNED = {
    "test_run.py": "e46d504e81bb3898bab1152b201a29ba7aa8106e1a32d3b7cbf5b11927390600",
    "bin/test_script.py": "2b902c2da2500485f620936ad106b47a815db3ff119d264d1318f44bddad74d6",
    "bin/test_script.sh": "af14ddbe895ee3189de5c3fdb813b3399805412c5728d668c25855bd69fa393f",
    "bin/test_script_init_method.py":
        "7139029bb6f16c5819e384a34d1a4be149dd5a8aec0dd573589084ae5eb64162",
    "bin/test_script_is_torchelastic_launched.py":
        "b9656ed0b19c50069b3fbc01f44c36873c38cc795898beaac5cffdd808ff121a",
}
MOCKS = "mocks torchrun's internals in the test process, which no other program sees"
NOT_APPLICABLE = {
    "test_nproc_gpu_launch_configurations": f"{MOCKS} (torch.cuda: three GPUs)",
    "test_nproc_xpu_launch_configurations": f"{MOCKS} (torch.xpu: three XPUs)",
    "test_launch_elastic_worker_raise_exception":
        f"{MOCKS} (asserts torch.distributed.elastic.events.record was called)",
    "test_launch_elastic_agent_raise_exception": f"{MOCKS} (LocalElasticAgent.run raises)",
    "test_launch_shutdown": f"{MOCKS} (LocalElasticAgent, the rendezvous handler)",
    "test_min_max_nodes_parse": "calls torch's parse_min_max_nnodes: starts no launcher",
    "test_is_not_torchelastic_launched": "runs the script in-process: starts no launcher",
}


def main(argv: list[str]) -> int:
    if not argv or not (Path(argv[0]) / "test_run.py").is_file():
        print("usage: python -m tests.torchrun_suite.run DIR [PYTEST ARGS...] (DIR: "
              "test/distributed/launcher of PyTorch, with test_run.py)", file=sys.stderr)
        return 2
    where = Path(argv[0]).resolve()
    for name, digest in PINNED.items():
        path = where / name
        found = hashlib.sha256(path.read_bytes()).hexdigest() if path.is_file() else None
        if found != digest:
            print(f"note: {name} is not the pinned version (pytorch/pytorch {REVISION[:12]})",
                  file=sys.stderr)
    for test, why in NOT_APPLICABLE.items():
        print(f"not applicable: {test}: {why}")
    left_out = f"not ({' or '.join(NOT_APPLICABLE)})"
    return int(pytest.main([str(where / "test_run.py"), "-p", "tests.torchrun_suite.swap",
                            "-p", "no:cacheprovider", "-rA", "-k", left_out, *argv[1:]]))


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
