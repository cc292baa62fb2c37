"""The job's Timeline, driver side: one trace file, a lane for the driver and one per worker.

The driver writes the file (workers may be on other hosts): it is opened at the start with
`--timeline-filename`, or when a worker's script first calls `start_timeline(path)`, and
closed when the job ends. A job writes one timeline: another path while it is open is
refused. Workers send their events (worker/timeline.py); each worker process gets a lane
(`pid`), named by its rank when it first sends, its host and its worker id. The driver's
own lane shows what it decided, as it carries out the round machine's actions: rounds
opened and formed, host changes and notices, worker failures, spawns and stops, the end.
"""

from __future__ import annotations

import logging
import socket
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from elasticrun import protocol
from elasticrun.driver.operate.trace_file import (
    Event,
    TraceFile,
    complete,
    from_worker,
    instant,
    metadata,
)
from elasticrun.driver.rounds import events as ev
from elasticrun.job.errors import ConfigError

log = logging.getLogger("elasticrun.timeline")

DRIVER_PID = 1
ROUNDS_TID, EVENTS_TID, WORKER_NOTES_TID = 1, 2, 3
MAX_LANES = 100_000
# The driver's events are kept until a file is opened (by a script's start_timeline).
EARLY_EVENTS = 1000


class TimelineConflict(Exception):
    """A worker asked for a timeline at another path than the one being written."""


@dataclass
class _Lane:
    pid: int
    named: bool = False


class JobTimeline:
    def __init__(self, path: Path | None = None, mark_cycles: bool = False, *,
                 clock: Callable[[], float] = time.time, host: str | None = None) -> None:
        self._configured = path
        self._mark_cycles = mark_cycles
        self._clock = clock
        self._host = host if host is not None else socket.gethostname()
        self._file: TraceFile | None = None
        self._lanes: dict[str, _Lane] = {}
        self._early: deque[Event] = deque(maxlen=EARLY_EVENTS)
        self._round_opened: dict[int, tuple[float, int]] = {}
        self.requests = 0  # worker requests taken (none when no worker records)

    @property
    def recording(self) -> bool:
        return self._file is not None and not self._file.closed

    @property
    def path(self) -> Path | None:
        return self._file.path if self._file is not None else None

    def start(self) -> None:
        """Opens the file of --timeline-filename, if given (ConfigError when it cannot)."""
        if self._configured is None:
            return
        try:
            self._open(self._configured)
        except OSError as exc:
            raise ConfigError(f"--timeline-filename {self._configured}: cannot write: "
                              f"{exc.strerror or exc}") from None
        log.info("timeline: writing %s", self._file.path if self._file else "")

    def worker_env(self) -> dict[str, str]:
        """What tells workers to record from init() on."""
        if self._configured is None:
            return {}
        env = {protocol.ENV_TIMELINE: "1"}
        if self._mark_cycles:
            env[protocol.ENV_TIMELINE_MARK_CYCLES] = "1"
        return env

    def open(self, path: str) -> None:
        """A worker's start_timeline(path): opens the file, or nothing if it is the one
        being written. TimelineConflict for another path; OSError if it cannot be written."""
        wanted = Path(path).absolute()
        if self._file is not None:
            if self._file.path == wanted:
                return
            raise TimelineConflict(
                f"the job's timeline is already being written to {self._file.path}; a job "
                f"writes one timeline, closed when the job ends")
        self._open(wanted)
        log.info("timeline: writing %s (asked by a worker)", wanted)

    def close(self) -> None:
        if self._file is not None:
            self._file.close()

    # --- workers ---------------------------------------------------------------------------
    def add(self, worker_id: str, rank: int, host: str, raw: list[Any], dropped: int = 0) -> int:
        """A worker's batch of events; how many were written (none while no file is open).
        ValueError (one line) for a malformed event: then nothing of the batch is written."""
        self.requests += 1
        if not self.recording:
            return 0
        lane = self._lanes.get(worker_id)
        pid = lane.pid if lane is not None else DRIVER_PID + 1 + len(self._lanes)
        events = [from_worker(item, pid) for item in raw]
        if lane is None:
            if len(self._lanes) >= MAX_LANES:
                return 0
            lane = self._lanes[worker_id] = _Lane(pid)
        head: list[Event] = []
        if not lane.named and rank >= 0:
            lane.named = True
            name = f"rank {rank} · {host} · worker {short_id(worker_id)}"
            # Ordered by rank (the driver's lane first); the viewer breaks ties by pid.
            head += [metadata(pid, "process_name", {"name": name}),
                     metadata(pid, "process_sort_index", {"sort_index": rank + 1})]
        if dropped > 0:
            head.append(instant(pid, WORKER_NOTES_TID, f"{dropped} events lost", "timeline",
                                self._clock(), {"dropped": dropped}))
        assert self._file is not None
        self._file.write(head + events)
        return len(events)

    # --- the driver's lane -----------------------------------------------------------------
    def action(self, action: ev.Action) -> None:
        """Records what the driver is about to carry out, if it is worth a mark."""
        events = self.driver_events(action, self._clock())
        if not events:
            return
        if self.recording:
            assert self._file is not None
            self._file.write(events)
        else:
            self._early.extend(events)

    def driver_events(self, action: ev.Action, now: float) -> list[Event]:
        def mark(name: str, category: str = "elastic", scope: str = "t",
                 **args: Any) -> list[Event]:
            return [instant(DRIVER_PID, EVENTS_TID, name, category, now, args, scope)]

        if isinstance(action, ev.OpenRound):
            size = len(action.assignment)
            self._round_opened[action.number] = (now, size)
            return mark(f"round {action.number} opened", "round", round=action.number,
                        size=size, new_workers=action.new_workers)
        if isinstance(action, ev.BreakRound):
            return mark(f"round {action.number} broken", "round", round=action.number)
        if isinstance(action, ev.PostNotice):
            return mark(f"notice: hosts {action.update.name}", seq=action.seq)
        if isinstance(action, ev.RecordFailure):
            return mark("worker failed", scope="p", worker=action.worker, host=action.host,
                        rank=action.rank, kind=action.kind, exit_code=action.exit_code,
                        cause=action.cause)
        if isinstance(action, ev.Spawn):
            return mark("spawn standby" if action.standby else "spawn", worker=action.worker,
                        host=action.slot.host)
        if isinstance(action, ev.StopWorkers):
            return mark("stop workers", workers=", ".join(action.workers))
        if isinstance(action, ev.Finish):
            return mark("job finished", code=action.code)
        if isinstance(action, ev.Fail):
            return mark("job failed", scope="p", message=action.message)
        if isinstance(action, ev.Report):
            return self._report_events(action, now, mark)
        return []

    def _report_events(self, report: ev.Report, now: float,
                       mark: Callable[..., list[Event]]) -> list[Event]:
        fields = report.fields
        if report.name == "round_completed":
            number = int(fields["number"])
            opened, size = self._round_opened.pop(number, (now, 0))
            return [complete(DRIVER_PID, ROUNDS_TID, f"round {number} rendezvous", "round",
                             opened, now, {"round": number, "size": size}),
                    *mark(f"round {number} formed", "round", round=number, size=size)]
        if report.name == "hosts_changed":
            old, new = dict(fields["old"]), dict(fields["new"])
            added = [f"{host}:{slots}" for host, slots in new.items() if old.get(host) != slots]
            removed = [host for host in old if host not in new]
            return mark("hosts changed", added=",".join(added), removed=",".join(removed))
        if report.name == "straggler":
            return mark(f"straggler: rank {fields.get('rank')} ({fields.get('action')})",
                        host=fields.get("host"), slowdown=fields.get("slowdown"),
                        reason=fields.get("reason"))
        if report.name == "straggler_cleared":
            return mark(f"straggler cleared: rank {fields.get('rank')}",
                        host=fields.get("host"), slowdown=fields.get("slowdown"))
        if report.name == "host_blacklisted":
            return mark("host blacklisted", host=fields.get("host"),
                        cooldown_s=fields.get("cooldown_s"), cause=fields.get("cause"))
        if report.name in ("host_drained", "host_restored"):
            return mark(report.name.replace("_", " "), host=fields.get("host"))
        if report.name == "slot_blacklisted":
            return mark("slot blacklisted", host=fields.get("host"), slot=fields.get("slot"),
                        cooldown_s=fields.get("cooldown_s"), cause=fields.get("cause"))
        return []

    # --- the file --------------------------------------------------------------------------
    def _open(self, path: Path) -> None:
        self._file = TraceFile(path.absolute())
        lane = [metadata(DRIVER_PID, "process_name", {"name": f"driver · {self._host}"}),
                metadata(DRIVER_PID, "process_sort_index", {"sort_index": 0}),
                metadata(DRIVER_PID, "thread_name", {"name": "rounds"}, ROUNDS_TID),
                metadata(DRIVER_PID, "thread_name", {"name": "job events"}, EVENTS_TID)]
        self._file.write([*lane, *self._early])
        self._early.clear()


def short_id(worker_id: str) -> str:
    """`w7` for the driver's worker ids (`host/slot/7-1a2b3c4d`), else the id itself."""
    serial = worker_id.rsplit("/", 1)[-1].split("-", 1)[0]
    return f"w{serial}" if serial.isdigit() and "/" in worker_id else worker_id[:60]
