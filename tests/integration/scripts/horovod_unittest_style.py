"""A test module written the way Horovod's own test_torch.py and test_process_sets.py are
(unittest; hvd.init() in setUp, barrier and shutdown in tearDown, so every test re-inits),
with only the import changed. Run under `elasticrun -np 2 python THIS -v`: unittest's exit
status says whether every test passed on this rank."""

from __future__ import annotations

import unittest

import torch

import elasticrun.torch as hvd


class TorchTests(unittest.TestCase):
    def setUp(self) -> None:
        hvd.init()

    def tearDown(self) -> None:
        hvd.barrier()
        hvd.shutdown()

    def test_horovod_allreduce_average_every_dtype(self) -> None:
        for dtype in (torch.float32, torch.float64, torch.int32, torch.int64, torch.float16):
            tensor = torch.full((4, 3), hvd.rank() + 1, dtype=dtype)
            summed = hvd.allreduce(tensor, op=hvd.Sum, name=f"sum.{dtype}")
            self.assertEqual(summed.tolist(), [[3] * 3] * 4, dtype)
            averaged = hvd.allreduce(tensor.to(torch.float32), name=f"average.{dtype}")
            self.assertEqual(averaged.tolist(), [[1.5] * 3] * 4, dtype)

    def test_horovod_allreduce_error(self) -> None:
        """Ranks sending tensors of different shapes: an error on every rank, after which
        collectives work again."""
        tensor = torch.ones(2 + hvd.rank())
        with self.assertRaises(RuntimeError):
            hvd.allreduce(tensor, name="mismatched")
        self.assertEqual(hvd.allreduce(torch.ones(2), op=hvd.Sum).tolist(), [2.0, 2.0])

    def test_horovod_allgather_variable_size(self) -> None:
        tensor = torch.full((hvd.rank() + 1, 2), hvd.rank())
        gathered = hvd.allgather(tensor)
        self.assertEqual(gathered.tolist(), [[0, 0], [1, 1], [1, 1]])

    def test_horovod_broadcast_and_objects(self) -> None:
        self.assertEqual(hvd.broadcast(torch.tensor([hvd.rank()]), root_rank=1).tolist(), [1])
        self.assertEqual(hvd.broadcast_object({"from": hvd.rank()}, root_rank=0), {"from": 0})
        self.assertEqual(hvd.allgather_object(hvd.rank()), [0, 1])

    def test_horovod_alltoall_with_splits(self) -> None:
        tensor = torch.arange(3) + 10 * hvd.rank()
        splits = [1, 2] if hvd.rank() == 0 else [2, 1]
        output, received = hvd.alltoall(tensor, splits=torch.tensor(splits))
        expected = [[0, 10, 11], [1, 2, 12]][hvd.rank()]
        self.assertEqual(output.tolist(), expected)
        self.assertEqual(received.tolist(), [[1, 2], [2, 1]][hvd.rank()])

    def test_horovod_join(self) -> None:
        """Rank 1 trains a step more than rank 0, which has joined: it contributes zeros."""
        steps = 1 + hvd.rank()
        for _ in range(steps):
            result = hvd.allreduce(torch.ones(1), op=hvd.Sum)
        self.assertEqual(result.item(), 1.0 if hvd.rank() == 1 else 2.0)
        self.assertEqual(hvd.join(), 1)

    def test_horovod_process_set(self) -> None:
        """In a job of fixed size, a set of one rank and the global set."""
        alone = hvd.add_process_set([1])
        if hvd.rank() == 1:
            self.assertEqual(hvd.allreduce(torch.ones(1), op=hvd.Sum,
                                           process_set=alone).item(), 1.0)
        self.assertEqual(hvd.allreduce(torch.ones(1), op=hvd.Sum).item(), 2.0)
        self.assertTrue(hvd.remove_process_set(alone))

    def test_horovod_init_after_shutdown(self) -> None:
        hvd.barrier()
        hvd.shutdown()
        self.assertFalse(hvd.is_initialized())
        hvd.init()
        self.assertEqual(hvd.allreduce(torch.ones(1), op=hvd.Sum).item(), 2.0)


if __name__ == "__main__":
    unittest.main()
