"""Elastic HSDP: a model sharded with FSDP2 inside each replica group (`--shard-size S`),
replicated across the groups by elasticrun.

`shard_mesh()` is the 1-D DeviceMesh of this worker's replica group, for
`fully_shard(module, mesh=er.shard_mesh())`. FSDP holds on to the mesh and to its process
group, while elasticrun builds new groups every round (a round's groups are aborted with
it): after every round this worker joins, the mesh and the FSDP modules of every model
given to `replicate()` are pointed at the round's group of the same replica group, so the
mesh stays valid for the life of the worker. A worker's shard index never changes (the
driver keeps replica groups within hosts), so the shards it holds fit every round.

`replicate(model)` hands the gradient reduction across replica groups to elasticrun: FSDP
reduce-scatters (averages) inside the group, and its all-reduce hook then averages the
shard over the current round's groups, on the round's abortable group for this shard index.
"""

from __future__ import annotations

import logging
import weakref
from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as dist

from elasticrun.job.errors import ConfigError
from elasticrun.torch.world import plane, runtime
from elasticrun.torch.world.replicas import ReplicaGroups, ReplicaLayout

if TYPE_CHECKING:
    from torch.distributed.device_mesh import DeviceMesh

log = logging.getLogger("elasticrun.worker")

_mesh: DeviceMesh | None = None  # the mesh handed out, for the life of this worker
_mesh_shard_rank = 0  # the shard index it was made for
_models: weakref.WeakSet[torch.nn.Module] = weakref.WeakSet()  # given to replicate()


def layout() -> ReplicaLayout:
    """This worker's place among the current round's replica groups."""
    current = runtime.current()
    slot = current.slot
    return ReplicaLayout(slot.rank, slot.size, current.shard_size)


def shard_rank() -> int:
    """This worker's place in its replica group: the index of the shard it holds."""
    return layout().shard_rank


def shard_size() -> int:
    """The number of ranks in a replica group (the job's --shard-size)."""
    return layout().shard_size


def replica_rank() -> int:
    """The index of this worker's replica group in the current round."""
    return layout().replica_rank


def num_replicas() -> int:
    """The number of replica groups in the current round."""
    return layout().num_replicas


def _replica_groups() -> ReplicaGroups:
    current = runtime.current()
    session = current.session
    if session is None or session.replicas is None:
        raise ConfigError(f"elastic HSDP needs replica groups of 2 ranks or more: run the job "
                          f"with --shard-size 2 or more (it is {current.shard_size})")
    return session.replicas


def shard_mesh() -> DeviceMesh:
    """The 1-D DeviceMesh of this worker's replica group, for
    `fully_shard(module, mesh=er.shard_mesh())`. The same object for the life of the worker:
    elasticrun points it at each round's group."""
    global _mesh, _mesh_shard_rank
    if _mesh is None:
        from torch.distributed.device_mesh import DeviceMesh

        groups = _replica_groups()
        device = "cuda" if groups.nccl else "cpu"
        _mesh = DeviceMesh.from_group(groups.shard, device)
        _mesh_shard_rank = groups.layout.shard_rank
        runtime.current().on_round.append(_rebind)
    return _mesh


def replicate(model: torch.nn.Module) -> torch.nn.Module:
    """Makes elasticrun average the gradients of `model`'s FSDP modules (sharded on
    `shard_mesh()`) across the replica groups of every round, and keep them on the round's
    groups. Call it once, after `fully_shard`; returns `model`."""
    from torch.distributed.fsdp import FSDPModule

    sharded = [m for m in model.modules() if isinstance(m, FSDPModule)]
    mesh = shard_mesh()
    if not sharded or any(not _sharded_on(m, mesh) for m in sharded):
        raise ValueError("er.replicate(model): expected a model sharded with "
                         "fully_shard(..., mesh=er.shard_mesh())")
    for module in sharded:
        module.set_all_reduce_hook(_average_across_replicas)
    _models.add(model)
    return model


def _sharded_on(module: Any, mesh: DeviceMesh) -> bool:
    return all(info.mesh is mesh for info in _mesh_infos(module))


def _mesh_infos(module: Any) -> list[Any]:
    """The FSDP mesh infos of one FSDP module (its groups are read through them)."""
    infos: dict[int, Any] = {}
    for param_group in module._get_fsdp_state()._fsdp_param_groups:
        candidates = [param_group.mesh_info, param_group.post_forward_mesh_info]
        for param in param_group.fsdp_params:
            candidates += [param.mesh_info, param.post_forward_mesh_info]
        infos.update((id(info), info) for info in candidates if info is not None)
    return list(infos.values())


def _average_across_replicas(gradient: torch.Tensor) -> None:
    """FSDP's all-reduce hook: the reduce-scattered shard, averaged over the round's
    replica groups (abortably: a lost group breaks the round, and this raises)."""
    groups = _replica_groups()
    replicas = groups.layout.num_replicas
    if replicas == 1:
        return
    if groups.nccl:
        dist.all_reduce(gradient, group=groups.cross)  # aborted with the round's communicators
    else:
        plane.all_reduce(gradient, group=groups.cross)  # waited abortably, as every Gloo work
    gradient.div_(replicas)


def _rebind() -> None:
    """After a round is joined: the mesh and the replicated models' FSDP modules use the
    round's group of this worker's replica group."""
    if _mesh is None:
        return
    from torch.distributed.fsdp import FSDPModule

    groups = _replica_groups()
    shard = groups.shard
    if groups.layout.shard_rank != _mesh_shard_rank:
        raise RuntimeError(f"this worker's shard index changed from {_mesh_shard_rank} to "
                           f"{groups.layout.shard_rank}: its shards no longer fit its place")
    _mesh._dim_group_names = [shard.group_name]
    _mesh._pg_registry[shard.group_name] = shard
    _mesh._rank_map = torch.tensor(groups.layout.group_ranks(groups.layout.replica_rank),
                                   dtype=_mesh._rank_map.dtype)
    for model in list(_models):
        for module in model.modules():
            if isinstance(module, FSDPModule):
                for info in _mesh_infos(module):
                    if info.mesh is _mesh:
                        info.shard_process_group = shard


def reset_iterations(model: torch.nn.Module) -> None:
    """After a failure mid-forward or mid-backward: the model's root FSDP modules drop the
    failed iteration (in-flight gradients, unsharded parameters), so that the next forward
    starts clean. Nothing for a model without FSDP modules."""
    from torch.distributed.fsdp import FSDPModule

    for module in model.modules():
        if isinstance(module, FSDPModule) and module._get_fsdp_state()._is_root:
            try:
                module.reset_iter_state()
            except Exception as exc:  # a collective of the broken round failed as it ended
                log.debug("resetting the FSDP iteration raised: %s", exc)
