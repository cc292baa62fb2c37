"""The private torch APIs elasticrun relies on (names with a leading underscore, which torch
may change in any release): each still exists in the installed torch and behaves as the code
that uses it expects. A failure names the API and the elasticrun module that uses it.

Where torch has a public name for the same thing, elasticrun uses that instead (the default
process group is `torch.distributed.group.WORLD`); test_the_inventory_is_whole keeps this
list and the code together."""

from __future__ import annotations

import ast
import datetime
import importlib.util
import sys
import warnings
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
from torch._C._distributed_c10d import Backend as C10dBackend

import elasticrun
from elasticrun.torch.sync_batch_norm import SyncBatchNorm
from elasticrun.torch.world import groups, plane

PACKAGE = Path(elasticrun.__file__).resolve().parent
CPU = torch.device("cpu")

# Each private API, the elasticrun module(s) that use it. The ones marked "by hand" are
# reached through an object (a group, an options instance) and are not found by the scan.
INVENTORY = {
    "_set_pg_timeout": "elasticrun/torch/world/groups.py",
    "_world": "elasticrun/torch/world/groups.py",
    "_timeout": "elasticrun/torch/world/groups.py",  # by hand: ProcessGroupNCCL.Options
    "_get_backend": "elasticrun/torch/world/groups.py",  # by hand: ProcessGroup
    "_foreach_copy_": "elasticrun/torch/elastic/snapshot.py",
    "_BatchNorm": "elasticrun/torch/sync_batch_norm.py",
    "_dynamo": "elasticrun/worker/template.py",  # preloaded by name
    # by hand, FSDP2 and DeviceMesh internals: a replica group's groups are rebuilt every
    # round, and the mesh and FSDP's mesh infos are pointed at the new one
    "_get_fsdp_state": "elasticrun/torch/hsdp.py",
    "_fsdp_param_groups": "elasticrun/torch/hsdp.py",
    "_dim_group_names": "elasticrun/torch/hsdp.py",
    "_pg_registry": "elasticrun/torch/hsdp.py",
    "_rank_map": "elasticrun/torch/hsdp.py",
    "_is_root": "elasticrun/torch/hsdp.py",
}
TORCH_ROOTS = {"torch", "dist", "F", "nn"}  # how elasticrun's modules name torch


def changed(name: str, what: str = "") -> str:
    return (f"torch changed {name}, used by {INVENTORY[name]}"
            + (f": {what}" if what else ""))


@pytest.fixture
def world(tmp_path: Path) -> Iterator[dist.ProcessGroup]:
    """A 1-rank Gloo default group on a FileStore; afterwards no group is left, and
    sys.excepthook (which torch wraps at every default group it builds) is as it was."""
    assert not dist.is_initialized(), "a process group was left by an earlier test"
    hook = sys.excepthook
    store = dist.FileStore(str(tmp_path / "store"), 1)
    dist.init_process_group("gloo", store=store, rank=0, world_size=1,
                            timeout=datetime.timedelta(seconds=30))
    try:
        group = dist.group.WORLD
        assert group is not None
        yield group
    finally:
        dist.destroy_process_group()
        sys.excepthook = hook


def test_the_default_group_has_a_public_name(world: dist.ProcessGroup) -> None:
    """elasticrun reaches the default group as dist.group.WORLD (plane.py, groups.py)."""
    assert groups.default_group() is world
    assert plane.process_group_for("cpu") is world
    assert world.size() == 1 and dist.get_world_size() == 1


def test_without_a_group_there_is_no_default_group() -> None:
    assert groups.default_group() is None
    with pytest.raises(ValueError, match="not been initialized"):
        plane.process_group_for("cpu")


def test_set_pg_timeout(world: dist.ProcessGroup) -> None:
    """A round's Gloo group connects under a short timeout, then its collectives run under
    the collective timeout: _set_pg_timeout(timedelta) sets it on the default group (on a
    torch without the public set_timeout: groups.set_default_timeout)."""
    if hasattr(dist, "set_timeout"):
        pytest.skip(f"torch {torch.__version__} has dist.set_timeout: elasticrun does not use "
                    "its deprecated _set_pg_timeout")
    setter = getattr(dist.distributed_c10d, "_set_pg_timeout", None)
    assert callable(setter), changed("_set_pg_timeout", "torch.distributed.distributed_c10d "
                                                        "no longer has it")
    setter(datetime.timedelta(seconds=3))
    backend = world._get_backend(CPU)
    assert backend.options._timeout == datetime.timedelta(seconds=3), changed(
        "_set_pg_timeout", "the default Gloo group's timeout did not change")
    tensor = torch.ones(2)
    dist.all_reduce(tensor)  # the group still works under its new timeout
    assert tensor.tolist() == [1.0, 1.0]


def test_world_group_count(tmp_path: Path) -> None:
    """torch names a default group's store keys from _world.group_count; a failed build
    puts the count back (groups.set_group_count), a destroyed group resets it to 0."""
    world_state = getattr(dist.distributed_c10d, "_world", None)
    assert isinstance(getattr(world_state, "group_count", None), int), changed(
        "_world", "distributed_c10d._world.group_count is gone")
    before = groups.group_count()
    assert before is not None, changed("_world", "elasticrun cannot read the group counter")
    hook = sys.excepthook
    dist.init_process_group("gloo", store=dist.FileStore(str(tmp_path / "store"), 1),
                            rank=0, world_size=1)
    try:
        assert groups.group_count() == before + 1, changed(
            "_world", "building the default group no longer counts one group")
        groups.set_group_count(before + 5)
        assert dist.distributed_c10d._world.group_count == before + 5, changed(
            "_world", "the group counter cannot be set")
    finally:
        dist.destroy_process_group()
        sys.excepthook = hook
    assert groups.group_count() == 0, changed(
        "_world", "destroying the default group no longer resets the group counter")


def test_backend_options_timeout() -> None:
    """init_nccl_group sets ProcessGroupNCCL.Options()._timeout (torch warns unless it
    agrees with new_group's timeout); the property is Backend.Options' own."""
    assert isinstance(getattr(C10dBackend.Options, "_timeout", None), property), changed(
        "_timeout", "Backend.Options has no _timeout property")
    options: C10dBackend.Options
    if dist.is_nccl_available():  # the class init_nccl_group uses
        options = dist.ProcessGroupNCCL.Options()
    else:  # a CPU build has no NCCL: its base
        options = C10dBackend.Options(backend="nccl")
    options._timeout = datetime.timedelta(seconds=7)
    assert options._timeout == datetime.timedelta(seconds=7), changed(
        "_timeout", f"{type(options).__qualname__}._timeout does not keep what is set")


def test_get_backend_abort(world: dist.ProcessGroup) -> None:
    """abort_nccl aborts a group's NCCL communicators through
    group._get_backend(torch.device("cuda")).abort()."""
    assert callable(getattr(world, "_get_backend", None)), changed(
        "_get_backend", "ProcessGroup has no _get_backend")
    backend = world._get_backend(CPU)
    assert isinstance(backend, C10dBackend), changed(
        "_get_backend", f"it returns a {type(backend).__qualname__}, not a Backend")
    assert callable(getattr(backend, "abort", None)), changed(
        "_get_backend", "its backend has no abort()")
    if dist.is_nccl_available():
        assert callable(getattr(dist.ProcessGroupNCCL, "abort", None)), changed(
            "_get_backend", "ProcessGroupNCCL has no abort()")


@pytest.mark.parametrize("non_blocking", [False, True])
def test_foreach_copy(non_blocking: bool) -> None:
    """A commit refills its copies in one call: torch._foreach_copy_(targets, sources,
    non_blocking=...) copies each source into its target, in place."""
    copy = getattr(torch, "_foreach_copy_", None)
    assert callable(copy), changed("_foreach_copy_", "torch has no _foreach_copy_")
    sources = [torch.arange(6.0).view(2, 3), torch.tensor([1, 2, 3]), torch.tensor([True])]
    targets = [torch.zeros(2, 3), torch.zeros(3, dtype=torch.long), torch.tensor([False])]
    kept = [t.data_ptr() for t in targets]
    copy(targets, [s.detach() for s in sources], non_blocking=non_blocking)
    assert all(torch.equal(t, s) for t, s in zip(targets, sources, strict=True)), changed(
        "_foreach_copy_", "the targets do not hold the sources")
    assert [t.data_ptr() for t in targets] == kept, changed(
        "_foreach_copy_", "the targets were not filled in place")


def test_batchnorm_base() -> None:
    """SyncBatchNorm subclasses torch.nn.modules.batchnorm._BatchNorm (as torch's own
    SyncBatchNorm does) and overrides its _check_input_dim."""
    from torch.nn.modules import batchnorm

    base = getattr(batchnorm, "_BatchNorm", None)
    assert isinstance(base, type) and issubclass(base, torch.nn.Module), changed(
        "_BatchNorm", "torch.nn.modules.batchnorm._BatchNorm is gone")
    assert issubclass(torch.nn.BatchNorm2d, base) and hasattr(base, "_check_input_dim"), \
        changed("_BatchNorm", "it is no longer BatchNorm's base with a _check_input_dim")
    module = SyncBatchNorm(4, eps=1e-3, momentum=0.2, affine=True, track_running_stats=True,
                           device="cpu", dtype=torch.float32)
    reference = torch.nn.BatchNorm2d(4)
    assert module.state_dict().keys() == reference.state_dict().keys(), changed(
        "_BatchNorm", "its parameters and buffers differ from BatchNorm2d's")
    module.eval()
    inputs = torch.randn(3, 4, 2, 2)
    assert torch.allclose(module(inputs), reference.eval()(inputs), atol=1e-2)


def test_dynamo_module() -> None:
    """The worker template preloads torch._dynamo (a failed import is skipped, only
    slower)."""
    assert importlib.util.find_spec("torch._dynamo") is not None, changed(
        "_dynamo", "torch._dynamo is gone")


def _private_torch_names() -> dict[str, set[str]]:
    """Private names elasticrun reaches through a name for torch (torch., dist., F., nn.),
    imports from torch, asks getattr for on torch, or names as a torch module."""
    found: dict[str, set[str]] = {}

    def note(name: str, path: Path) -> None:
        if name.startswith("_") and not name.startswith("__"):
            found.setdefault(name, set()).add(str(path.relative_to(PACKAGE.parent)))

    def rooted(node: ast.expr) -> bool:
        while isinstance(node, ast.Attribute):
            node = node.value
        return isinstance(node, ast.Name) and node.id in TORCH_ROOTS

    for path in sorted(PACKAGE.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Attribute) and rooted(node.value):
                note(node.attr, path)
            elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith("torch"):
                for alias in node.names:
                    note(alias.name, path)
                for part in (node.module or "").split("."):
                    note(part, path)
            elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
                  and node.func.id in ("getattr", "hasattr") and len(node.args) > 1
                  and rooted(node.args[0]) and isinstance(node.args[1], ast.Constant)):
                note(str(node.args[1].value), path)
            elif (isinstance(node, ast.Constant) and isinstance(node.value, str)
                  and node.value.startswith("torch.") and " " not in node.value):
                for part in node.value.split("."):
                    note(part, path)
    return found


def test_the_inventory_is_whole() -> None:
    """Every private torch name the scan finds in elasticrun/ has its test here."""
    found = _private_torch_names()
    untested = {name: sorted(paths) for name, paths in found.items() if name not in INVENTORY}
    assert not untested, f"private torch APIs without a test in this file: {untested}"
    for name, paths in found.items():
        assert paths <= {INVENTORY[name]}, f"{name} is used by {sorted(paths)} too"


def test_fsdp_groups_can_be_pointed_at_a_new_group(world: dist.ProcessGroup) -> None:
    """hsdp.py points a sharded model at each round's group: FSDP2 reads its groups through
    its mesh infos (_get_fsdp_state()._fsdp_param_groups, .mesh_info, .fsdp_params), the
    DeviceMesh resolves its group from _dim_group_names and _pg_registry, and _rank_map holds
    its global ranks; reset_iter_state (on the root, _is_root) drops a failed iteration."""
    from torch.distributed.device_mesh import DeviceMesh
    from torch.distributed.fsdp import fully_shard

    mesh = DeviceMesh.from_group(world, "cpu")
    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Linear(4, 2))
    fully_shard(model[0], mesh=mesh)
    fully_shard(model, mesh=mesh)
    state = model._get_fsdp_state()  # type: ignore[operator]
    param_group = state._fsdp_param_groups[0]
    assert param_group.mesh_info.shard_process_group is world, changed("_get_fsdp_state")
    assert all(p.mesh_info.mesh is mesh for p in param_group.fsdp_params), changed(
        "_fsdp_param_groups", "FSDPParam.mesh_info no longer holds the mesh")
    assert mesh._dim_group_names == [world.group_name], changed("_dim_group_names")
    assert mesh._pg_registry[world.group_name] is world, changed("_pg_registry")
    assert mesh._rank_map.tolist() == [0], changed("_rank_map")
    replacement = dist.new_group([0])
    mesh._dim_group_names = [replacement.group_name]
    mesh._pg_registry[replacement.group_name] = replacement
    param_group.mesh_info.shard_process_group = replacement
    assert mesh.get_group() is replacement, changed("_dim_group_names",
                                                    "the mesh did not take the new group")
    assert param_group._all_gather_process_group is replacement, changed(
        "_fsdp_param_groups", "FSDP did not take the new group")
    model(torch.randn(3, 4)).sum().backward()
    assert state._is_root is True, changed("_is_root")
    model(torch.randn(3, 4))  # a forward left mid-iteration
    model.reset_iter_state()  # type: ignore[operator]
    assert all(isinstance(p, torch.distributed.tensor.DTensor) for p in model.parameters())


# --- the calls that differ between the releases elasticrun supports (2.13, 2.14) ---------
def test_the_default_timeout_is_set_without_a_warning(world: dist.ProcessGroup) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        groups.set_default_timeout(datetime.timedelta(seconds=3))
    assert world._get_backend(CPU).options._timeout == datetime.timedelta(seconds=3)
    tensor = torch.ones(2)
    dist.all_reduce(tensor)  # the group still works under its new timeout
    assert tensor.tolist() == [1.0, 1.0]


def test_new_group_gives_a_member_its_group(world: dist.ProcessGroup) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        group = groups.new_group([0], datetime.timedelta(seconds=5))
    assert isinstance(group, dist.ProcessGroup)
    assert group.size() == 1
    tensor = torch.ones(1)
    dist.all_reduce(tensor, group=group)
    assert tensor.item() == 1.0
    dist.destroy_process_group(group)
