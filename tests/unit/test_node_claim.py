"""A launcher's place among torchrun's nodes on one machine (node_claim.py): the lowest
place no live launcher holds, its name in the job, held by a real lock that the kernel
releases when the holder ends, however it ends."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest

from elasticrun.cli.node_claim import claim_place, node_name, places_directory
from elasticrun.discovery.parsing import check_host


@pytest.mark.parametrize(("base", "index", "name"), [
    ("vm", 0, "vm"), ("vm", 1, "vm_1"), ("10.0.0.5", 2, "10.0.0.5_2"), ("::1", 1, "__1_1")])
def test_node_names(base: str, index: int, name: str) -> None:
    assert node_name(base, index) == name
    assert check_host(name) == name


def test_places_are_per_job_endpoint_and_name() -> None:
    one = places_directory("job", "h:1", "vm")
    assert one == places_directory("job", "h:1", "vm")
    assert len({one, places_directory("job2", "h:1", "vm"), places_directory("job", "h:2", "vm"),
                places_directory("job", "h:1", "vm2")}) == 4


def test_each_launcher_takes_the_lowest_free_place(tmp_path: Path) -> None:
    first, second = claim_place(tmp_path, "vm"), claim_place(tmp_path, "vm")
    assert (first.name, second.name) == ("vm", "vm_1")
    first.close()  # that launcher ended: the next one started takes its place
    again = claim_place(tmp_path, "vm")
    assert again.index == 0
    again.close()
    second.close()


def test_a_place_is_held_while_its_process_lives(tmp_path: Path) -> None:
    holder = subprocess.Popen(
        [sys.executable, "-c", "import sys, time\n"
         "from pathlib import Path\n"
         "from elasticrun.cli.node_claim import claim_place\n"
         f"place = claim_place(Path({str(tmp_path)!r}), 'vm')\n"
         "print(place.index, flush=True)\n"
         "time.sleep(60)\n"], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "0"
        place = claim_place(tmp_path, "vm")
        assert place.name == "vm_1"
        place.close()
    finally:
        holder.kill()  # SIGKILL: no code of its own runs, the kernel drops the lock
        holder.wait(10)
    deadline = time.monotonic() + 10
    while (place := claim_place(tmp_path, "vm")).index != 0:
        place.close()
        assert time.monotonic() < deadline, "the dead launcher's place was not released"
        time.sleep(0.05)
    place.close()
