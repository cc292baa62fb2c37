"""The file a kept commit is (commit_files.py): what it holds, that it is whole or absent, which
one is the newest, and that a file of another model is refused before anything is loaded."""

from __future__ import annotations

import io
import os
import subprocess
import sys
import zipfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

from elasticrun.torch.elastic import commit_files
from elasticrun.torch.elastic.commit_files import (
    WHOLE,
    CheckpointMismatchError,
    UnreadableCommitError,
    load_checkpoint,
)
from elasticrun.torch.elastic.sampler import ElasticSampler


def _model(seed: int = 0, *widths: int) -> nn.Sequential:
    torch.manual_seed(seed)
    sizes = widths or (3, 4, 2)
    layers: list[nn.Module] = []
    for inputs, outputs in zip(sizes, sizes[1:], strict=False):
        layers += [nn.Linear(inputs, outputs), nn.ReLU()]
    return nn.Sequential(*layers[:-1])


def _stepped(model: nn.Module, optimizer: torch.optim.Optimizer) -> None:
    """One training step: the optimizer gets its state (momentum buffers)."""
    inputs = torch.randn(5, next(model.parameters()).shape[1])
    model(inputs).pow(2).sum().backward()
    optimizer.step()
    optimizer.zero_grad()


def _sgd(model: nn.Module) -> torch.optim.SGD:
    return torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)


def _sampler_state() -> dict[str, Any]:
    sampler = ElasticSampler(range(20), shuffle=True, seed=3)
    sampler.set_epoch(2)
    sampler.record_batch(0, 4)
    return sampler.state_dict()


def _content(commit: int = 7, model: nn.Module | None = None,
             optimizer: torch.optim.Optimizer | None = None) -> dict[str, Any]:
    if model is None:
        model = _model()
        optimizer = _sgd(model)
        _stepped(model, optimizer)
    saved = {"model": model.state_dict(),
             "optimizer": None if optimizer is None else optimizer.state_dict(),
             "objects": {"epoch": 2, "sampler": _sampler_state(), "note": "kept"}}
    return commit_files.payload(commit, WHOLE, saved)


def _write(directory: Path, commit: int, content: dict[str, Any] | None = None,
           durable: bool = False) -> commit_files.CommitFile:
    return commit_files.write(directory, commit, WHOLE, content or _content(commit), durable)


def _dead_pid() -> int:
    process = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                             capture_output=True, text=True, check=True, timeout=60)
    return int(process.stdout)


def _torn(directory: Path, commit: int, pid: int) -> Path:
    """What a writer killed midway leaves: a temporary file with part of a commit."""
    path = directory / f".{commit_files.file_name(commit, WHOLE)}.tmp-{pid}"
    path.write_bytes(b"PK\x03\x04 a part of a zip")
    return path


def _same(left: Any, right: Any) -> bool:
    """Equal trees, tensors compared bitwise (dtype too)."""
    if isinstance(left, torch.Tensor):
        return isinstance(right, torch.Tensor) and left.dtype == right.dtype \
            and torch.equal(left, right)
    if isinstance(left, dict):
        return isinstance(right, dict) and left.keys() == right.keys() \
            and all(_same(left[k], right[k]) for k in left)
    if isinstance(left, list | tuple):
        return type(left) is type(right) and len(left) == len(right) \
            and all(_same(a, b) for a, b in zip(left, right, strict=True))
    return bool(left == right)


# --- writing and reading ------------------------------------------------------------------
def test_a_written_commit_reads_back_equal(tmp_path: Path) -> None:
    content = _content(7)
    assert content["optimizer"]["state"][0]["momentum_buffer"].shape == (4, 3)
    written = _write(tmp_path, 7, content)
    assert written == commit_files.CommitFile(tmp_path / "commit-000000000007.whole.pt", 7,
                                              WHOLE)
    back = commit_files.read(written.path)
    assert _same(back, content)
    assert back["objects"]["sampler"]["processed_indices"] == \
        content["objects"]["sampler"]["processed_indices"] != []


def test_a_flipped_bit_in_a_tensor_is_refused_not_loaded(tmp_path: Path) -> None:
    """torch.load checks no CRC: read() does, so damaged weights never load in silence."""
    content = _content(4)
    written = _write(tmp_path, 4, content)
    with zipfile.ZipFile(written.path) as archive:
        record = next(i for i in archive.infolist() if "/data/" in i.filename
                      and i.file_size >= 16)
    raw = bytearray(written.path.read_bytes())
    local = record.header_offset  # the local header's own name and extra lengths
    start = local + 30 + int.from_bytes(raw[local + 26:local + 28], "little") \
        + int.from_bytes(raw[local + 28:local + 30], "little")
    raw[start + 3] ^= 0x10
    written.path.write_bytes(bytes(raw))
    assert torch.load(written.path, weights_only=False)["commit"] == 4  # torch alone: silent
    with pytest.raises(UnreadableCommitError, match=r"damaged \(CRC-32\)"):
        commit_files.read(written.path)


def test_a_commit_file_is_plain_torch_and_private(tmp_path: Path) -> None:
    written = _write(tmp_path, 1, durable=True)
    assert (written.path.stat().st_mode & 0o777) == 0o600
    plain = torch.load(written.path, weights_only=False)
    assert plain["format"] == commit_files.FORMAT and plain["commit"] == 1
    assert os.listdir(tmp_path) == [written.path.name]  # no temporary file left


def test_a_failed_write_leaves_nothing(tmp_path: Path) -> None:
    content = _content(3)
    content["objects"]["unpicklable"] = lambda: None
    with pytest.raises(Exception):  # noqa: B017 - whatever pickle says; nothing must be left
        _write(tmp_path, 3, content)
    assert os.listdir(tmp_path) == []


# --- complete, newest, prune --------------------------------------------------------------
def test_newest_is_the_highest_commit_not_the_latest_written(tmp_path: Path) -> None:
    for commit in (3, 12, 5):
        _write(tmp_path, commit)
    assert [f.commit for f in commit_files.complete(tmp_path)] == [3, 5, 12]
    newest = commit_files.newest(tmp_path, WHOLE)
    assert newest is not None and newest.commit == 12
    assert commit_files.newest(tmp_path, "shard-0") is None
    assert commit_files.newest(tmp_path / "absent", WHOLE) is None


def test_a_torn_write_is_never_taken(tmp_path: Path) -> None:
    _write(tmp_path, 4)
    _torn(tmp_path, 9, _dead_pid())
    (tmp_path / "commit-000000000010.whole.pt.partial").write_bytes(b"x")
    assert [f.commit for f in commit_files.complete(tmp_path)] == [4]
    newest = commit_files.newest(tmp_path, WHOLE)
    assert newest is not None and newest.commit == 4


def test_prune_keeps_the_newest_and_removes_dead_writers_temporaries(tmp_path: Path) -> None:
    for commit in (1, 2):
        _write(tmp_path, commit)
    dead = _torn(tmp_path, 3, _dead_pid())
    live = _torn(tmp_path, 4, os.getpid())  # a write in flight: its writer is alive
    keep = _write(tmp_path, 5)
    commit_files.prune(tmp_path, keep)
    assert [f.commit for f in commit_files.complete(tmp_path)] == [5]
    assert not dead.exists() and live.exists()


def test_prune_leaves_other_holdings(tmp_path: Path) -> None:
    other = commit_files.write(tmp_path, 1, "shard-1", _content(1), durable=False)
    commit_files.prune(tmp_path, _write(tmp_path, 2))
    assert other.path.exists()


# --- unreadable files ---------------------------------------------------------------------
def _saved_bytes(value: Any) -> bytes:
    buffer = io.BytesIO()
    torch.save(value, buffer)
    return buffer.getvalue()


def _commit_bytes() -> bytes:
    return _saved_bytes(_content(2))


UNREADABLE: dict[str, Callable[[], bytes]] = {
    "empty": lambda: b"",
    "truncated to half": lambda: _commit_bytes()[:len(_commit_bytes()) // 2],
    "its end cut": lambda: _commit_bytes()[:-10],
    "another torch file": lambda: _saved_bytes({"model": {}}),
    "a torch list": lambda: _saved_bytes([1, 2]),
    "another version": lambda: _saved_bytes({**_content(2), "version": 99}),
    "text": lambda: b"hello, this is text\n",
    "random bytes": lambda: bytes(range(256)) * 4,
}


@pytest.mark.parametrize("kind", list(UNREADABLE))
def test_reading_a_file_that_is_no_commit_says_so_in_one_line(tmp_path: Path,
                                                              kind: str) -> None:
    path = tmp_path / "commit-000000000002.whole.pt"
    path.write_bytes(UNREADABLE[kind]())
    with pytest.raises(UnreadableCommitError) as caught:
        commit_files.read(path)
    message = str(caught.value)
    assert "\n" not in message and message.startswith(str(path))


# --- mismatch -----------------------------------------------------------------------------
def _file_model() -> tuple[nn.Sequential, torch.optim.SGD, dict[str, Any]]:
    model = _model(0)
    optimizer = _sgd(model)
    _stepped(model, optimizer)
    return model, optimizer, _content(1, model, optimizer)


def _reordered(model: nn.Module) -> torch.optim.SGD:
    """Same parameters, another order: the file's momentum of parameter 0 is the wrong shape
    here."""
    return torch.optim.SGD(list(model.parameters())[::-1], lr=0.1, momentum=0.9)


def _two_groups(model: nn.Sequential) -> torch.optim.SGD:
    groups: list[dict[str, Any]] = [{"params": model[0].parameters()},
                                    {"params": model[2].parameters(), "lr": 0.01}]
    return torch.optim.SGD(groups, lr=0.1, momentum=0.9)


Here = tuple[nn.Module, torch.optim.Optimizer | None]


def _wider() -> Here:
    return _model(1, 3, 5, 2), None


def _deeper() -> Here:
    return _model(1, 3, 4, 2, 2), None


def _shallower() -> Here:
    return _model(1, 3, 4), None


def _double() -> Here:
    return _model(1).double(), None


def _more_groups() -> Here:
    model = _model(1)
    return model, _two_groups(model)


def _fewer_parameters() -> Here:
    model = _model(1)
    return model, torch.optim.SGD(model[0].parameters(), lr=0.1, momentum=0.9)


def _other_order() -> Here:
    model = _model(1)
    return model, _reordered(model)


MISMATCHES: dict[str, tuple[Callable[[], Here], str]] = {
    "another layer shape": (_wider, "model parameter '0.weight' is [4, 3] float32 in the "
                                    "file, [5, 3] float32 in this model"),
    "a parameter the file lacks": (_deeper, "model parameter '4.weight' is not in the file"),
    "a parameter this model lacks": (_shallower,
                                     "the file's model has '2.weight', this model has not"),
    "another dtype": (_double, "model parameter '0.weight' is [4, 3] float32 in the file, "
                               "[4, 3] float64 in this model"),
    "another count of groups": (_more_groups, "the file's optimizer has 1 parameter "
                                              "group(s), this one 2"),
    "another count of parameters in a group": (
        _fewer_parameters, "optimizer parameter group 0 has 4 parameter(s) in the file, 2 "
                           "here"),
    "momentum of another shape": (
        _other_order, "optimizer state 'momentum_buffer' of parameter 0 is [4, 3] float32 in "
                      "the file, its parameter [2] here"),
}


@pytest.mark.parametrize("kind", list(MISMATCHES))
def test_mismatch_names_the_first_difference_in_one_line(kind: str) -> None:
    _, _, content = _file_model()
    make, expected = MISMATCHES[kind]
    model, optimizer = make()
    problem = commit_files.mismatch(content, model.state_dict(), optimizer)
    assert problem == expected


def test_the_same_shapes_fit_even_with_a_fresh_optimizer() -> None:
    _, _, content = _file_model()
    model = _model(1)
    assert commit_files.mismatch(content, model.state_dict(), _sgd(model)) is None
    fresh = _model(2)
    stepped = _sgd(fresh)
    _stepped(fresh, stepped)
    unstepped = _content(1, _model(3), _sgd(_model(3)))
    assert unstepped["optimizer"]["state"] == {}
    assert commit_files.mismatch(unstepped, fresh.state_dict(), stepped) is None


def test_adam_scalar_step_state_is_no_shape_to_compare() -> None:
    model = _model(0)
    adam = torch.optim.Adam(model.parameters(), lr=0.01)
    _stepped(model, adam)
    assert adam.state_dict()["state"][0]["step"].dim() == 0
    content = _content(1, model, adam)
    here = _model(1)
    assert commit_files.mismatch(content, here.state_dict(),
                                 torch.optim.Adam(here.parameters())) is None


def test_a_file_without_model_or_optimizer_state_is_a_mismatch() -> None:
    content = commit_files.payload(1, WHOLE, {"objects": {}})
    model = _model(1)
    assert commit_files.mismatch(content, model.state_dict(), None) == \
        "the file holds no model state"
    assert commit_files.mismatch(content, None, _sgd(model)) == \
        "the file holds no optimizer state"
    assert commit_files.mismatch(content, None, None) is None


# --- load_checkpoint ----------------------------------------------------------------------
def test_load_checkpoint_from_a_directory_takes_the_newest_complete(tmp_path: Path) -> None:
    model, optimizer, _ = _file_model()
    _write(tmp_path, 3, _content(3, _model(5), _sgd(_model(5))))
    _write(tmp_path, 8, _content(8, model, optimizer))
    _torn(tmp_path, 9, _dead_pid())
    here = _model(1)
    here_optimizer = _sgd(here)
    content = load_checkpoint(tmp_path, here, here_optimizer)
    assert content["commit"] == 8 and content["objects"]["epoch"] == 2
    assert _same(here.state_dict(), model.state_dict())
    assert _same(here_optimizer.state_dict()["state"], optimizer.state_dict()["state"])


def test_load_checkpoint_from_a_file(tmp_path: Path) -> None:
    model, optimizer, content = _file_model()
    written = _write(tmp_path, 1, content)
    _write(tmp_path, 2, _content(2, _model(5), _sgd(_model(5))))  # a newer one: not taken
    here = _model(1)
    assert load_checkpoint(str(written.path), here)["commit"] == 1
    assert _same(here.state_dict(), model.state_dict())


def test_load_checkpoint_refuses_a_mismatch_and_loads_nothing(tmp_path: Path) -> None:
    _, _, content = _file_model()
    _write(tmp_path, 1, content)
    here = _model(1)  # the model fits; the optimizer does not
    optimizer = _two_groups(here)
    _stepped(here, optimizer)
    model_before = {k: v.clone() for k, v in here.state_dict().items()}
    optimizer_before = optimizer.state_dict()
    optimizer_before = {"state": {k: {n: t.clone() for n, t in s.items()}
                                  for k, s in optimizer_before["state"].items()},
                        "param_groups": optimizer_before["param_groups"]}
    with pytest.raises(CheckpointMismatchError) as caught:
        load_checkpoint(tmp_path, here, optimizer)
    assert "parameter group(s)" in str(caught.value) and "\n" not in str(caught.value)
    assert _same(here.state_dict(), model_before)
    assert _same(optimizer.state_dict(), optimizer_before)


def test_load_checkpoint_of_a_directory_without_commits(tmp_path: Path) -> None:
    _torn(tmp_path, 1, _dead_pid())
    with pytest.raises(FileNotFoundError, match="no complete elasticrun commit"):
        load_checkpoint(tmp_path, _model())
