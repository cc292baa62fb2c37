"""A discovery script: an executable that prints the current hosts, one per line."""

from __future__ import annotations

import asyncio
import os
import signal
from pathlib import Path

from elasticrun.discovery.base import HostSlots
from elasticrun.discovery.parsing import parse_host_lines
from elasticrun.discovery.plugins import DiscoveryOptions
from elasticrun.errors import ConfigError, DiscoveryError
from elasticrun.timed import within

MAX_OUTPUT_BYTES = 1024 * 1024


class ScriptDiscovery:
    def __init__(self, path: Path, default_slots: int, timeout: float) -> None:
        self._path = path
        self._default_slots = default_slots
        self._timeout = timeout

    def describe(self) -> str:
        return f"discovery script {self._path}"

    def check(self) -> None:
        """Fails early, with one line, when the script cannot possibly run."""
        name = f"discovery script {self._path}"
        if not self._path.exists():
            raise DiscoveryError(f"{name}: no such file")
        if self._path.is_dir():
            raise DiscoveryError(f"{name}: is a directory, expected an executable file")
        if not os.access(self._path, os.X_OK):
            raise DiscoveryError(f"{name}: not executable (try: chmod +x {self._path})")

    async def find_hosts(self) -> HostSlots:
        self.check()
        name = f"discovery script {self._path}"
        try:
            proc = await asyncio.create_subprocess_exec(
                str(self._path.resolve()),
                stdin=asyncio.subprocess.DEVNULL,
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.PIPE,
                start_new_session=True,
            )
        except OSError as exc:
            raise DiscoveryError(f"{name}: cannot run: {exc.strerror}") from None
        try:
            out, err = await within(proc.communicate(), self._timeout)
        except asyncio.TimeoutError:
            _kill_group(proc.pid)
            await proc.wait()
            raise DiscoveryError(f"{name}: no answer within {self._timeout:g}s") from None
        except BaseException:
            _kill_group(proc.pid)
            raise
        _kill_group(proc.pid)  # whatever it left behind in its group
        if proc.returncode != 0:
            last = _last_line(err)
            detail = f": {last}" if last else ""
            raise DiscoveryError(f"{name}: exited with code {proc.returncode}{detail}")
        if len(out) > MAX_OUTPUT_BYTES:
            raise DiscoveryError(f"{name}: printed more than {MAX_OUTPUT_BYTES} bytes")
        try:
            text = out.decode()
        except UnicodeDecodeError:
            raise DiscoveryError(f"{name}: printed bytes that are not UTF-8 text") from None
        return parse_host_lines(text, self._default_slots, name)


def plugin(options: DiscoveryOptions) -> ScriptDiscovery:
    """`--discovery script:PATH`."""
    if not options.arg:
        raise ConfigError("expected script:PATH")
    script = ScriptDiscovery(Path(options.arg), options.slots_per_host, options.timeout)
    script.check()
    return script


def _kill_group(pid: int) -> None:
    try:
        os.killpg(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def _last_line(data: bytes) -> str:
    lines = [line.strip() for line in data.decode(errors="replace").splitlines() if line.strip()]
    return lines[-1][:200] if lines else ""
