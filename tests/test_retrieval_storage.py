"""Index folders as outputs (medadapt.retrieval.storage.atomic_dir, behind Retriever.save and `medadapt index
--out`): the output policy of medadapt.io, and a symlink written through (the link stays)."""

from __future__ import annotations

import os

import pytest
from typer.testing import CliRunner

from medadapt.cli import app
from medadapt.errors import ConfigError
from medadapt.retrieval import Retriever, load_documents
from medadapt.retrieval.storage import MANIFEST


def _lexical(tiny_beir_dir):
    return Retriever.build(load_documents(tiny_beir_dir), kind="lexical", show_progress=False)


def test_retriever_save_writes_through_a_symlink(tiny_beir_dir, tmp_path):
    (tmp_path / "store").mkdir()
    link = tmp_path / "idx"
    link.symlink_to(tmp_path / "store" / "idx-v1")
    r = _lexical(tiny_beir_dir)
    for _ in range(2):  # through a dangling link, then over the index it points to
        r.save(link)
    assert link.is_symlink() and (tmp_path / "store" / "idx-v1" / MANIFEST).is_file()
    assert sorted(p.name for p in (tmp_path / "store").iterdir()) == ["idx-v1"]
    assert Retriever.load(link).search("gout", 3).ids == r.search("gout", 3).ids  # loads (manifest checked)


def test_cli_index_out_on_a_symlink_keeps_the_link(tiny_beir_dir, tmp_path, monkeypatch):
    """`index --out LINK` replaced the link with a folder; the guarantees say outputs are written through."""
    monkeypatch.setenv("MEDADAPT_CACHE", str(tmp_path / "cache"))
    (tmp_path / "store").mkdir()
    link = tmp_path / "idx"
    link.symlink_to(tmp_path / "store" / "current")
    args = ["index", "--corpus", str(tiny_beir_dir), "--out", str(link), "--kind", "lexical", "-q"]
    for _ in range(2):
        res = CliRunner().invoke(app, args)
        assert res.exit_code == 0, res.output
    assert link.is_symlink() and os.readlink(link) == str(tmp_path / "store" / "current")
    assert (tmp_path / "store" / "current" / MANIFEST).is_file()
    assert sorted(p.name for p in (tmp_path / "store").iterdir()) == ["current"]


def test_cli_index_out_through_a_symlink_to_another_folder_is_refused(tiny_beir_dir, tmp_path, monkeypatch):
    monkeypatch.setenv("MEDADAPT_CACHE", str(tmp_path / "cache"))
    (tmp_path / "notes").mkdir()
    (tmp_path / "notes" / "keep.txt").write_text("keep")
    (tmp_path / "idx").symlink_to(tmp_path / "notes")
    res = CliRunner().invoke(app, ["index", "--corpus", str(tiny_beir_dir), "--out", str(tmp_path / "idx"),
                                   "--kind", "lexical", "-q"])
    assert res.exit_code == 1
    assert [line for line in res.output.splitlines() if line.strip()] == [
        f"error: cannot write --out {tmp_path / 'idx'}: it is a non-empty folder that is not a medadapt "
        "index; "
        "refusing to overwrite it: give a new or empty folder (nothing in it was changed)"]
    assert sorted(p.name for p in (tmp_path / "notes").iterdir()) == ["keep.txt"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["beir", "idx", "notes"]  # no cache: refused first


def test_retriever_save_refuses_a_file_and_keeps_it(tiny_beir_dir, tmp_path):
    (tmp_path / "idx").write_text("precious")
    with pytest.raises(ConfigError, match="it is an existing file"):
        _lexical(tiny_beir_dir).save(tmp_path / "idx")
    assert (tmp_path / "idx").read_text() == "precious"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["beir", "idx"]
