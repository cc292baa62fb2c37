"""What each GPU rank runs (importable by the spawned ranks): elasticrun.torch's collectives
on CUDA tensors, checked against what the CPU computes."""

from __future__ import annotations

import torch

import elasticrun.torch as hvd
from elasticrun.torch.world import plane, runtime


def where() -> tuple[str, str, bool]:
    session = runtime.current().session
    assert session is not None
    return session.backend, str(plane.cuda_device()), session.device_group is not None


def allreduce_family() -> dict[str, object]:
    rank, size = hvd.rank(), hvd.size()
    x = torch.arange(6, dtype=torch.float32, device="cuda") * (rank + 1)
    total = sum(range(1, size + 1))
    summed = hvd.allreduce(x, op=hvd.Sum)
    averaged = hvd.allreduce(x, op=hvd.Average)
    ones = torch.ones(3, device="cuda", dtype=torch.int64)
    grouped = hvd.grouped_allreduce([x, x.double(), ones], op=hvd.Sum)
    expected = torch.arange(6, dtype=torch.float32) * total
    return {
        "on_gpu": all(t.is_cuda for t in (summed, averaged, *grouped)),
        "sum": torch.equal(summed.cpu(), expected),
        "average": torch.allclose(averaged.cpu(), expected / size),
        "grouped": torch.equal(grouped[0].cpu(), expected)
        and torch.equal(grouped[1].cpu(), expected.double())
        and grouped[2].tolist() == [size] * 3,
        "fp16": torch.allclose(hvd.allreduce(x, op=hvd.Sum, compression=hvd.Compression.fp16)
                               .float().cpu(), expected),
    }


def the_others() -> dict[str, object]:
    rank, size = hvd.rank(), hvd.size()
    mine = torch.full((rank + 1, 2), float(rank), device="cuda")
    gathered = hvd.allgather(mine)
    rows = [float(r) for r in range(size) for _ in range(r + 1)]
    sent = torch.arange(size, dtype=torch.float32, device="cuda") + 10 * rank
    received = hvd.alltoall(sent)  # Horovod's: without splits, only the tensor
    uneven, splits = hvd.alltoall(sent, splits=[1] * size)
    shared = hvd.broadcast(torch.full((4,), float(rank), device="cuda"), root_rank=size - 1)
    scattered = hvd.reducescatter(torch.ones(size * 2, device="cuda"), op=hvd.Sum)
    adasum = hvd.allreduce(torch.full((5,), 1.0, device="cuda"), op=hvd.Adasum)
    return {
        "allgather": gathered.is_cuda and gathered[:, 0].cpu().tolist() == rows,
        "alltoall": received.is_cuda
        and received.cpu().tolist() == [float(rank + 10 * r) for r in range(size)]
        and torch.equal(uneven, received) and splits.tolist() == [1] * size,
        "broadcast": shared.is_cuda and shared.cpu().tolist() == [float(size - 1)] * 4,
        "reducescatter": scattered.is_cuda and scattered.cpu().tolist() == [float(size)] * 2,
        "adasum": adasum.is_cuda and torch.allclose(adasum.cpu(), torch.ones(5)),
    }


def optimizer_and_state() -> dict[str, object]:
    """DistributedOptimizer on a CUDA model matches one process training on the whole
    batch; broadcast_optimizer_state and broadcast_parameters keep tensors on the GPU."""
    rank, size = hvd.rank(), hvd.size()
    torch.manual_seed(0)
    reference = torch.nn.Linear(4, 3).cuda()
    model = torch.nn.Linear(4, 3).cuda()
    model.load_state_dict(reference.state_dict())
    if rank:
        with torch.no_grad():
            for p in model.parameters():
                p.add_(1)  # broadcast_parameters must fix this
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    optimizer = hvd.DistributedOptimizer(torch.optim.Adam(model.parameters(), lr=0.1),
                                         named_parameters=model.named_parameters())
    local = torch.optim.Adam(reference.parameters(), lr=0.1)
    generator = torch.Generator().manual_seed(5)
    data = torch.randn(size * 2, 4, generator=generator).cuda()
    for _ in range(3):
        optimizer.zero_grad()
        model(data[rank * 2:(rank + 1) * 2]).pow(2).mean().backward()
        optimizer.step()
        local.zero_grad()
        torch.stack([reference(data[r * 2:(r + 1) * 2]).pow(2).mean()
                     for r in range(size)]).mean().backward()
        local.step()
    hvd.broadcast_optimizer_state(optimizer, root_rank=0)
    state = optimizer.state_dict()["state"]
    return {
        "matches": all(torch.allclose(a, b, atol=1e-5) for a, b in
                       zip(model.parameters(), reference.parameters(), strict=True)),
        "state_on_gpu": all(v.is_cuda for s in state.values() for k, v in s.items()
                            if k != "step"),
    }


def join_serves_cuda_allreduces() -> list[float]:
    """Rank 0 runs out of data first; its join() must serve the others' CUDA allreduces."""
    rank = hvd.rank()
    results = []
    if rank != 0:
        for _ in range(2):
            results.append(hvd.allreduce(torch.ones(2, device="cuda"), op=hvd.Sum)[0].item())
    hvd.join()
    return results


def commits_read_the_vote_a_step_late(steps: int = 5) -> tuple[list[bool], int]:
    """Every step committed; rank 1 sees a host-change notice from the third step on. On a
    GPU a commit reads the vote of the step before its last (the round's first commit, the
    last step's), so that it does not wait for the GPU: every rank interrupts at the same
    commit, one step later than on CPUs, without an agreement collective of its own."""
    from tests.collectives.test_host_vote import _commit, probed

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(),
                                torch.nn.Linear(16, 4)).cuda()
    optimizer = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                         named_parameters=model.named_parameters())
    state = hvd.elastic.TorchState(model, optimizer)
    interrupted = []
    with probed() as probe:
        for step in range(steps):
            probe.notice = hvd.rank() == 1 and step >= 2
            optimizer.zero_grad()
            x = torch.randn(4, 8, device="cuda")
            torch.nn.functional.cross_entropy(model(x), torch.zeros(4, dtype=torch.long,
                                                                    device="cuda")).backward()
            optimizer.step()
            interrupted.append(_commit(state))
    return interrupted, probe.agreements


def _new_round(number: int) -> None:
    """Leaves this rank's round and builds the next one in-process, as a reset does."""
    from elasticrun.torch.world.session import RoundSession

    live = runtime.current()
    old = live.session
    assert old is not None
    old.leave()
    live.session = RoundSession(number, old.slot, old.store,
                                collective_timeout=old.collective_timeout,
                                key_prefix=f"round-{number}/", backend=old.backend,
                                device=old.device)
    live.session.build()


def _used_bytes() -> int:
    free, total = torch.cuda.mem_get_info(0)
    return total - free


def memory_over_resets(resets: int) -> dict[str, object]:
    """GPU memory after the first and after the last of `resets` rounds, each aborted and
    rebuilt, with an allreduce in each."""
    used = []
    for i in range(resets):
        _new_round(100 + i)
        value = hvd.allreduce(torch.ones(1 << 20, device="cuda"), op=hvd.Sum)[0].item()
        assert value == hvd.size(), value
        torch.cuda.synchronize()
        used.append((_used_bytes(), torch.cuda.memory_allocated(0)))
    return {"first": used[0], "last": used[-1]}


def abort_unblocks_a_stuck_collective() -> dict[str, object]:
    """Rank 0 waits in an allreduce that rank 1 never joins; the round is aborted from
    another thread (as the notice watcher does when the driver says a peer failed): the
    wait raises WorkersFailedError, the process and its CUDA context live on, and the next
    round works."""
    import threading
    import time

    from elasticrun.worker.elastic import WorkersFailedError

    session = runtime.current().session
    assert session is not None
    timer = threading.Timer(1.0, session.abort)
    timer.start()
    outcome, waited = "not raised", 0.0
    if hvd.rank() == 0:
        started = time.monotonic()
        try:
            hvd.allreduce(torch.ones(4, device="cuda"), op=hvd.Sum)
        except WorkersFailedError:
            outcome = "WorkersFailedError"
        waited = time.monotonic() - started
    else:
        time.sleep(2.0)
    timer.join()
    alive = torch.ones(3, device="cuda").sum().item() == 3.0
    _new_round(900)
    after = hvd.allreduce(torch.ones(2, device="cuda"), op=hvd.Sum)[0].item()
    return {"rank": hvd.rank(), "outcome": outcome, "waited": waited, "cuda_alive": alive,
            "next_round": after}
