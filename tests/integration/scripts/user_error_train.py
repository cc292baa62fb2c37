"""elastic_train.py, except that the worker that is rank USER_ERROR_RANK at step
USER_ERROR_STEP raises the user's own RuntimeError, whose text sounds like a network
failure (once per job). elasticrun must take it for the user's error, not a peer's."""

from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.dirname(__file__))

import elastic_train  # noqa: E402

import elasticrun.torch as er  # noqa: E402

STEP = int(os.environ.get("USER_ERROR_STEP", "10"))
RANK = int(os.environ.get("USER_ERROR_RANK", "3"))
MESSAGE = "connection timed out while reading shard 17 from the data lake"
injected_faults = elastic_train.maybe_fault


def maybe_fault(step: int) -> None:
    injected_faults(step)
    if step != STEP or er.rank() != RANK:
        return
    try:  # once per job
        os.close(os.open(os.path.join(elastic_train.LOG_DIR, "user-error"),
                         os.O_CREAT | os.O_EXCL))
    except FileExistsError:
        return
    elastic_train.log("fault", step=step, mode="user-runtime-error", rank=er.rank())
    raise RuntimeError(MESSAGE)


elastic_train.maybe_fault = maybe_fault

if __name__ == "__main__":
    elastic_train.main()
