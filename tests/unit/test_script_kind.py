"""Whether a job's script calls er.init(), as its text says, before it starts
(driver/processes/script_kind.py): a call decides, an import alone never does."""

from __future__ import annotations

from pathlib import Path

import pytest

from elasticrun.driver.processes.script_kind import calls_init


@pytest.mark.parametrize("source", [
    "import elasticrun.torch as er\ner.init()\n",
    "from elasticrun import torch as hvd\nhvd.init()\n",
    "from elasticrun import torch\ntorch.init()\n",
    "import elasticrun.torch\nelasticrun.torch.init()\n",
    "def main():\n    import elasticrun.torch as er\n    er.init()\n",
])
def test_a_script_that_calls_init_is_one(tmp_path: Path, source: str) -> None:
    (tmp_path / "train.py").write_text(source)
    assert calls_init(["python", "train.py", "--lr", "1"], tmp_path)
    assert calls_init(["/venv/bin/python3.11", "-u", "train.py"], tmp_path)


def test_a_module_run_with_dash_m_is_read_too(tmp_path: Path) -> None:
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "train.py").write_text("import elasticrun.torch as er\ner.init()\n")
    assert calls_init(["python", "-m", "pkg.train"], tmp_path)


@pytest.mark.parametrize("source", [
    # an integration's import: a torchrun script still (the flash-commits issue)
    "from elasticrun.integrations.transformers import ElasticCallback\n",
    "from elasticrun.flash import FlashCommits\nflash = FlashCommits(model=m)\n",
    # a helper of elasticrun.torch's, never init()
    "import elasticrun.torch as er\nprint(er.rank())\n",
    "import torch.distributed as dist\ndist.init_process_group('gloo')\n",
    "# import elasticrun.torch as er  (a comment)\nx = 'er.init()'\n",
    "import elasticrun.torch as er\nother.er.init()\n",
])
def test_an_import_alone_never_makes_one(tmp_path: Path, source: str) -> None:
    (tmp_path / "train.py").write_text(source)
    assert not calls_init(["python", "train.py"], tmp_path)


def test_anything_unknown_is_not_one(tmp_path: Path) -> None:
    assert not calls_init(["python", "missing.py"], tmp_path)
    assert not calls_init(["python", "-m", "no.such.module"], tmp_path)
    assert not calls_init(["./train.sh"], tmp_path)
    assert not calls_init([], tmp_path)
