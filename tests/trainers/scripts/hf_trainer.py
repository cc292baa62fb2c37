"""A torchrun training script for Hugging Face's Trainer: a tiny BERT built from its config
(no downloads), random token ids and labels, DDP on Gloo over CPU.

The Trainer writes OUT/checkpoint-<step> every --save-every steps; at start the script
resumes from the newest checkpoint whose trainer_state.json (written last) exists. With
--flash, elasticrun's ElasticCallback is added (the one line a user adds).
"""

from __future__ import annotations

import argparse
import os
import re
import sys
import time
from pathlib import Path

import torch
from torch.utils.data import Dataset
from transformers import (
    BertConfig,
    BertForSequenceClassification,
    Trainer,
    TrainerCallback,
    TrainerControl,
    TrainerState,
    TrainingArguments,
)
from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR

VOCAB = 100
SEQUENCE = 16
SAMPLES = 64


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--save-every", type=int, default=10)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--step-sleep", type=float, default=0.0)
    parser.add_argument("--flash", action="store_true",
                        help="add elasticrun's ElasticCallback (flash commits)")
    return parser.parse_args()


def say(line: str) -> None:
    sys.stdout.write(f"{line}\n")
    sys.stdout.flush()


class RandomTokens(Dataset[dict[str, torch.Tensor]]):
    def __init__(self) -> None:
        generator = torch.Generator().manual_seed(0)
        self.ids = torch.randint(1, VOCAB, (SAMPLES, SEQUENCE), generator=generator)
        self.labels = torch.randint(0, 2, (SAMPLES,), generator=generator)

    def __len__(self) -> int:
        return SAMPLES

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        return {"input_ids": self.ids[index], "labels": self.labels[index]}


class Progress(TrainerCallback):
    def __init__(self, step_sleep: float) -> None:
        self.step_sleep = step_sleep
        self.rank = int(os.environ.get("RANK", "0"))
        self.world = int(os.environ.get("WORLD_SIZE", "1"))
        self.restart = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")

    def on_train_begin(self, args: TrainingArguments, state: TrainerState,
                       control: TrainerControl, **kwargs: object) -> None:
        if self.rank == 0:
            say(f"start resumed_from={state.global_step} world={self.world}")

    def on_step_end(self, args: TrainingArguments, state: TrainerState,
                    control: TrainerControl, **kwargs: object) -> None:
        say(f"step {state.global_step} rank {self.rank} restart {self.restart}")
        if self.step_sleep:
            time.sleep(self.step_sleep)

    def on_train_end(self, args: TrainingArguments, state: TrainerState,
                     control: TrainerControl, **kwargs: object) -> None:
        if self.rank == 0:
            say(f"done steps={state.global_step} world={self.world}")


def last_complete_checkpoint(out: Path) -> str | None:
    pattern = re.compile(rf"^{PREFIX_CHECKPOINT_DIR}-(\d+)$")
    steps = [
        int(match.group(1))
        for path in (out.iterdir() if out.is_dir() else [])
        if (match := pattern.match(path.name)) and (path / "trainer_state.json").is_file()
    ]
    return str(out / f"{PREFIX_CHECKPOINT_DIR}-{max(steps)}") if steps else None


def flash_callbacks(flash: bool) -> list[TrainerCallback]:
    if not flash:
        return []
    from elasticrun.integrations.transformers import ElasticCallback
    return [ElasticCallback()]


def main() -> None:
    args = parse_args()
    torch.manual_seed(0)
    config = BertConfig(
        vocab_size=VOCAB, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
        intermediate_size=64, max_position_embeddings=SEQUENCE,
    )
    training_args = TrainingArguments(
        output_dir=str(args.out),
        max_steps=args.steps,
        save_strategy="steps",
        save_steps=args.save_every,
        save_total_limit=2,
        per_device_train_batch_size=4,
        learning_rate=1e-3,
        report_to="none",
        use_cpu=True,
        ddp_backend="gloo",
        ddp_find_unused_parameters=False,
        logging_steps=1,
        dataloader_num_workers=0,
        disable_tqdm=True,
        seed=0,
    )
    trainer = Trainer(
        model=BertForSequenceClassification(config),
        args=training_args,
        train_dataset=RandomTokens(),
        callbacks=[*flash_callbacks(args.flash), Progress(args.step_sleep)],
    )
    trainer.train(resume_from_checkpoint=last_complete_checkpoint(args.out))


if __name__ == "__main__":
    main()
