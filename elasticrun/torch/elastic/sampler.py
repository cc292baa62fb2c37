"""ElasticSampler: each sample once per epoch, however often the world changes.

Every rank knows every rank's shard (they come from one permutation of the samples not
yet processed), so `record_batch` records the batch of *all* ranks. The committed
progress is therefore the same on every rank, and survives the loss of any of them.
On every reset the remaining samples are repartitioned over the new world size.

Like DistributedSampler, a shard is padded to equal length with a few repeats when the
remaining samples do not divide evenly, so that all ranks take the same number of
steps; repeats are never recorded twice and never cause a sample to be skipped.

`record_batch(batch_idx, batch_size)` counts as Horovod's does: each call adds `batch_size *
num_replicas` to `processed_num`, whatever `batch_idx`. The samples it marks are the next
`batch_size` of every rank's shard: a cursor that starts at 0 at every reset and every pass
over the sampler, so the marked samples are the ones the ranks were given even when
`batch_idx` keeps counting across a restore (as in Horovod's own test).

The order, attributes and state are Horovod's: an epoch's order is `random.Random(seed +
epoch)` shuffling the indices, `remaining_indices`, `num_samples`, `total_size` and
`processed_num` mean what they mean there, and `state_dict()` holds `epoch` and
`processed_num`, so a state written by Horovod's sampler loads here and gives the same
remaining samples. `processed_indices` (and `record_indices`, for samples processed out of
order) is elasticrun's addition: it, not `processed_num`, decides which samples remain.
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
        self.processed_num = 0  # Horovod's count: batch_size * num_replicas per record_batch
        self.num_replicas = 1
        self.rank = 0
        self.remaining_indices: list[int] = []
        self.num_samples = 0
        self.total_size = 0
        self.indices: list[int] = []
        self._shards: list[list[int]] = [[]]
        self._recorded = 0  # how much of every shard record_batch has marked
        self.reset()

    def set_epoch(self, epoch: int) -> None:
        """Starts `epoch`: nothing processed yet."""
        self.epoch = epoch
        self.processed_indices = set()
        self.processed_num = 0
        self.reset()

    def record_batch(self, batch_idx: int, batch_size: int) -> None:
        """Records a batch of every rank: adds `batch_size * num_replicas` to `processed_num`
        (Horovod's count, whatever `batch_idx`) and marks the next `batch_size` samples of
        every rank's shard, since the last reset or pass over the sampler, processed."""
        del batch_idx  # Horovod's signature; the cursor says which samples the batch held
        start = self._recorded
        self._recorded += batch_size
        for shard in self._shards:
            self.processed_indices.update(shard[start:self._recorded])
        self.processed_num += batch_size * self.num_replicas

    def record_indices(self, indices: list[int] | set[int]) -> None:
        """Marks these dataset indices processed (for samples processed out of batch order);
        `processed_num` counts those not marked before."""
        new = set(indices) - self.processed_indices
        self.processed_indices.update(new)
        self.processed_num += len(new)

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
        self._recorded = 0

    def _epoch_order(self) -> list[int]:
        """Horovod's order of this epoch."""
        order = list(range(len(self.dataset)))
        if self.shuffle:
            random.Random(self.seed + self.epoch).shuffle(order)
        return order

    def __iter__(self) -> Iterator[int]:
        self.indices = list(self._shards[self.rank])
        self._recorded = 0  # a new pass: its batches start at the shard's start
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
        self.processed_num = int(state["processed_num"])
        if "processed_indices" in state:
            self.processed_indices = set(state["processed_indices"])
        else:
            self.processed_indices = set(self._epoch_order()[:self.processed_num])
        self.reset()
