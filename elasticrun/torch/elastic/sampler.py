"""ElasticSampler: each sample once per epoch, however often the world changes.

Every rank knows every rank's shard (they come from one permutation of the samples not
yet processed), so `record_batch` records the batch of *all* ranks. The committed
progress is therefore the same on every rank, and survives the loss of any of them.
On every reset the remaining samples are repartitioned over the new world size.

Like DistributedSampler, a shard is padded to equal length with a few repeats when the
remaining samples do not divide evenly, so that all ranks take the same number of
steps; repeats are never recorded twice and never cause a sample to be skipped.

The order, attributes and state are Horovod's: an epoch's order is `random.Random(seed +
epoch)` shuffling the indices, `remaining_indices`, `num_samples`, `total_size` and
`processed_num` (how many of that order are processed) mean what they mean there, and
`state_dict()` holds `epoch` and `processed_num`, so a state written by Horovod's sampler
loads here and gives the same remaining samples. `processed_indices` (and
`record_indices`, for samples processed out of order) is elasticrun's addition.
"""

from __future__ import annotations

import math
import random
from collections.abc import Iterator, Sized
from typing import Any

from torch.utils.data import Sampler

from elasticrun.torch.world import place, runtime


class ElasticSampler(Sampler[int]):
    """A sampler that gives each sample of `dataset` once per epoch, however the world
    changes: the samples not yet processed are repartitioned over the ranks at every
    reset. Keep it in the TorchState (`TorchState(..., sampler=sampler)`) and call
    record_batch() after each batch, so that a rollback resumes where the commit was.
    Shuffled with `seed` + epoch when `shuffle`; its state is Horovod's ElasticSampler's."""

    def __init__(self, dataset: Sized, shuffle: bool = True, seed: int = 0) -> None:
        self.dataset = dataset
        self.shuffle = shuffle
        self.seed = seed
        self.epoch = 0
        self.processed_indices: set[int] = set()
        self.num_replicas = 1
        self.rank = 0
        self.remaining_indices: list[int] = []
        self.num_samples = 0
        self.total_size = 0
        self.indices: list[int] = []
        self._shards: list[list[int]] = [[]]
        self.reset()

    @property
    def processed_num(self) -> int:
        """How many samples of this epoch are processed (Horovod's count)."""
        return len(self.processed_indices)

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
        """Marks these dataset indices processed (for samples processed out of batch order)."""
        self.processed_indices.update(indices)

    def get_indices(self, batch_idx: int, batch_size: int) -> list[int]:
        """This rank's indices of batch `batch_idx`."""
        return self._shards[self.rank][batch_idx * batch_size:(batch_idx + 1) * batch_size]

    @property
    def remaining(self) -> int:
        """How many samples of this epoch are not processed yet."""
        return len(self.dataset) - len(self.processed_indices)

    def reset(self) -> None:
        """Repartitions the samples not yet processed over the current world."""
        if runtime.is_initialized():
            self.num_replicas, self.rank = place.size(), place.rank()
        remaining = [i for i in self._epoch_order() if i not in self.processed_indices]
        self.remaining_indices = remaining
        self.num_samples = math.ceil(len(remaining) / self.num_replicas)
        self.total_size = self.num_samples * self.num_replicas
        padded = (remaining * math.ceil(self.total_size / len(remaining)))[:self.total_size] \
            if remaining else []
        self._shards = [padded[r::self.num_replicas] for r in range(self.num_replicas)]

    def _epoch_order(self) -> list[int]:
        """Horovod's order of this epoch."""
        order = list(range(len(self.dataset)))
        if self.shuffle:
            random.Random(self.seed + self.epoch).shuffle(order)
        return order

    def __iter__(self) -> Iterator[int]:
        self.indices = list(self._shards[self.rank])
        return iter(self.indices)

    def __len__(self) -> int:
        return len(self._shards[self.rank])

    def state_dict(self) -> dict[str, Any]:
        """The sampler's progress (epoch, seed and the processed samples), for
        load_state_dict()."""
        return {"epoch": self.epoch, "processed_num": self.processed_num, "seed": self.seed,
                "processed_indices": sorted(self.processed_indices)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Loads a state of this sampler, or Horovod's (`epoch` and `processed_num`: the
        first that many of the epoch's order are processed)."""
        self.epoch = int(state["epoch"])
        self.seed = int(state.get("seed", self.seed))
        if "processed_indices" in state:
            self.processed_indices = set(state["processed_indices"])
        else:
            self.processed_indices = set(self._epoch_order()[:int(state["processed_num"])])
        self.reset()
