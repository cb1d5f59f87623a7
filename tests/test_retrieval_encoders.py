"""The Retriever talks to models through protocols (medadapt.retrieval.encoders), never by class name, and
the retrieval package imports no system package."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
import torch

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


def test_a_module_of_the_model_offers_its_own_encoder(tiny_bert):
    """A loaded model's capability decides: a module with ``as_encoder(model)`` (such as HyReC's learned-lexical
    branch) gives the model's encoder; without one the model is a dense SentenceTransformer."""
    class Offers(torch.nn.Module):
        def as_encoder(self, model):
            return ToyEncoder(len(model._modules))

    assert not enc.offers_sparse(tiny_bert)
    tiny_bert.add_module(str(len(tiny_bert._modules)), Offers())
    got = enc.as_encoder(tiny_bert)
    assert isinstance(got, ToyEncoder) and got.scale == len(tiny_bert._modules)
    assert enc.offers_sparse(tiny_bert) and not enc.offers_sparse("no-such-folder")


def test_an_index_of_an_object_reloads_with_the_given_model(tmp_path):
    r = Retriever.build(TOY_DOCS, ToyEncoder(), kind="hybrid", model_name="toy-1", show_progress=False)
    r.save(tmp_path / "index")
    with pytest.raises(MedAdaptError, match="toy-1"):  # the recorded name is no model medadapt.load opens
        Retriever.load(tmp_path / "index")
    again = Retriever.load(tmp_path / "index", model=ToyEncoder(1.0))
    assert again.search("asthma", 1).ids == ["b"]
    with pytest.raises(IndexMismatchError, match="fingerprint"):  # another toy: another fingerprint
        Retriever.load(tmp_path / "index", model=ToyEncoder(2.0))
