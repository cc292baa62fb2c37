"""The agent's outbox while the driver is away: bounded output, exits always kept, and
dropped output said, not silent."""

from __future__ import annotations

import asyncio
import contextlib

from elasticrun.agent.outbox import Outbox
from elasticrun.launch.agents import wire


class Sent:
    """Stands in for the WebSocket: what was sent, decoded."""

    def __init__(self) -> None:
        self.messages: list[wire.Message] = []

    async def send_str(self, text: str) -> None:
        self.messages.append(wire.decode(text))


async def drain(box: Outbox) -> list[wire.Message]:
    sent = Sent()
    task = asyncio.get_running_loop().create_task(box.send_all(sent))  # type: ignore[arg-type]
    await box.flushed()
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task
    return sent.messages


async def test_dropped_output_is_said_on_the_workers_stderr_before_the_rest() -> None:
    box = Outbox(limit=300)
    for index in range(6):  # 6 x 60 bytes (80 as base64) and an exit (64): 4 do not fit
        box.put(wire.output_chunk("w1", "stdout", bytes([65 + index]) * 60))
    box.put(wire.Exited("w1", 0))
    messages = await drain(box)
    first = messages[0]
    assert isinstance(first, wire.Output) and first.stream == "stderr"
    note = wire.output_bytes(first).decode()
    assert note.startswith("elasticrun agent: 240 bytes of this worker's output were dropped")
    kept = [wire.output_bytes(m)[:1] for m in messages[1:] if isinstance(m, wire.Output)]
    assert kept == [b"E", b"F"]  # the newest output, in order
    assert isinstance(messages[-1], wire.Exited)  # an exit is never dropped


async def test_nothing_dropped_nothing_said() -> None:
    box = Outbox(limit=10_000)
    box.put(wire.output_chunk("w1", "stdout", b"hello\n"))
    messages = await drain(box)
    assert len(messages) == 1 and wire.output_bytes(messages[0]) == b"hello\n"  # type: ignore[arg-type]
