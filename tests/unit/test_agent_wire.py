"""The agent channel's messages: every one round-trips; bad ones are refused with a reason;
a worker's sealed environment opens only with the same token and for the same worker."""

from __future__ import annotations

import json

import pytest

from elasticrun.launch.agents import wire

TOKEN = "agent-token-0123456789abcdef"

EXAMPLES: list[wire.Message] = [
    wire.Hello("node-1", 4, "a1b2", ("w1", "w2"), draining=True),
    wire.Hello("fe80::1", 1, "x"),
    wire.Welcome("job1", ("w9",)),
    wire.Refused("host node-1 already has an agent"),
    wire.Start("w1", ("python", "train.py"), "/work", wire.seal(TOKEN, "w1", {"A": "1"})),
    wire.Started("w1", 1234),
    wire.StartFailed("w1", "cannot start 'x': command not found"),
    wire.output_chunk("w1", "stderr", b"\x00\xffbytes\n"),
    wire.output_chunk("w1", "stdout", b""),
    wire.Exited("w1", -9),
    wire.Stop("w1", 5.0),
    wire.Drain(),
    wire.Bye(),
    wire.End(1),
]


@pytest.mark.parametrize("message", EXAMPLES, ids=lambda m: m.TYPE)
def test_every_message_round_trips(message: wire.Message) -> None:
    assert wire.decode(wire.encode(message)) == message


def test_output_carries_bytes_and_end_of_stream() -> None:
    chunk = wire.decode(wire.encode(wire.output_chunk("w", "stdout", b"\xfe\n")))
    assert isinstance(chunk, wire.Output)
    assert wire.output_bytes(chunk) == b"\xfe\n" and not chunk.eof
    end = wire.output_chunk("w", "stdout", b"")
    assert end.eof and wire.output_bytes(end) == b""


@pytest.mark.parametrize(("body", "reason"), [
    ("not json", "not JSON"),
    ("[1]", "not a JSON object"),
    ('{"type": "launch"}', "unknown message type 'launch'"),
    ('{"type": "hello", "host": "h", "slots": 1}', "hello: missing 'agent'"),
    ('{"type": "hello", "host": "h", "slots": "4", "agent": "a"}', "'slots' must be int"),
    ('{"type": "hello", "host": "h", "slots": true, "agent": "a"}', "'slots' must be int"),
    ('{"type": "hello", "host": "bad host", "slots": 1, "agent": "a"}', "not a valid host"),
    ('{"type": "hello", "host": "h", "slots": 0, "agent": "a"}', "at least 1"),
    ('{"type": "hello", "host": "h", "slots": 99999, "agent": "a"}', "at most 4096"),
    ('{"type": "start", "worker": "w", "command": [], "cwd": "/", "env": ""}',
     "empty 'command'"),
    ('{"type": "start", "worker": "w", "command": [1], "cwd": "/", "env": ""}',
     "'command' must be tuple[str, ...]"),
    ('{"type": "stop", "worker": "w", "grace": -1}', "'grace' must be 0..3600"),
    ('{"type": "exited", "worker": "", "code": 0}', "'worker' must be 1..200"),
    ('{"type": "output", "worker": "w", "stream": "stdin", "data": ""}', "'stream' must be"),
])
def test_bad_messages_are_refused_with_a_reason(body: str, reason: str) -> None:
    with pytest.raises(wire.BadMessage) as info:
        wire.decode(body)
    assert reason in str(info.value)


def test_a_message_too_large_is_refused_before_parsing() -> None:
    with pytest.raises(wire.BadMessage, match="too large"):
        wire.decode(" " * (wire.MAX_MESSAGE_BYTES + 1))


def test_output_that_is_not_base64_is_refused() -> None:
    with pytest.raises(wire.BadMessage, match="not base64"):
        wire.output_bytes(wire.Output("w", "stdout", "%%%"))


def test_the_sealed_environment_opens_only_with_its_token_and_worker() -> None:
    env = {"ELASTICRUN_SECRET": "s3cret", "RANK": "3"}
    sealed = wire.seal(TOKEN, "w1", env)
    assert "s3cret" not in sealed and "RANK" not in sealed
    assert wire.unseal(TOKEN, "w1", sealed) == env
    with pytest.raises(wire.BadMessage, match="not sealed with this agent's token"):
        wire.unseal("another-token-0123456789", "w1", sealed)
    with pytest.raises(wire.BadMessage, match="not sealed with this agent's token"):
        wire.unseal(TOKEN, "w2", sealed)  # bound to its worker: not replayable for another
    with pytest.raises(wire.BadMessage):
        wire.unseal(TOKEN, "w1", "not base64!")


def test_two_seals_of_the_same_environment_differ() -> None:
    assert wire.seal(TOKEN, "w", {"A": "1"}) != wire.seal(TOKEN, "w", {"A": "1"})


def test_encoding_is_plain_json_with_a_type() -> None:
    body = json.loads(wire.encode(wire.Stop("w1", 2.5)))
    assert body == {"type": "stop", "worker": "w1", "grace": 2.5}
