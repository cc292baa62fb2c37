"""Signal handlers on the event loop give back what was there before (a shell's background
job ignores SIGINT; elasticrun.run must not change its caller's handlers)."""

from __future__ import annotations

import asyncio
import os
import signal

from elasticrun.system.loop_signals import handling


async def test_a_signal_calls_its_callback_and_the_previous_handlers_come_back() -> None:
    def mine(signum: int, frame: object) -> None:
        raise AssertionError("the previous handler ran inside")

    before = signal.signal(signal.SIGINT, signal.SIG_IGN), signal.signal(signal.SIGTERM, mine)
    try:
        heard: list[str] = []
        loop = asyncio.get_running_loop()
        with handling(loop, {signal.SIGINT: (heard.append, ("int",)),
                             signal.SIGTERM: (heard.append, ("term",))}):
            os.kill(os.getpid(), signal.SIGTERM)
            for _ in range(100):
                if heard:
                    break
                await asyncio.sleep(0.01)
        assert heard == ["term"]
        assert signal.getsignal(signal.SIGINT) is signal.SIG_IGN
        assert signal.getsignal(signal.SIGTERM) is mine
    finally:
        signal.signal(signal.SIGINT, before[0])
        signal.signal(signal.SIGTERM, before[1])
