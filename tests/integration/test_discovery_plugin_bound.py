"""A discovery plugin that never answers cannot hold a job: its first call fails the start
with one line, --discovery-timeout (plus a few seconds) after it began."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

PLUGIN = '''
import asyncio

class Hanging:
    async def find_hosts(self):
        await asyncio.Event().wait()

    def describe(self):
        return "hanging inventory"

def make(options):
    return Hanging()
'''


def test_a_hanging_plugin_fails_the_start_in_one_line(tmp_path: Path) -> None:
    package = tmp_path / "hangplug"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "inventory.py").write_text(PLUGIN)
    env = {**os.environ, "PYTHONPATH": str(tmp_path)}
    started = time.monotonic()
    done = subprocess.run(
        [sys.executable, "-m", "elasticrun", "--discovery", "hangplug.inventory:make",
         "--discovery-timeout", "1", "-np", "1", sys.executable, "-c", "pass"],
        capture_output=True, text=True, env=env, timeout=60, cwd=tmp_path)
    took = time.monotonic() - started
    assert done.returncode == 2, done.stderr
    lines = done.stderr.strip().splitlines()
    assert lines == ["elasticrun: error: hanging inventory did not answer within 6s"], lines
    assert took < 30
