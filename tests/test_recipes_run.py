"""The run folder as an output (medadapt.recipes.run: `medadapt train --output`, run_recipe): the output
policy of medadapt.io, checked before any work."""

from __future__ import annotations

from pathlib import Path

import pytest

from medadapt.errors import ConfigError
from medadapt.recipes.run import _check_output


def _file(tmp_path):
    (tmp_path / "run").write_text("precious")
    return "it is an existing file"


def _other_folder(tmp_path):
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "notes.txt").write_text("mine")
    return "it is a non-empty folder that is not a medadapt run; refusing to overwrite it"


def _checkpoints_file(tmp_path):
    (tmp_path / "run.checkpoints").write_text("precious")
    return "run.checkpoints .where the run keeps its checkpoints. is a file"


@pytest.mark.parametrize("case", [_file, _other_folder, _checkpoints_file])
def test_train_output_refuses_what_is_not_a_run(tmp_path, case):
    message = case(tmp_path)
    before = sorted(p.name for p in tmp_path.rglob("*"))
    with pytest.raises(ConfigError, match=message):
        _check_output(tmp_path / "run")
    assert sorted(p.name for p in tmp_path.rglob("*")) == before


@pytest.mark.parametrize("where", [".", ".."])
def test_train_output_is_never_the_current_folder_or_one_above(tmp_path, monkeypatch, where):
    (tmp_path / "a").mkdir()
    (tmp_path / "a" / "recipe.yaml").write_text("name: x\n")  # even a run folder
    monkeypatch.chdir(tmp_path / "a")
    with pytest.raises(ConfigError, match=r"cannot write --output \.+: it is the current folder or one"):
        _check_output(Path(where))


def test_train_output_accepts_a_run_an_empty_or_a_new_folder_and_cleans_dead_leftovers(tmp_path):
    (tmp_path / "old").mkdir()
    (tmp_path / "old" / "recipe.yaml").write_text("name: x\n")
    (tmp_path / "old" / "model.safetensors").write_text("w")
    (tmp_path / "empty").mkdir()
    leftover = tmp_path / ".old.tmp-999999999-1-abcd1234"  # no such process
    leftover.mkdir()
    for name in ("old", "empty", "new/run"):
        _check_output(tmp_path / name)
    assert not leftover.exists() and (tmp_path / "old" / "model.safetensors").read_text() == "w"
