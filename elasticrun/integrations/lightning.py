"""Flash commits for Lightning: `L.Trainer(..., callbacks=[ElasticCallback()])`.

At the end of every training batch that stepped the optimizer (on the cadence of
elasticrun.flash: every step while the copy costs under 2% of one) the callback keeps what
Lightning's own checkpoint holds — the module's weights, optimizers, LR schedulers,
precision plugin (grad scaler), loops' progress (global step, epoch, batch), callbacks'
states — and each process's RNG states, in host memory. The script's own
`trainer.fit(..., ckpt_path=X)` stays as it is: on a restart of the same elasticrun job,
the fit resumes from the newer of X and the job's flash commit.

Under plain torchrun or python, or with a strategy whose checkpoint is not the same on
every rank (FSDP, DeepSpeed), the callback does nothing. Lightning is imported from this
module only (the `lightning` package).
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
import torch
from lightning.pytorch.strategies import DDPStrategy, SingleDeviceStrategy

from elasticrun.flash.rng import rng_states, set_rng_states
from elasticrun.flash.session import FlashSession
from elasticrun.torch.elastic.cadence import BUDGET

log = logging.getLogger("elasticrun.flash")


class ElasticCallback(pl.Callback):
    """Keeps the fit's state in host memory every step; see the module's docstring."""

    def __init__(self, budget: float = BUDGET) -> None:
        self.session = FlashSession(replicated=True, budget=budget)
        self._last_step = -1
        self._resume_file: Path | None = None

    def setup(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        if stage != "fit" or not self.session.enabled:
            return
        if not isinstance(trainer.strategy, (DDPStrategy, SingleDeviceStrategy)):
            log.warning("elasticrun: flash commits are off for the %s strategy (a checkpoint "
                        "that differs by rank); the fit resumes from its own checkpoints",
                        type(trainer.strategy).__name__)
            self.session.directory = None
            return
        # The fit's checkpoint is read after this hook, with the process group up: where
        # the flash commit is newer, it is read instead.
        connector = trainer._checkpoint_connector
        resume_start = connector.resume_start

        def resume_from_newer(checkpoint_path: Any = None, *args: Any, **kwargs: Any) -> Any:
            connector.resume_start = resume_start  # type: ignore[method-assign]  # once
            return resume_start(self._resume_from(checkpoint_path), *args, **kwargs)

        connector.resume_start = resume_from_newer  # type: ignore[method-assign]

    def on_train_batch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule,
                           outputs: Any, batch: Any, batch_idx: int) -> None:
        if not self.session.enabled or trainer.global_step == self._last_step:
            return  # (a batch that only accumulated gradients)
        self._last_step = trainer.global_step
        self.session.step_ended(trainer.global_step, lambda: self._capture(trainer))
        if self._resume_file is not None:
            self._resume_file.unlink(missing_ok=True)
            self._resume_file = None

    def on_train_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self.session.flush()

    def _capture(self, trainer: pl.Trainer) -> tuple[dict[str, Any], dict[str, Any]]:
        checkpoint = trainer._checkpoint_connector.dump_checkpoint(weights_only=False)
        return checkpoint, {"rng": rng_states()}

    def _resume_from(self, checkpoint_path: Any) -> Any:
        resumed = self.session.resume(_checkpoint_step(checkpoint_path))
        if resumed is None:
            return checkpoint_path
        if resumed.own is not None:
            set_rng_states(resumed.own["rng"])
        assert self.session.directory is not None
        where = self.session.directory / "resume" / f"rank{self.session.rank}.ckpt"
        where.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        torch.save(resumed.shared, where)
        self._resume_file = where
        return str(where)


def _checkpoint_step(checkpoint_path: Any) -> int:
    """The global step of a Lightning checkpoint file (0: none, or unreadable); read
    without loading its tensors."""
    if checkpoint_path is None:
        return 0
    try:
        checkpoint = torch.load(checkpoint_path, map_location="cpu", mmap=True,
                                weights_only=False)
        return int(checkpoint.get("global_step", 0))
    except Exception:  # "last"/"best" resolved later by Lightning, a file of another kind
        return 0
