"""ElasticSampler: each sample once per epoch, however often the world changes.

Every rank knows every rank's shard (they come from one permutation of the samples not
yet processed), so `record_batch` records the batch of *all* ranks. The committed
progress is therefore the same on every rank, and survives the loss of any of them.
On every reset the remaining samples are repartitioned over the new world size.

Like DistributedSampler, a shard is padded to equal length with a few repeats when the
remaining samples do not divide evenly, so that all ranks take the same number of
steps; repeats are never recorded twice and never cause a sample to be skipped.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Sized
from typing import Any

import torch
from torch.utils.data import Sampler

from elasticrun.torch.world import place, runtime


class ElasticSampler(Sampler[int]):
    def __init__(self, dataset: Sized, shuffle: bool = True, seed: int = 0) -> None:
        self.dataset = dataset
        self.shuffle = shuffle
        self.seed = seed
        self.epoch = 0
        self.processed_indices: set[int] = set()
        self.num_replicas = 1
        self.rank = 0
        self._shards: list[list[int]] = [[]]
        self.reset()

    def set_epoch(self, epoch: int) -> None:
        """Starts `epoch`: nothing processed yet."""
        self.epoch = epoch
        self.processed_indices = set()
        self.reset()

    def record_batch(self, batch_idx: int, batch_size: int) -> None:
        """Marks batch `batch_idx` (counted since the last reset) of every rank processed."""
        start, end = batch_idx * batch_size, (batch_idx + 1) * batch_size
        for shard in self._shards:
            self.processed_indices.update(shard[start:end])

    def record_indices(self, indices: list[int] | set[int]) -> None:
        self.processed_indices.update(indices)

    def get_indices(self, batch_idx: int, batch_size: int) -> list[int]:
        """This rank's indices of batch `batch_idx`."""
        return self._shards[self.rank][batch_idx * batch_size:(batch_idx + 1) * batch_size]

    @property
    def remaining(self) -> int:
        return len(self.dataset) - len(self.processed_indices)

    def reset(self) -> None:
        """Repartitions the samples not yet processed over the current world."""
        if runtime.is_initialized():
            self.num_replicas, self.rank = place.size(), place.rank()
        remaining = [i for i in self._epoch_order() if i not in self.processed_indices]
        target = math.ceil(len(remaining) / self.num_replicas) * self.num_replicas
        padded = (remaining * math.ceil(target / len(remaining)))[:target] if remaining else []
        self._shards = [padded[r::self.num_replicas] for r in range(self.num_replicas)]

    def _epoch_order(self) -> list[int]:
        count = len(self.dataset)
        if not self.shuffle:
            return list(range(count))
        generator = torch.Generator()
        generator.manual_seed(self.seed + self.epoch)
        return torch.randperm(count, generator=generator).tolist()

    def __iter__(self) -> Iterator[int]:
        return iter(list(self._shards[self.rank]))

    def __len__(self) -> int:
        return len(self._shards[self.rank])

    def state_dict(self) -> dict[str, Any]:
        return {"epoch": self.epoch, "seed": self.seed,
                "processed_indices": sorted(self.processed_indices)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.epoch = int(state["epoch"])
        self.seed = int(state.get("seed", self.seed))
        self.processed_indices = set(state["processed_indices"])
        self.reset()
