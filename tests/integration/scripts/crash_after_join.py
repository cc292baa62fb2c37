"""elastic_train.py, except that the worker on CRASH_HOST crashes right after it joins its
first round, before it has built the round's group: its peers are then in the middle of
building theirs (inside er.init())."""

from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.dirname(__file__))

import elastic_train  # noqa: E402

from elasticrun.torch import runtime  # noqa: E402

if os.environ.get("ELASTICRUN_HOSTNAME") == os.environ["CRASH_HOST"]:
    def crash(*args: object, **kwargs: object) -> None:
        os._exit(3)

    runtime._init_process_group = crash  # type: ignore[assignment]

if __name__ == "__main__":
    elastic_train.main()
