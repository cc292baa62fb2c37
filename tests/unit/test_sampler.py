"""ElasticSampler against Horovod's: the same order, attributes and state keys (a state
dict written by Horovod's sampler loads and gives the same remaining samples), and each
sample once per epoch across resets to other world sizes. Without init() the sampler is a
world of one; a world of N is set as a reset after a round change would set it."""

from __future__ import annotations

import random

from elasticrun.torch.elastic.sampler import ElasticSampler


def _horovod_order(count: int, seed: int, epoch: int) -> list[int]:
    """Horovod's ElasticSampler.reset: indices shuffled by random.Random(seed + epoch)."""
    order = list(range(count))
    random.Random(seed + epoch).shuffle(order)
    return order


def _in_world(sampler: ElasticSampler, size: int, rank: int) -> ElasticSampler:
    sampler.num_replicas, sampler.rank = size, rank
    sampler.reset()
    return sampler


def test_order_and_attributes_are_horovods() -> None:
    sampler = ElasticSampler(list(range(10)), seed=3)
    sampler.set_epoch(1)
    _in_world(sampler, 3, 1)
    order = _horovod_order(10, 3, 1)
    assert sampler.remaining_indices == order
    assert (sampler.num_samples, sampler.total_size, len(sampler)) == (4, 12, 4)
    assert list(sampler) == (order + order[:2])[1::3] == sampler.indices
    unshuffled = _in_world(ElasticSampler(list(range(5)), shuffle=False), 2, 0)
    assert list(unshuffled) == [0, 2, 4]


def test_a_state_written_by_horovods_sampler_loads() -> None:
    sampler = _in_world(ElasticSampler(list(range(20)), seed=1), 2, 0)
    sampler.load_state_dict({"epoch": 2, "processed_num": 6})  # Horovod's state_dict()
    assert sampler.epoch == 2 and sampler.processed_num == 6
    assert sampler.remaining_indices == _horovod_order(20, 1, 2)[6:]
    assert {"epoch": 2, "processed_num": 6}.items() <= sampler.state_dict().items()
    again = ElasticSampler(list(range(20)), seed=1)
    again.load_state_dict(sampler.state_dict())
    assert again.processed_indices == sampler.processed_indices


def test_each_sample_once_per_epoch_across_resets() -> None:
    count, batch = 23, 3
    shared = ElasticSampler(list(range(count)), seed=5)  # its records are every rank's
    seen: list[int] = []
    # two batches on 2 ranks, then the world becomes 3 ranks for the rest of the epoch
    for rank in (0, 1):
        seen += [i for b in range(2) for i in
                 _in_world(shared, 2, rank).get_indices(b, batch)]
    _in_world(shared, 2, 0)
    for b in range(2):
        shared.record_batch(b, batch)
    assert shared.processed_num == 12 == len(seen)
    assert shared.processed_indices == set(_horovod_order(count, 5, 0)[:12])  # a prefix
    for rank in (0, 1, 2):
        shard = list(_in_world(shared, 3, rank))
        assert len(shard) == shared.num_samples == 4
        seen += shard
    assert set(seen) == set(range(count))
    assert len(seen) == 12 + 12 and len(set(seen)) == count  # one repeat: padding
    shared.set_epoch(1)
    assert shared.processed_num == 0 and len(shared.remaining_indices) == count
