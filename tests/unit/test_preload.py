"""Which imports a worker template takes from the job's script (worker/preload.py)."""

from __future__ import annotations

from pathlib import Path

from elasticrun.worker.preload import Wanted, top_level_imports, wanted


def test_top_level_imports_are_read_from_the_script_without_running_it() -> None:
    source = ("import os, numpy as np\n"
              "from transformers import Trainer, TrainingArguments\n"
              "from . import sibling\n"
              "from lightning.pytorch import *\n"
              "try:\n    import yaml\nexcept ImportError:\n    yaml = None\n"
              "def main():\n    import inside_a_function\n"
              "if __name__ == '__main__':\n    import under_main\n")
    assert top_level_imports(source) == [
        Wanted("os"), Wanted("numpy"), Wanted("transformers", ("Trainer", "TrainingArguments")),
        Wanted("lightning.pytorch"), Wanted("yaml")]
    assert top_level_imports("def broken(:\n") == []


def test_installed_packages_only_and_what_elasticrun_preload_names(tmp_path: Path) -> None:
    (tmp_path / "mine.py").write_text("")
    script = tmp_path / "train.py"
    script.write_text("import yaml\nimport mine\nimport no_such_module\n")
    command = ["python", str(script)]
    assert wanted(command, str(tmp_path), {}) == [Wanted("yaml")]
    assert wanted(command, str(tmp_path), {"ELASTICRUN_PRELOAD": " a.b, c "}) == [
        Wanted("a.b"), Wanted("c"), Wanted("yaml")]
    assert wanted(command, str(tmp_path), {"ELASTICRUN_PRELOAD": "0"}) == []
    assert wanted(["python", "missing.py"], str(tmp_path), {}) == []
