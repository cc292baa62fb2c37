"""The device policy: which backend carries CUDA tensors, which GPU a worker is pinned to,
and the NCCL settings that keep a survivor's process alive (pure; no GPU needed)."""

from __future__ import annotations

import pytest

from elasticrun.job.errors import ConfigError
from elasticrun.torch.world.devices import (
    NCCL_ENV,
    DataPlane,
    Devices,
    choose_backend,
    configure,
    device_index,
    nccl_environment,
)

GPUS = Devices(cuda=4, nccl=True)
CPU_ONLY = Devices(cuda=0, nccl=False)
GPUS_NO_NCCL = Devices(cuda=2, nccl=False)


@pytest.mark.parametrize(("requested", "devices", "chosen"), [
    ("auto", GPUS, "nccl"),
    ("auto", CPU_ONLY, "gloo"),
    ("auto", GPUS_NO_NCCL, "gloo"),
    ("auto", Devices(cuda=0, nccl=True), "gloo"),  # the CUDA wheel on a host without GPUs
    ("gloo", GPUS, "gloo"),
    ("gloo", CPU_ONLY, "gloo"),
    ("nccl", GPUS, "nccl"),
])
def test_backend_choice(requested: str, devices: Devices, chosen: str) -> None:
    assert choose_backend(requested, devices) == chosen


@pytest.mark.parametrize(("devices", "why"), [
    (CPU_ONLY, "torch was built without NCCL"),
    (Devices(cuda=0, nccl=True), "no CUDA device"),
])
def test_nccl_demanded_where_it_cannot_be_had(devices: Devices, why: str) -> None:
    with pytest.raises(ConfigError) as error:
        choose_backend("nccl", devices)
    assert str(error.value) == (f"--backend nccl: this worker cannot use NCCL ({why}); use "
                                "--backend gloo or auto")


def test_unknown_backend_is_named() -> None:
    with pytest.raises(ConfigError, match=r"ELASTICRUN_BACKEND='mpi': expected one of auto, "
                                          r"gloo, nccl"):
        choose_backend("mpi", GPUS)


@pytest.mark.parametrize(("setting", "local_rank", "backend", "index"), [
    (None, 0, "nccl", 0),
    (None, 3, "nccl", 3),
    ("local_rank", 2, "nccl", 2),
    ("none", 2, "nccl", None),
    (" 1 ", 3, "nccl", 1),
    (None, 5, "gloo", 1),  # Gloo lets ranks share a GPU: 5 mod 4
])
def test_pinned_device(setting: str | None, local_rank: int, backend: str,
                       index: int | None) -> None:
    assert device_index(setting, local_rank, GPUS, backend) == index


def test_no_gpu_means_no_pinning() -> None:
    assert device_index("3", 0, CPU_ONLY, "gloo") is None


def test_more_nccl_ranks_than_gpus_is_refused_in_one_line() -> None:
    with pytest.raises(ConfigError) as error:
        device_index(None, 4, GPUS, "nccl")
    assert str(error.value) == ("cuda:4 does not exist: this host has 4 CUDA device(s) "
                                "(local rank 4); give the host at most 4 slot(s) or set "
                                "ELASTICRUN_CUDA_DEVICE")
    with pytest.raises(ConfigError, match="cuda:7 does not exist"):
        device_index("7", 0, GPUS, "gloo")  # an explicit index is never wrapped around


def test_bad_device_setting() -> None:
    with pytest.raises(ConfigError, match=r"ELASTICRUN_CUDA_DEVICE='gpu0': expected "
                                          r"local_rank, none or a device index"):
        device_index("gpu0", 0, GPUS, "nccl")


def test_nccl_environment_keeps_the_process_alive() -> None:
    env: dict[str, str] = {}
    assert nccl_environment(env, timeout=42.4) == []
    assert env["TORCH_NCCL_ASYNC_ERROR_HANDLING"] == "2"  # abort the communicator only
    assert env["TORCH_NCCL_ENABLE_MONITORING"] == "0"
    assert env["TORCH_NCCL_NONBLOCKING_TIMEOUT"] == "42"
    assert set(NCCL_ENV) <= set(env)


def test_nccl_environment_keeps_what_the_user_set_and_says_so() -> None:
    env = {"TORCH_NCCL_ASYNC_ERROR_HANDLING": "3", "TORCH_NCCL_DUMP_ON_TIMEOUT": "0"}
    assert nccl_environment(env, timeout=60) == ["TORCH_NCCL_ASYNC_ERROR_HANDLING=3"]
    assert env["TORCH_NCCL_ASYNC_ERROR_HANDLING"] == "3"


def test_configure_on_this_machine() -> None:
    """On a machine without GPUs (CI) auto is Gloo, nothing is pinned and NCCL's
    environment is left alone; nccl is refused."""
    detected = Devices.detect()
    if detected.cuda:
        pytest.skip("this machine has a GPU: tests/gpu covers it")
    env = {"ELASTICRUN_BACKEND": "auto"}
    assert configure(0, env) == (DataPlane("gloo", None, agree=True), [])
    assert env == {"ELASTICRUN_BACKEND": "auto"}
    with pytest.raises(ConfigError, match="--backend nccl: this worker cannot use NCCL"):
        configure(0, {"ELASTICRUN_BACKEND": "nccl"})
