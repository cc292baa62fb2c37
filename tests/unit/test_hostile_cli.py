"""Hostile command lines: any value of any flag ends in a job config or one error line."""

from __future__ import annotations

import contextlib
import io
from unittest import mock

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from elasticrun.cli import entry, horovodrun, job

VALUED_FLAGS = ["-np", "--min-np", "--max-np", "-H", "--discovery-interval",
                "--discovery-timeout", "--slots-per-host", "--start-timeout",
                "--elastic-timeout", "--reset-limit", "--collective-timeout",
                "--driver-timeout", "--ssh-port", "--port", "--bind", "--discovery",
                "--event-webhook", "--log-level", "--network-interface", "--shard-size"]
VALUES = st.one_of(
    st.text(max_size=30),
    st.sampled_from(["0", "-1", "1e400", "nan", "inf", "-0", "99999999999999999999", "",
                     " ", "1.5", "0x10", "localhost:", ":4", "a:b:c", "[::1]:x", "\x00"]),
)


class Started(Exception):
    """The command line was accepted: the job would start now."""


def run_main(args: list[str]) -> tuple[int | None, str]:
    """main(args) with the driver replaced: (exit code or None if accepted, stderr)."""
    raw = io.BytesIO()
    stderr = io.TextIOWrapper(raw, encoding="utf-8", errors="replace")
    with mock.patch.object(job, "OutputRouter", side_effect=Started), \
            mock.patch.object(horovodrun, "setup_logging"), contextlib.redirect_stderr(stderr):
        try:
            entry.main(args)
            code: int | None = 0
        except Started:
            code = None
        except SystemExit as exc:
            code = int(exc.code or 0)
    stderr.flush()
    return code, raw.getvalue().decode("utf-8", "replace")


@settings(max_examples=300, deadline=None)
@given(flag=st.sampled_from(VALUED_FLAGS), value=VALUES)
def test_any_flag_value_is_accepted_or_refused_in_one_line(flag: str, value: str) -> None:
    code, err = run_main(["-np", "2", flag, value, "python", "train.py"])
    if code is None:
        return
    assert code == 2, (flag, value, code, err)
    lines = err.splitlines()
    assert len(lines) == 1 and lines[0].startswith("elasticrun: error: "), (flag, value, err)
    assert "Traceback" not in err


@pytest.mark.parametrize("args", [
    ["-np"], ["--port", "65536", "x"], ["--bind", "1.2.3", "x"], ["-np", "2"],
    ["--no-such-flag", "x"], ["-np", "2", "--discovery", "", "x"],
])
def test_known_bad_command_lines(args: list[str]) -> None:
    code, err = run_main(args)
    assert code == 2 and len(err.splitlines()) == 1, (args, code, err)
