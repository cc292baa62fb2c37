"""What a test may change in the pytest process and must give back: signal handlers and the
signal wakeup fd, the environment, the working directory, the umask, the asyncio event loop
policy, logging handlers and levels, exception hooks and torch's default process group.

`snapshot()` before a test and `restore(before)` after it: restore puts back whatever the
test left changed and returns a line per change, so the guard in conftest.py can fail the
test that leaked it (the next test then starts clean, whatever the order). A lost Ctrl-C
once came from exactly such a leak: a SIGINT handler an earlier test left installed.
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import sys
import threading
from dataclasses import dataclass
from typing import Any

SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT, signal.SIGCHLD,
           signal.SIGPIPE, signal.SIGUSR1, signal.SIGUSR2)
LOGGERS = ("", "elasticrun", "asyncio", "aiohttp", "paramiko")
# Set by others, not by tests: pytest at every phase of a test; torch once, at its first use
# of a compiled kernel (whichever test comes first).
IGNORED_ENV = ("PYTEST_CURRENT_TEST", "TORCHINDUCTOR_CACHE_DIR")


@dataclass
class LoggerState:
    handlers: list[logging.Handler]
    level: int
    propagate: bool
    disabled: bool


@dataclass
class ProcessState:
    handlers: dict[signal.Signals, Any]
    wakeup_fd: int
    env: dict[str, str]
    cwd: str
    umask: int
    policy: asyncio.AbstractEventLoopPolicy
    loggers: dict[str, LoggerState]
    excepthooks: tuple[Any, Any]
    process_group: bool


def _main_thread() -> bool:
    return threading.current_thread() is threading.main_thread()


def _own_handlers(logger: logging.Logger) -> list[logging.Handler]:
    """The logger's handlers, less pytest's own (it swaps them at every test phase)."""
    return [h for h in logger.handlers if not type(h).__module__.startswith("_pytest")]


def _logger_state(name: str) -> LoggerState:
    logger = logging.getLogger(name)
    return LoggerState(_own_handlers(logger), logger.level, logger.propagate, logger.disabled)


def _wakeup_fd() -> int:
    if not _main_thread():
        return -1
    fd = signal.set_wakeup_fd(-1)
    signal.set_wakeup_fd(fd)
    return fd


def _process_group_initialized() -> bool:
    dist = sys.modules.get("torch.distributed")
    return bool(dist is not None and dist.is_available() and dist.is_initialized())


def snapshot() -> ProcessState:
    umask = os.umask(0)
    os.umask(umask)
    return ProcessState(
        handlers={sig: signal.getsignal(sig) for sig in SIGNALS},
        wakeup_fd=_wakeup_fd(),
        env={k: v for k, v in os.environ.items() if k not in IGNORED_ENV},
        cwd=os.getcwd(), umask=umask,
        policy=asyncio.get_event_loop_policy(),
        loggers={name: _logger_state(name) for name in LOGGERS},
        excepthooks=(sys.excepthook, threading.excepthook),
        process_group=_process_group_initialized())


def _name(handler: Any) -> str:
    return getattr(handler, "__qualname__", None) or repr(handler)


def restore(before: ProcessState) -> list[str]:
    """Puts back what differs from `before`; one line per thing that differed."""
    changed: list[str] = []
    now = snapshot()
    for sig, handler in before.handlers.items():
        if now.handlers[sig] is not handler and now.handlers[sig] != handler:
            changed.append(f"the {sig.name} handler was left as {_name(now.handlers[sig])} "
                           f"(was {_name(handler)})")
            if _main_thread() and handler is not None:
                signal.signal(sig, handler)
    if now.wakeup_fd != before.wakeup_fd:
        changed.append(f"the signal wakeup fd was left as {now.wakeup_fd} "
                       f"(was {before.wakeup_fd})")
        if _main_thread():
            signal.set_wakeup_fd(before.wakeup_fd)
    if now.env != before.env:
        keys = sorted(k for k in before.env.keys() | now.env.keys()
                      if before.env.get(k) != now.env.get(k))
        changed.append(f"environment variables were left changed: {', '.join(keys)}")
        for key in keys:
            if key in before.env:
                os.environ[key] = before.env[key]
            else:
                del os.environ[key]
    if now.cwd != before.cwd:
        changed.append(f"the working directory was left as {now.cwd} (was {before.cwd})")
        os.chdir(before.cwd)
    if now.umask != before.umask:
        changed.append(f"the umask was left as {now.umask:o} (was {before.umask:o})")
        os.umask(before.umask)
    if now.policy is not before.policy:
        changed.append(f"the asyncio event loop policy was left as {type(now.policy).__name__}")
        asyncio.set_event_loop_policy(before.policy)
    for name, state in before.loggers.items():
        if now.loggers[name] != state:
            changed.append(f"logger {name or 'root'!r} was left changed "
                           f"(handlers, level, propagate or disabled)")
            logger = logging.getLogger(name)
            for handler in _own_handlers(logger):
                logger.removeHandler(handler)
            for handler in state.handlers:
                logger.addHandler(handler)
            logger.setLevel(state.level)
            logger.propagate, logger.disabled = state.propagate, state.disabled
    if (sys.excepthook, threading.excepthook) != before.excepthooks:
        changed.append("sys.excepthook or threading.excepthook was left replaced")
        sys.excepthook, threading.excepthook = before.excepthooks
    if now.process_group and not before.process_group:
        changed.append("torch's default process group was left initialised")
        import torch.distributed as dist

        dist.destroy_process_group()
    return changed
