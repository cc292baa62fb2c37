"""Whether a job's script is written for elasticrun, read before it starts
(driver/processes/script_kind.py)."""

from __future__ import annotations

from pathlib import Path

from elasticrun.driver.processes.script_kind import imports_elasticrun


def test_a_script_that_imports_elasticrun_anywhere_is_one(tmp_path: Path) -> None:
    for source in ("import elasticrun.torch as er\n",
                   "from elasticrun import torch as hvd\n",
                   "def main():\n    import elasticrun.torch as er\n    er.init()\n"):
        (tmp_path / "train.py").write_text(source)
        assert imports_elasticrun(["python", "train.py", "--lr", "1"], tmp_path)
        assert imports_elasticrun(["/venv/bin/python3.11", "-u", "train.py"], tmp_path)
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "train.py").write_text("import elasticrun.torch as er\n")
    assert imports_elasticrun(["python", "-m", "pkg.train"], tmp_path)


def test_anything_else_is_not_known_to_be_one(tmp_path: Path) -> None:
    (tmp_path / "train.py").write_text("import torch.distributed as dist\n"
                                       "# import elasticrun.torch  (a comment)\n"
                                       "x = 'import elasticrun'\n")
    assert not imports_elasticrun(["python", "train.py"], tmp_path)
    assert not imports_elasticrun(["python", "missing.py"], tmp_path)
    assert not imports_elasticrun(["python", "-m", "no.such.module"], tmp_path)
    assert not imports_elasticrun(["./train.sh"], tmp_path)
    assert not imports_elasticrun([], tmp_path)
