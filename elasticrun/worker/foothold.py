"""elasticrun's foothold in a worker: what runs beside a script that never calls er.init().

A worker forked from a template (worker/template.py) starts the foothold before its script.
A torchrun-style script (its own DDP loop, a Hugging Face or Lightning Trainer) never talks
to the driver, and its collectives are torch's, out of elasticrun's sight; the foothold
speaks for it:
- Hangs. A thread watches the training (main) thread. Asleep in one wait for a while
  (in a collective, waiting for a stopped or unreachable peer; or just slow I/O), it
  reports a stall of the worker's round, as elasticrun's own collectives do, and it answers
  the driver's probes of that round. The driver then asks the hosts what the members' processes are
  doing (driver/rounds/liveness.py): a stopped one, or one whose host does not answer, is
  hung, and the round restarts in seconds; a slow one (a long checkpoint, a GC pause)
  never is. Only a few members report at once (worker/liveness.py: the designated ones).
- The root cause. An uncaught exception is told to the driver before the worker exits,
  with what torchrun's @record wrote to TORCHELASTIC_ERROR_FILE (else the exception's
  line), so the job's failure names it.
- Its pace (stragglers): the time its DDP models' reducers waited for their peers
  (worker/ddp_pace.py), reported as elasticrun's own collectives report theirs.
- A torch 2.13 deadlock at exit (worker/gloo_teardown.py): destroy_process_group gives
  Gloo's threads a moment first.
- Its network. Gloo takes the interface of the host's name unless GLOO_SOCKET_IFNAME says
  otherwise, loopback on many machines; the interface that reaches the driver reaches the
  worker's peers (as er.init() decides for scripts that call it).
A script that calls er.init() retires the foothold: its own collectives report from then on.
"""

from __future__ import annotations

import json
import logging
import os
import threading
import time
from pathlib import Path
from typing import Any

from elasticrun import protocol
from elasticrun.system.netif import interface_towards
from elasticrun.system.process_view import thread_activity
from elasticrun.worker import gloo_teardown, pace
from elasticrun.worker.client import DriverClient, DriverUnreachableError, RequestRefusedError
from elasticrun.worker.ddp_pace import DdpPace
from elasticrun.worker.liveness import LATE_FACTOR, REPORTERS, STALL_REPEAT_S, StallReporter
from elasticrun.worker.notices import NoticeWatcher
from elasticrun.worker.pace import PaceMeter, PaceReporter

log = logging.getLogger("elasticrun.worker")

IDLE_S = 1.0  # the training thread asleep in one wait this long: a designated member reports
SAMPLE_S = 0.2  # how often it is looked at
REPORT_TIMEOUT_S = 2.0  # the failure report at exit waits for the driver this long at most
ERROR_FILE = "TORCHELASTIC_ERROR_FILE"
TEMPORARY = Path("/tmp")  # error files there are the worker's to remove (no --log-dir)

_current: Foothold | None = None


class Foothold:
    def __init__(self, client: DriverClient, worker_id: str, round_number: int, rank: int,
                 size: int, hang_detection: bool) -> None:
        self._client = client
        self._worker_id = worker_id
        self._round = round_number
        self._designated = rank % max(1, size // REPORTERS) == 0
        self._hang_detection = hang_detection
        self._retired = threading.Event()
        # The thread that runs the script: the one starting the foothold. (In a forked
        # child, threading.main_thread().native_id is still the template's.)
        self._thread = threading.get_native_id()
        self._idle_since = time.monotonic()
        self._notices: NoticeWatcher | None = None
        self._ddp_pace: DdpPace | None = None  # stragglers: its DDP models' pace
        self._pace: PaceReporter | None = None

    def start(self) -> None:
        path = os.environ.get(ERROR_FILE)
        if path:
            Path(path).parent.mkdir(parents=True, exist_ok=True)
        if pace.measuring():
            meter = PaceMeter()
            self._ddp_pace = DdpPace(meter)
            self._ddp_pace.install()
            self._pace = PaceReporter(meter, self._client, self._worker_id,
                                      lambda: self._round, sampled=True)
            self._pace.start()
        if not self._hang_detection or thread_activity(os.getpid(), self._thread) is None:
            return
        self._notices = NoticeWatcher(self._client, lambda: self._round, lambda _: None,
                                      self._driver_lost, self._worker_id, self._liveness)
        self._notices.start()
        threading.Thread(target=self._watch, name="elasticrun-foothold", daemon=True).start()

    def retire(self) -> None:
        """The script called er.init(): the driver hears so at once (no restart mode for
        this job), and elasticrun's own collectives report from now on."""
        if self._retired.is_set():
            return
        self._retired.set()
        gloo_teardown.restore()
        if self._pace is not None and self._ddp_pace is not None:
            self._pace.stop()
            self._ddp_pace.uninstall()
        if self._notices is not None:
            self._notices.stop()
        client = self._client.bounded(REPORT_TIMEOUT_S)
        try:
            client.call(protocol.PATH_INIT, {"worker_id": self._worker_id})
        except (DriverUnreachableError, RequestRefusedError) as exc:
            log.debug("the driver did not take the er.init() notice: %s", exc)
        finally:
            client.close()

    def failed(self, exc: BaseException) -> None:
        """The script ends with `exc`: the driver hears its root cause (bounded)."""
        if self._retired.is_set():
            return  # er's elastic loop told the driver already
        failure = root_cause(exc, os.environ.get(ERROR_FILE))
        client = self._client.bounded(REPORT_TIMEOUT_S)
        try:
            client.call(protocol.PATH_FAILING, {"worker_id": self._worker_id,
                                                "failure": failure})
        except (DriverUnreachableError, RequestRefusedError) as exc_:
            log.debug("the driver did not take the failure report: %s", exc_)
        finally:
            client.close()

    def _liveness(self) -> dict[str, Any]:
        """A probe's answer: its collectives cannot be seen, so it says it waits in one
        (never "stuck": a script's own idle time is not a hang)."""
        activity = thread_activity(os.getpid(), self._thread)
        return {"in_collective": True, "since_s": time.monotonic() - self._idle_since,
                "cpu_s": activity[0] if activity is not None else None}

    def _watch(self) -> None:
        pid, reporter = os.getpid(), StallReporter(self._client, self._worker_id)
        bound = IDLE_S if self._designated else LATE_FACTOR * IDLE_S
        last = thread_activity(pid, self._thread)
        reported = 0.0
        while not self._retired.wait(SAMPLE_S):
            activity, now = thread_activity(pid, self._thread), time.monotonic()
            if activity is None:
                return  # the training thread is gone: the process is ending
            if last is None or activity[1] != last[1]:
                last, self._idle_since = activity, now
                continue
            idle = now - self._idle_since
            if idle >= bound and now - reported >= STALL_REPEAT_S and (
                    self._designated or not self._probed()):
                reporter.stalled(self._round, idle)
                reported = now

    def _probed(self) -> bool:
        return self._notices is not None and self._notices.probed(self._round,
                                                                  self._idle_since)

    def _driver_lost(self, reason: str) -> None:
        log.debug("the foothold stops reporting: %s", reason)


def root_cause(exc: BaseException, error_file: str | None) -> str:
    """What torchrun's @record wrote for `exc` (its message), else the exception's line.
    An error file in the temporary directory is removed once read."""
    line = f"{type(exc).__name__}: {exc}"
    if not error_file:
        return line
    path = Path(error_file)
    try:
        data = json.loads(path.read_text())
        message = data["message"]["message"] if isinstance(data["message"], dict) \
            else data["message"]
        line = str(message) or line
    except (OSError, ValueError, KeyError, TypeError):
        return line
    if path.parent == TEMPORARY:
        path.unlink(missing_ok=True)
    return line


def start_from_env() -> None:
    """Starts the foothold of a worker the driver launched (no-op for any other process)."""
    global _current
    env = os.environ
    if protocol.ENV_WORKER_ID not in env or protocol.ENV_RENDEZVOUS_ADDR not in env:
        return
    gloo_teardown.settle_before_destroy()
    if "GLOO_SOCKET_IFNAME" not in env:
        interface = interface_towards(env[protocol.ENV_RENDEZVOUS_ADDR],
                                      int(env.get(protocol.ENV_RENDEZVOUS_PORT, "0")))
        if interface:
            os.environ["GLOO_SOCKET_IFNAME"] = interface
    client = DriverClient.from_env()
    _current = Foothold(client, env[protocol.ENV_WORKER_ID],
                        int(env.get(protocol.ENV_ROUND, "0")), int(env.get("RANK", "0")),
                        int(env.get("WORLD_SIZE", "1")),
                        env.get(protocol.ENV_HANG_DETECTION, "1") != "0")
    _current.start()


def retire() -> None:
    if _current is not None:
        _current.retire()


def failed(exc: BaseException) -> None:
    if _current is not None:
        _current.failed(exc)
