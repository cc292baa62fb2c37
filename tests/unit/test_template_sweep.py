"""An SSH host's template killed outright leaves its directory; the next template there
removes the directories of this user's templates that are gone, and no other."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from elasticrun.worker.host_template import PREFIX, sweep


def _gone_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def test_sweep_removes_the_directories_of_templates_that_are_gone(tmp_path: Path) -> None:
    gone = tmp_path / f"{PREFIX}{_gone_pid()}-abc123"
    running = tmp_path / f"{PREFIX}{os.getpid()}-def456"
    unnamed = tmp_path / f"{PREFIX}xyz789"  # an older template's: no pid in its name
    other = tmp_path / "something-else-1"
    for directory in (gone, running, unnamed, other):
        directory.mkdir()
        (directory / "template.sock").write_text("")
    assert sweep(str(tmp_path)) == [str(gone)]
    assert not gone.exists()
    assert running.exists() and unnamed.exists() and other.exists()
