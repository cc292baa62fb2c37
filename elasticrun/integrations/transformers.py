"""Flash commits for Hugging Face's Trainer: `Trainer(..., callbacks=[ElasticCallback()])`.

At the end of every optimizer step (on the cadence of elasticrun.flash: every step while the
copy costs under 2% of one) the callback keeps what the Trainer's own checkpoint holds —
the model's weights, the optimizer, the LR scheduler, the grad scaler, the trainer's state
(global step, epoch, callbacks' states) and each process's RNG states — in host memory.
The script's resume call stays as it is: `trainer.train(resume_from_checkpoint=X)` (a
checkpoint directory, True, or None) resumes, on a restart of the same elasticrun job, from
the newer of X and the job's flash commit; from a flash commit it resumes exactly as from
a checkpoint of that step (the Trainer skips the batches already trained itself).

Under plain torchrun or python, or with a sharded Trainer (FSDP, DeepSpeed), the callback
does nothing. transformers is imported from this module only.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import logging
import os
import shutil
from pathlib import Path
from typing import Any

import torch
from transformers import Trainer, TrainerCallback, TrainerControl, TrainerState, TrainingArguments
from transformers.trainer import (
    OPTIMIZER_NAME,
    SCALER_NAME,
    SCHEDULER_NAME,
    TRAINER_STATE_NAME,
)
from transformers.trainer_callback import ExportableState
from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR, get_last_checkpoint
from transformers.utils import WEIGHTS_NAME

from elasticrun.flash.rng import rng_states
from elasticrun.flash.session import FlashSession, Resumed
from elasticrun.torch.elastic.cadence import BUDGET

log = logging.getLogger("elasticrun.flash")


class ElasticCallback(TrainerCallback):
    """Keeps the Trainer's state in host memory every step; see the module's docstring."""

    def __init__(self, budget: float = BUDGET) -> None:
        self.session = FlashSession(replicated=True, budget=budget)
        self.trainer: Trainer | None = None
        self._resume_dir: Path | None = None
        _wrap_train()

    def attach(self, trainer: Trainer) -> None:
        self.trainer = trainer
        if self.session.enabled and (trainer.is_fsdp_enabled or trainer.is_deepspeed_enabled):
            log.warning("elasticrun: flash commits are off for a sharded Trainer (FSDP, "
                        "DeepSpeed); it resumes from its own checkpoints")
            self.session.directory = None

    def resume_from(self, resume_from_checkpoint: str | bool | None) -> str | bool | None:
        """The checkpoint the Trainer resumes from: the script's, or the flash commit's
        (made into a checkpoint directory of its own) where that is newer."""
        if not self.session.enabled or self.trainer is None:
            return resume_from_checkpoint
        script = resume_from_checkpoint
        if script is True:
            script = get_last_checkpoint(self.trainer.args.output_dir)
        resumed = self.session.resume(_checkpoint_step(script))
        if resumed is None:
            return resume_from_checkpoint
        self._resume_dir = self._write_checkpoint(resumed)
        return str(self._resume_dir)

    def on_step_end(self, args: TrainingArguments, state: TrainerState,
                    control: TrainerControl, **kwargs: Any) -> None:
        if self.trainer is None or not self.session.enabled:
            return
        self.session.step_ended(state.global_step, self._capture)
        if self._resume_dir is not None:  # the Trainer has read it all by now
            shutil.rmtree(self._resume_dir.parent, ignore_errors=True)
            self._resume_dir = None

    def on_train_end(self, args: TrainingArguments, state: TrainerState,
                     control: TrainerControl, **kwargs: Any) -> None:
        self.session.flush()

    def _capture(self) -> tuple[dict[str, Any], dict[str, Any]]:
        trainer = self.trainer
        assert trainer is not None
        assert trainer.model is not None
        shared: dict[str, Any] = {
            "model": trainer.model.state_dict(),
            "optimizer": trainer.optimizer.state_dict() if trainer.optimizer else None,
            "scheduler": trainer.lr_scheduler.state_dict() if trainer.lr_scheduler else None,
            "scaler": None, "trainer_state": _trainer_state(trainer)}
        scaler = getattr(trainer.accelerator, "scaler", None)
        if scaler is not None:
            shared["scaler"] = scaler.state_dict()
        rng = rng_states()
        if "cuda" in rng and trainer.args.world_size <= 1:
            rng["cuda"] = torch.cuda.random.get_rng_state()  # as the Trainer saves it alone
        return shared, {"rng": rng}

    def _write_checkpoint(self, resumed: Resumed) -> Path:
        """The flash commit as the Trainer's own checkpoint directory, this process's."""
        assert self.trainer is not None and self.session.directory is not None
        args = self.trainer.args
        where = (self.session.directory / "resume" / f"rank{self.session.rank}"
                 / f"{PREFIX_CHECKPOINT_DIR}-{resumed.step}")
        shutil.rmtree(where.parent, ignore_errors=True)
        where.mkdir(parents=True, mode=0o700)
        shared = resumed.shared
        torch.save(shared["model"], where / WEIGHTS_NAME)
        if shared["optimizer"] is not None:
            torch.save(shared["optimizer"], where / OPTIMIZER_NAME)
        if shared["scheduler"] is not None:
            torch.save(shared["scheduler"], where / SCHEDULER_NAME)
        if shared["scaler"] is not None:
            torch.save(shared["scaler"], where / SCALER_NAME)
        if resumed.own is not None:
            name = f"rng_state_{args.process_index}.pth" if args.world_size > 1 \
                else "rng_state.pth"
            torch.save(resumed.own["rng"], where / name)
        (where / TRAINER_STATE_NAME).write_text(shared["trainer_state"])
        return where


def _trainer_state(trainer: Trainer) -> str:
    """The trainer's state as its checkpoint's trainer_state.json holds it (with its
    callbacks' states of now, as the Trainer's own save adds them)."""
    state = trainer.state
    before: dict[str, Any] = dict(state.stateful_callbacks or {})  # type: ignore[arg-type]
    exported: dict[str, Any] = {}
    for callback in [*trainer.callback_handler.callbacks, trainer.control]:
        if isinstance(callback, ExportableState):
            name = callback.__class__.__name__
            if isinstance(before.get(name), list):
                exported.setdefault(name, []).append(callback.state())
            else:
                exported[name] = callback.state()
    saved = dataclasses.asdict(state)
    saved["stateful_callbacks"] = {**before, **exported}
    return json.dumps(saved, indent=2, sort_keys=True) + "\n"


def _checkpoint_step(checkpoint: str | bool | None) -> int:
    """The global step of a Trainer checkpoint directory (0: none, or unreadable)."""
    if not isinstance(checkpoint, (str, os.PathLike)):
        return 0
    try:
        state = json.loads((Path(checkpoint) / TRAINER_STATE_NAME).read_text())
        return int(state.get("global_step", 0))
    except (OSError, ValueError, TypeError):
        return 0


@functools.cache
def _wrap_train() -> None:
    """Trainer.train resumes from the flash commit where it is newer than the checkpoint it
    is given: wrapped once, for Trainers that have an ElasticCallback."""
    original = Trainer.train

    @functools.wraps(original)
    def train(self: Trainer, resume_from_checkpoint: str | bool | None = None,
              *args: Any, **kwargs: Any) -> Any:
        callbacks = [c for c in self.callback_handler.callbacks
                     if isinstance(c, ElasticCallback)]
        for callback in callbacks:
            callback.attach(self)
        if callbacks:
            resume_from_checkpoint = callbacks[0].resume_from(resume_from_checkpoint)
        return original(self, resume_from_checkpoint, *args, **kwargs)

    Trainer.train = train  # type: ignore[method-assign]
