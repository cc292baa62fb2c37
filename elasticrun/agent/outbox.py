"""What the agent has to tell the driver, in order, kept while the driver is away.

Messages wait here until a connection sends them. While the driver is away, the oldest
worker output makes room once the kept bytes pass a bound; every other message (a worker's
exit, a failed start, a drain) is kept, since the driver needs it when it is back. Output
dropped is not dropped silently: before the next message goes out, each worker that lost
some gets a line on its stderr saying how much.
"""

from __future__ import annotations

import asyncio
from collections import deque

import aiohttp

from elasticrun.launch.agents import wire

OUTBOX_BYTES = 8 * 1024 * 1024  # output kept while the driver is away; older output is dropped


def _size(message: wire.Message) -> int:
    return len(message.data) if isinstance(message, wire.Output) else 64


class Outbox:
    def __init__(self, limit: int = OUTBOX_BYTES) -> None:
        self._messages: deque[wire.Message] = deque()
        self._bytes = 0
        self._dropped: dict[str, int] = {}  # worker -> bytes of its output dropped
        self._limit = limit
        self._wake = asyncio.Event()

    def __len__(self) -> int:
        return len(self._messages)

    def put(self, message: wire.Message) -> None:
        self._messages.append(message)
        self._bytes += _size(message)
        while self._bytes > self._limit:
            dropped = next((m for m in self._messages if isinstance(m, wire.Output)), None)
            if dropped is None:
                break
            self._messages.remove(dropped)
            self._bytes -= _size(dropped)
            lost = len(wire.output_bytes(dropped))
            self._dropped[dropped.worker] = self._dropped.get(dropped.worker, 0) + lost
        self._wake.set()

    def exited(self) -> list[str]:
        """The workers whose exits are queued (they ended while the driver was away)."""
        return [m.worker for m in self._messages if isinstance(m, wire.Exited)]

    async def send_all(self, ws: aiohttp.ClientWebSocketResponse) -> None:
        """Sends what is queued, and what comes, until cancelled or the send fails; a
        message leaves the box only once sent."""
        while True:
            self._note_dropped()
            while self._messages:
                message = self._messages[0]
                await ws.send_str(wire.encode(message))
                self._messages.popleft()
                self._bytes -= _size(message)
            self._wake.clear()
            await self._wake.wait()

    def _note_dropped(self) -> None:
        """Puts a line for each worker whose output was dropped ahead of what is left."""
        for worker, lost in sorted(self._dropped.items(), reverse=True):
            note = (f"elasticrun agent: {lost} bytes of this worker's output were dropped "
                    f"while the driver was away (more than {self._limit} bytes waited)\n")
            message = wire.output_chunk(worker, "stderr", note.encode())
            self._messages.appendleft(message)
            self._bytes += _size(message)
        self._dropped.clear()

    async def flushed(self) -> None:
        while self._messages:
            await asyncio.sleep(0.01)
