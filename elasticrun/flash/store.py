"""Where flash commits live: the job's host-memory directory, two complete commits a part.

A flash commit is a step's training state in host memory (the job's host snapshot
directory, /dev/shm: it outlives every worker process on the host, not the host, and is
removed when the job ends, so a new job never reads another's). It has two parts:
- "shared": what every rank holds alike under data parallelism (model, optimizer, LR
  scheduler, the trainer's own state), written once a host, by its lowest local rank;
- "rank<R>": what is rank R's own (its RNG states; or its whole state, where ranks hold
  different state), written by rank R.
Each part's file is written in place into a rotating slot (commit_files.SlotWriter: a new
tmpfs file's pages cost three times the copy) and published as `commit-<step>.<part>.pt`
once whole; the two newest of each part are kept, so a step is found whole on a host even
when a writer was killed midway through the next. A rank's own part beside a shared one
holds only its RNG states (a few KiB): OWN_KEPT of those are kept, so that the step the
shared part's writer committed last is among them, though that writer, copying far more,
commits less often.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch

from elasticrun import protocol
from elasticrun.torch.elastic import commit_files

SHARED = "shared"
KEPT = 2  # complete commits kept of each part
OWN_KEPT = 64  # of a rank's own part beside a shared one (its RNG states only)
FORMAT = "elasticrun-flash"


def own_part(rank: int) -> str:
    return f"rank{rank}"


def flash_directory(env: Mapping[str, str] | None = None) -> Path | None:
    """This job's flash commit directory on this host; None outside elasticrun, or with host
    snapshots off (--no-host-snapshots)."""
    env = os.environ if env is None else env
    snapshots = env.get(protocol.ENV_SNAPSHOT_DIR, "")
    return Path(snapshots) / "flash" if snapshots else None


class FlashStore:
    """The flash commits of one process: writes its parts, finds and reads complete ones."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self._slots: dict[int, commit_files.SlotWriter] = {}

    def write(self, step: int, part: str, content: Mapping[str, Any], kept: int = KEPT
              ) -> None:
        """Writes `content` (tensors on the CPU and plain values) as `part` of `step`,
        keeping the `kept` newest complete ones of the part."""
        self.directory.mkdir(parents=True, exist_ok=True, mode=0o700)
        slots = self._slots.setdefault(kept, commit_files.SlotWriter(self.directory, kept))
        written = slots.write(step, part, {"format": FORMAT, "step": step, **content})
        commit_files.prune(self.directory, written, kept=kept)

    def steps(self, part: str) -> list[int]:
        """The steps of which `part` is complete here, oldest first."""
        return [kept.commit for kept in commit_files.complete(self.directory, part)]

    def read(self, step: int, part: str) -> dict[str, Any] | None:
        """`part` of `step` (None: not here, or no longer whole)."""
        path = self.directory / commit_files.file_name(step, part)
        try:
            content = torch.load(path, map_location="cpu", weights_only=False)
        except Exception:  # removed meanwhile, or not whole: as if absent
            return None
        return content if isinstance(content, dict) and content.get("format") == FORMAT \
            else None
