"""The Retriever talks to models through protocols (medadapt.retrieval.encoders), never by class name, and
the retrieval package imports no system package."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import medadapt.retrieval.encoders as enc
from _helpers import TOY_DOCS, ToyEncoder
from medadapt.errors import MedAdaptError
from medadapt.retrieval import IndexMismatchError, Retriever, RetrieverConfig

SYSTEMS = ("medadapt.hyrec", "medadapt.care", "medadapt.bmretriever", "medadapt.moe")


def test_retrieval_imports_no_system_package():
    root = Path(enc.__file__).parent
    imported = []
    for path in root.glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                imported += [(path.name, a.name) for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module:
                imported.append((path.name, node.module))
    assert imported and not [(f, m) for f, m in imported if m.startswith(SYSTEMS)]


def test_any_object_with_the_protocol_is_an_encoder(tiny_bert):
    toy = ToyEncoder()
    assert isinstance(toy, enc.DenseEncoder) and isinstance(toy, enc.SparseEncoder)
    assert not isinstance(toy, enc.HybridEncoder)  # no one-pass encode(): both sides encoded separately
    assert enc.as_encoder(toy) is toy
    st = enc.as_encoder(tiny_bert)
    assert isinstance(st, enc.SentenceTransformerEncoder) and isinstance(st, enc.DenseEncoder)
    assert not isinstance(st, enc.SparseEncoder) and st.encoder_tag == enc.ST_TAG and st.embedding_dim == 32
    with pytest.raises(MedAdaptError, match="cannot be used for retrieval"):
        enc.as_encoder(object())

    r = Retriever.build(TOY_DOCS, toy, kind="hybrid", config=RetrieverConfig(fusion={"method": "sum"}),
                        model_name="toy", show_progress=False)
    assert r.learned_sparse and r.manifest.encoder == "toy" and r.manifest.normalized is False
    res = r.search("gout toe", k=3)
    # lexical 1 + 1 (two shared terms), dense 1*1 + 1*1 (dot): sum fusion 2 + 1 * 2 for "a"; the others score 0
    assert res.ids[0] == "a" and res.scores[0] == pytest.approx(4.0)
    lexical_only = Retriever.build(TOY_DOCS, toy, kind="lexical", show_progress=False)
    assert lexical_only.learned_sparse and lexical_only.search("wheezing", 1).ids == ["b"]


def test_index_reloads_a_registered_encoder_kind_by_name(tmp_path, monkeypatch):
    monkeypatch.setattr(enc, "_KINDS", dict(enc._KINDS))
    r = Retriever.build(TOY_DOCS, ToyEncoder(), kind="hybrid", model_name="toy-1", show_progress=False)
    r.save(tmp_path / "index")
    with pytest.raises(MedAdaptError, match="no encoder 'toy' is registered"):
        Retriever.load(tmp_path / "index")
    enc.register_encoder(enc.EncoderKind("toy", load=lambda name, device=None: ToyEncoder(float(name.split("-")[1]))))
    again = Retriever.load(tmp_path / "index")
    assert again.search("asthma", 1).ids == ["b"]
    with pytest.raises(IndexMismatchError, match="fingerprint"):  # another toy: another fingerprint
        Retriever.load(tmp_path / "index", model=ToyEncoder(2.0))


def test_encoder_kinds_come_from_entry_points(tmp_path, monkeypatch):
    """A package names the module that registers its kind in the ``medadapt.encoders`` entry-point group;
    it is imported only when an unknown tag (or a folder) must be resolved."""
    from importlib.metadata import EntryPoint

    (tmp_path / "medadapt_test_toy_kind.py").write_text(
        "from medadapt.retrieval.encoders import EncoderKind, register_encoder\n"
        "register_encoder(EncoderKind('toy2', load=lambda name, device=None: name,\n"
        "                             detect=lambda folder: (folder / 'toy2.json').is_file()))\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr(enc, "_KINDS", dict(enc._KINDS))
    monkeypatch.setattr(enc, "_entry_points_loaded", False)
    eps = [EntryPoint("toy2", "medadapt_test_toy_kind", enc.ENTRY_POINT_GROUP)]
    monkeypatch.setattr("importlib.metadata.entry_points", lambda group=None: eps if group == enc.ENTRY_POINT_GROUP
                        else [])
    folder = tmp_path / "model"
    folder.mkdir()
    assert enc.detect_encoder_kind(folder) is None
    (folder / "toy2.json").write_text("{}")
    assert enc.detect_encoder_kind(folder).tag == "toy2"
    assert enc.get_encoder_kind("toy2").load("x") == "x" and "toy2" in enc.encoder_kinds()
