"""ElasticSampler.record_batch counts as Horovod's does (batch_size * num_replicas a call,
whatever batch_idx, also after a restore), while the samples it marks processed stay the
ones the ranks were given: a cursor through every shard, from each reset and each pass.
A world of N is set as a reset after a round change would set it (no init())."""

from __future__ import annotations

import copy
import random

from elasticrun.torch.elastic.sampler import ElasticSampler


def _order(count: int, seed: int = 0, epoch: int = 0) -> list[int]:
    order = list(range(count))
    random.Random(seed + epoch).shuffle(order)
    return order


def _in_world(sampler: ElasticSampler, size: int, rank: int = 0) -> ElasticSampler:
    sampler.num_replicas, sampler.rank = size, rank
    sampler.reset()
    return sampler


def test_each_call_adds_batch_size_times_replicas_whatever_batch_idx() -> None:
    sampler = _in_world(ElasticSampler(list(range(40))), 2)
    for batch_idx in (0, 7, 7, 100):  # Horovod ignores batch_idx
        sampler.record_batch(batch_idx, 3)
    assert sampler.processed_num == 4 * 3 * 2
    assert sampler.processed_indices == set(_order(40)[:24])  # 4 batches of both ranks


def test_horovods_commit_restore_sequence() -> None:
    """test/single/test_torch_elastic.py test_elastic_sampler's partial epoch: batch_idx goes
    on counting after the restore, which repartitions the remaining samples."""
    batch = 2
    sampler = ElasticSampler(list(range(8)))
    sampler.set_epoch(2)
    sampler.record_batch(0, batch)
    sampler.record_batch(1, batch)
    committed = copy.deepcopy(sampler.state_dict())
    sampler.record_batch(2, batch)
    sampler.record_batch(3, batch)
    assert sampler.processed_num == 4 * batch
    sampler.load_state_dict(committed)  # TorchState.restore()
    assert sampler.processed_num == 2 * batch
    sampler.record_batch(2, batch)  # the first batch of the restored shard
    assert sampler.processed_num == 3 * batch
    order = _order(8, epoch=2)
    assert sampler.processed_indices == set(order[:6])
    sampler.load_state_dict(sampler.state_dict())  # a sync
    assert sampler.processed_num == 3 * batch and len(sampler) == batch
    assert list(sampler) == order[6:]


def test_each_sample_once_when_batch_idx_runs_on_across_a_world_change() -> None:
    count, batch = 29, 2
    sampler = _in_world(ElasticSampler(list(range(count)), seed=4), 2)
    given = [list(_in_world(copy.deepcopy(sampler), 2, r)) for r in range(2)]
    done = [i for shard in given for i in shard[:2 * batch]]
    for batch_idx in range(2):
        sampler.record_batch(batch_idx, batch)
    assert sampler.processed_indices == set(done)
    _in_world(sampler, 3)  # a reset to 3 ranks; the loop's batch_idx goes on from 2
    given = [list(_in_world(copy.deepcopy(sampler), 3, r)) for r in range(3)]
    assert not set(done) & {i for shard in given for i in shard}
    for batch_idx in range(2, 2 + len(given[0]) // batch):
        sampler.record_batch(batch_idx, batch)
    done += [i for shard in given for i in shard[:len(given[0]) // batch * batch]]
    assert sampler.processed_indices == set(done)
    assert sampler.processed_num == 2 * batch * 2 + len(given[0]) // batch * batch * 3
    assert set(done) | set(_in_world(sampler, 3).remaining_indices) == set(range(count))


def test_a_new_pass_records_from_the_start_of_the_shard() -> None:
    """A loop broken off and begun again without a reset is given the same samples again:
    its first batch is those, not the batch after the one recorded before."""
    sampler = _in_world(ElasticSampler(list(range(12)), shuffle=False), 2)
    assert list(sampler)[:2] == [0, 2]
    sampler.record_batch(0, 2)
    assert list(sampler)[:2] == [0, 2]  # a new pass
    sampler.record_batch(5, 2)  # its first batch (batch_idx aside)
    assert sampler.processed_indices == {0, 1, 2, 3}
    assert sampler.processed_num == 8


def test_padding_repeats_are_counted_as_horovod_but_marked_once() -> None:
    sampler = _in_world(ElasticSampler(list(range(5))), 2)  # shards of 3: one repeat
    sampler.record_batch(0, 3)
    assert sampler.processed_num == 6  # Horovod's count
    assert sampler.processed_indices == set(range(5)) and sampler.remaining == 0
    sampler.record_indices([0, 4])  # recorded already: nothing more to count
    assert sampler.processed_num == 6
    again = ElasticSampler(list(range(5)))
    again.load_state_dict(sampler.state_dict())
    assert again.processed_num == 6 and again.remaining_indices == []
