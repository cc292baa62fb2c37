"""What a worker's process is doing, as its own host sees it: the answer to "is it hung?"
that a silent worker cannot give itself.

A SIGSTOPped (or traced) process answers nothing, yet keeps its connections open; a process
in a long GC pause holds the GIL and answers nothing either, but it runs. The kernel tells
them apart (/proc/PID/stat). The driver reads it for local workers; an agent or an SSH
probe reads it on the worker's host. Stdlib only.
"""

from __future__ import annotations

import enum
import os
from dataclasses import dataclass


class ProcessState(enum.Enum):
    RUNNING = "running"  # running or sleeping: alive, whatever its threads are doing
    STOPPED = "stopped"  # SIGSTOP / SIGTSTP: it can do nothing, ever
    GONE = "gone"  # exited (its exit is reported the usual way)
    UNREACHABLE = "unreachable"  # its host did not answer the question
    UNKNOWN = "unknown"  # its launcher cannot tell


@dataclass(frozen=True)
class ProcessView:
    state: ProcessState
    detail: str = ""  # for the log line: why unreachable, the kernel's state letter

    def to_json(self) -> list[str]:
        return [self.state.value, self.detail]

    @classmethod
    def from_json(cls, data: object) -> ProcessView:
        """A view sent by an agent; anything malformed reads as unknown."""
        if isinstance(data, (list, tuple)) and len(data) == 2:
            try:
                return cls(ProcessState(data[0]), str(data[1])[:200])
            except ValueError:
                pass
        return cls(ProcessState.UNKNOWN, "malformed answer")


# A process held by a tracer ("t": a debugger at a breakpoint, py-spy dump for a moment)
# is someone's on purpose: it counts as running.
_STOPPED = {"T": "stopped (SIGSTOP)"}
_GONE = {"Z", "X", "x"}


def stat_fields(text: str) -> list[str]:
    """The fields of a /proc/PID/stat line after the command name (the state letter first);
    the name is skipped whole, since it may hold spaces and parentheses."""
    return text.rpartition(")")[2].split()


def read_process_view(pid: int) -> ProcessView:
    """The state of process `pid` on this host."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as stat:
            text = stat.read().decode(errors="replace")
    except FileNotFoundError:
        return ProcessView(ProcessState.GONE)
    except OSError as exc:
        return ProcessView(ProcessState.UNKNOWN, f"/proc/{pid}/stat: {exc.strerror}")
    letter = stat_fields(text)[:1]
    if not letter:
        return ProcessView(ProcessState.UNKNOWN, f"/proc/{pid}/stat unreadable")
    return view_of_state(letter[0])


def view_of_state(letter: str) -> ProcessView:
    """What the kernel's state letter of a process (/proc/PID/stat) means here."""
    if letter in _STOPPED:
        return ProcessView(ProcessState.STOPPED, _STOPPED[letter])
    if letter in _GONE:
        return ProcessView(ProcessState.GONE)
    return ProcessView(ProcessState.RUNNING, letter)


def thread_cpu_seconds(pid: int, tid: int) -> float | None:
    """CPU time (user + system) thread `tid` of process `pid` has used; None if unknown."""
    try:
        with open(f"/proc/{pid}/task/{tid}/stat", "rb") as stat:
            fields = stat_fields(stat.read().decode(errors="replace"))
        return (int(fields[11]) + int(fields[12])) / _CLOCK_TICKS
    except (OSError, IndexError, ValueError):
        return None


_CLOCK_TICKS = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def thread_activity(pid: int, tid: int) -> tuple[float, int] | None:
    """CPU seconds thread `tid` of process `pid` has used, and how many times it has been
    put on a CPU: a count that stands still means the thread sleeps in one wait (it may
    use no CPU yet wake often, as a loop of short sleeps does). None if unknown."""
    try:
        with open(f"/proc/{pid}/task/{tid}/schedstat", "rb") as stat:
            run_ns, _, slices = stat.read().split()[:3]
        return int(run_ns) / 1e9, int(slices)
    except (OSError, ValueError):
        return None
