"""The worker of `elasticrun.run(func)`: `python -m elasticrun.torch.run_func`.

Fetches the cloudpickled `(func, args, kwargs)` from the driver (signed, so it reaches SSH
hosts without a shared filesystem), joins the job, runs `func(*args, **kwargs)` and sends
its pickled result back, tagged with the round and rank this worker ended in; then exits 0.
An error of `func`'s own (or a function or result that cannot be (un)pickled) is printed
with its traceback and reported to the driver, which names it as this rank's failure; the
worker exits 1. A peer's failure (WorkersFailedError outside `elastic.run`) is not
reported as this worker's: it exits 1 like any script would.
"""

from __future__ import annotations

import base64
import os
import sys
import traceback
from collections.abc import Callable
from typing import Any

import cloudpickle

from elasticrun import protocol
from elasticrun.torch.world import runtime
from elasticrun.worker.client import DriverClient, DriverUnreachableError, RequestRefusedError
from elasticrun.worker.elastic import WorkersFailedError, describe_failure

Job = tuple[Callable[..., Any], tuple[Any, ...], dict[str, Any]]


def main() -> int:
    client = DriverClient.from_env()
    worker_id = os.environ[protocol.ENV_WORKER_ID]
    reply = client.call(protocol.PATH_RUN_FUNCTION, {"worker_id": worker_id})
    try:
        # Before init(): importing what the function needs is the slow part of a start,
        # and a new worker holds the others up only from its join on.
        func, args, kwargs = _load(base64.b64decode(reply["payload"]))
    except Exception as exc:
        return _own_error(client, worker_id, f"cannot load func: {describe_failure(exc)}")
    runtime.init()
    place = runtime.current()
    try:
        result = func(*args, **kwargs)
    except (WorkersFailedError, DriverUnreachableError):
        raise
    except Exception as exc:
        return _own_error(client, worker_id, describe_failure(exc))
    if runtime.is_initialized():  # func may have shut down (and re-joined) itself
        place = runtime.current()
    try:
        data = cloudpickle.dumps(result)
    except Exception as exc:
        return _own_error(client, worker_id,
                          f"the result of func cannot be pickled: {describe_failure(exc)}")
    send_result(client, worker_id, place.round, place.slot.rank, data)
    return 0


def _load(data: bytes) -> Job:
    func, args, kwargs = cloudpickle.loads(data)
    return func, tuple(args), dict(kwargs)


def send_result(client: DriverClient, worker_id: str, round_number: int, rank: int,
                data: bytes) -> None:
    size = protocol.RESULT_PART_BYTES
    count = max(1, -(-len(data) // size))
    for part in range(count):
        client.call(protocol.PATH_RUN_RESULT, {
            "worker_id": worker_id, "round": round_number, "rank": rank, "part": part,
            "parts": count, "data": base64.b64encode(data[part * size:(part + 1) * size])
            .decode()})


def _own_error(client: DriverClient, worker_id: str, failure: str) -> int:
    """Prints the traceback first, so that the driver's report of the failure (the last
    lines of this worker's stderr) can hold it; then tells the driver."""
    traceback.print_exc()
    sys.stderr.flush()
    try:
        client.call(protocol.PATH_FAILING, {"worker_id": worker_id, "failure": failure})
    except (RequestRefusedError, DriverUnreachableError):
        pass  # it is being stopped, or the driver is gone: the exit code tells the rest
    return 1


if __name__ == "__main__":
    sys.exit(main())
