"""elastic_train.py, except that the worker on CRASH_HOST crashes right after it joins a
round (the CRASH_AT_BUILD-th it joins, default the first), before it has built the round's
group: its peers are then in the middle of building theirs. CRASH_MODE=stop: it stops
itself (SIGSTOP) there instead, a hang in the middle of a rendezvous."""

from __future__ import annotations

import os
import signal
import sys

sys.path.insert(0, os.path.dirname(__file__))

import elastic_train  # noqa: E402

from elasticrun.torch.world import runtime  # noqa: E402

if os.environ.get("ELASTICRUN_HOSTNAME") == os.environ["CRASH_HOST"]:
    build = runtime._init_process_group
    builds = []

    def crash(*args: object, **kwargs: object) -> None:
        builds.append(1)
        if len(builds) == int(os.environ.get("CRASH_AT_BUILD", "1")):
            if os.environ.get("CRASH_MODE") == "stop":
                os.kill(os.getpid(), signal.SIGSTOP)
            os._exit(3)
        build(*args, **kwargs)  # type: ignore[arg-type]

    runtime._init_process_group = crash  # type: ignore[assignment]

if __name__ == "__main__":
    elastic_train.main()
