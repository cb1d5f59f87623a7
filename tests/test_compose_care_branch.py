"""A CARE asymmetric model plus HyReC's learned-lexical branch on its document tower, as one model (issue #14,
item 4): ``recipes/care-tiny-hybrid.yaml`` on tiny random BERT towers trains the query tower, then the
branch, and saves one folder that loads, evaluates (``--mode hybrid``) and retrieves as one hybrid model;
the document route stays the frozen document tower (its cached embeddings and index stay valid)."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from _helpers import doc_tower
from medadapt.errors import ConfigError

pytestmark = pytest.mark.usefixtures("_single_thread")

RECIPE = Path(__file__).resolve().parents[1] / "recipes" / "care-tiny-hybrid.yaml"


def _sets(doc, query, beir, *extra) -> list[str]:
    return [f"document.model={doc}", f"query.model={query}", f"data.path={beir}", "stage2.batch_size=4",
            "branches.0.negatives.window=[2, 6]", "branches.0.training.batch_size=4",
            "branches.0.eval.tune_split=train", *extra]


@pytest.fixture(scope="module")
def composed(tmp_path_factory):
    """One run of the tiny recipe: document and query towers are two different random tiny BERTs."""
    from conftest import build_tiny_beir, build_tiny_bert

    from medadapt.recipes import run_recipe

    root = tmp_path_factory.mktemp("care_hybrid")
    doc, query = build_tiny_bert(root / "doc", seed=0), build_tiny_bert(root / "query", seed=1)
    beir = build_tiny_beir(root / "beir")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("MEDADAPT_CACHE", str(root / "cache"))
        res = run_recipe(RECIPE, root / "run", _sets(doc, query, beir), show_progress=False, log=lambda _m: None)
        yield SimpleNamespace(root=root, doc=doc, query=query, beir=beir, run=root / "run", res=res)


def _texts(beir):
    from medadapt.data import load_beir

    data = load_beir(beir, ["test"])
    return data, list(data.split_queries("test").values()), data.doc_texts()


def test_composition_table_allows_the_branch_on_an_asymmetric_model():
    from medadapt.adapters.compose import REFUSED, allowed, check_composition

    assert ("asymmetric", "hyrec_lexical", "branch") in allowed()
    assert ("asymmetric", "hyrec_lexical", "branch") not in REFUSED
    check_composition("asymmetric", [("hyrec_lexical", "branch"), ("moe", "query")])
    check_composition("dense", [("moe", "all"), ("hyrec_lexical", "branch")])  # unchanged
    with pytest.raises(ConfigError, match="splits it into a Router"):  # a query-only head splits the model
        check_composition("dense", [("moe", "query"), ("hyrec_lexical", "branch")])


def test_run_trains_query_tower_then_branch_into_one_folder_that_eval_serves(composed, monkeypatch):
    """Stage II and the branch both train; the folder is the asymmetric model with the branch as its last module;
    ``medadapt eval --mode hybrid`` / ``--mode dense`` on it reproduce the run's own numbers, and the dense
    numbers are the CARE model's own (``evaluate_asymmetric`` of the dense side alone)."""
    from typer.testing import CliRunner

    import medadapt
    from medadapt.care.evaluate import evaluate_asymmetric
    from medadapt.cli import app

    monkeypatch.setenv("MEDADAPT_CACHE", str(composed.root / "cache"))
    res, run = composed.res, composed.run
    assert res.details["stages"]["stage2"]["steps"] > 0 and res.details["branch_steps"] > 0
    [branch] = run.glob("*_LexicalBranch")
    assert (run / "router_config.json").is_file() and (branch / "lexical.safetensors").is_file()
    assert not (run / "medadapt_adapter.json").exists()  # the query tower trained: a whole-model folder
    assert {"lexical/ndcg@10", "dense/ndcg@10", "hybrid/ndcg@10"} <= set(res.metrics)
    tuning = res.details["dense_weight_tuning"]
    assert json.loads((branch / "config.json").read_text())["dense_weight"] == tuning["chosen"]
    for mode in ("hybrid", "dense", "lexical"):
        out = composed.root / f"eval-{mode}.json"
        result = CliRunner().invoke(app, ["eval", "--model", str(run), "--data", str(composed.beir), "--split",
                                          "test", "--mode", mode, "-q", "--output", str(out)])
        assert result.exit_code == 0, result.output
        reported = json.loads(out.read_text())
        assert reported.get("metrics", reported)["ndcg@10"] == pytest.approx(res.metrics[f"{mode}/ndcg@10"],
                                                                              abs=1e-6)
    dense_side = medadapt.load(str(run), device="cpu")  # its embeddings are the CARE model's (branch: unchanged)
    data, _, _ = _texts(composed.beir)
    alone = evaluate_asymmetric(dense_side, data, "test", ["ndcg@10"], show_progress=False)
    assert alone["ndcg@10"] == pytest.approx(res.metrics["dense/ndcg@10"], abs=1e-6)
    card = (run / "README.md").read_text()
    assert "hyrec_lexical" in card and "--mode hybrid" in card
    index_line = next(ln for ln in card.splitlines() if ln.startswith("medadapt index"))
    args = [str(run) if a == "run" else str(composed.beir) if a == "DATA_DIR" else
            str(composed.root / a) if a.endswith("-index") else a for a in index_line.split()[1:]]
    result = CliRunner().invoke(app, [*args, "-q"])  # the card's own command serves the folder
    assert result.exit_code == 0, result.output
    assert (composed.root / "run-index").is_dir()


def test_save_load_gives_identical_lexical_and_dense_outputs(composed):
    from medadapt.hyrec.model import HyReCModel

    trained, loaded = composed.res.model, HyReCModel.load(composed.run, device="cpu")
    assert trained.asymmetric and loaded.asymmetric
    assert loaded.config == trained.config
    _, queries, docs = _texts(composed.beir)
    for texts, role in ((queries, "query"), (docs, "document")):
        d1, l1 = trained.encode(texts, role)
        d2, l2 = loaded.encode(texts, role)
        np.testing.assert_allclose(d2, d1, atol=1e-6)
        assert [sorted(v) for v in l2] == [sorted(v) for v in l1] and any(l1)
        for a, b in zip(l1, l2):
            np.testing.assert_allclose([b[t] for t in sorted(a)], [a[t] for t in sorted(a)], atol=1e-6)
    from sentence_transformers import SentenceTransformer

    from medadapt.retrieval.encoders import as_encoder

    plain = as_encoder(SentenceTransformer(str(composed.run), trust_remote_code=True, device="cpu"))
    for texts, role in ((queries, "query"), (docs, "document")):  # plain sentence-transformers: the same model
        assert np.array_equal(plain.encode_dense(texts, role), loaded.encode_dense(texts, role))
        assert plain.encode_lexical(texts, role) == loaded.encode_lexical(texts, role)
    # the lexical side reads the document tower for queries too: query terms are document-tokenizer ids
    doc_tok = loaded.tokenizer
    assert doc_tok is loaded.st[0].sub_modules["document"][0].tokenizer
    q_terms = loaded.encode_lexical(["symptoms of gout"], "query")[0]
    gout_id = doc_tok.convert_tokens_to_ids("gout")
    assert gout_id in q_terms


def test_hybrid_score_is_lexical_plus_weighted_dense_from_the_two_parts(composed, tmp_path):
    """Every hybrid score of ``evaluate_hyrec`` and of the Retriever equals ``S_lex + w * S_den`` computed by
    hand: ``S_lex`` from the branch's sparse vectors, ``S_den`` from the asymmetric model alone
    (``encode_query`` through the query tower, ``encode_document`` through the document tower); the
    Retriever index built from the folder (saved, reloaded by name) and the LangChain retriever serve it."""
    import medadapt
    from medadapt.hyrec.evaluate import evaluate_hyrec
    from medadapt.hyrec.model import HyReCModel
    from medadapt.retrieval import FusionConfig, Retriever, RetrieverConfig, load_documents

    model = HyReCModel.load(composed.run, device="cpu")
    w = 0.7  # not 1, not the tuned weight
    model.config.dense_weight = w
    data, queries, docs = _texts(composed.beir)
    qids = list(data.split_queries("test"))
    _, runs = evaluate_hyrec(model, data, "test", "hybrid", ["ndcg@10"], dense_source="model",
                             show_progress=False, return_runs=True)
    dense_side = medadapt.load(str(composed.run), device="cpu")
    qd = np.asarray(dense_side.encode_query(queries))
    dd = np.asarray(dense_side.encode_document(docs))
    ql, dl = model.encode_lexical(queries, "query"), model.encode_lexical(docs, "document")
    pos = {d: i for i, d in enumerate(data.doc_ids)}
    checked = 0
    for r, q in enumerate(qids):
        for did, score in runs["hybrid"][q].items():
            j = pos[did]
            lex = sum(v * dl[j].get(t, 0.0) for t, v in ql[r].items())
            assert score == pytest.approx(lex + w * float(qd[r] @ dd[j]), abs=1e-5)
            checked += 1
    assert checked >= len(qids)
    # the Retriever and the LangChain retriever over the folder itself (one hybrid index, reloaded by name)
    from medadapt.retrieval import MedAdaptRetriever

    cfg = RetrieverConfig(kind="hybrid", fusion=FusionConfig(method="sum", dense_weight=w))
    built = Retriever.build(load_documents(composed.beir), model=str(composed.run), config=cfg,
                            show_progress=False)
    built.save(tmp_path / "index")
    retriever = Retriever.load(tmp_path / "index")
    assert retriever.learned_sparse and retriever.manifest.encoder == "hyrec"
    results = retriever.batch_search(queries, k=3)
    for r, res in enumerate(results):
        for did, score in zip(res.ids, res.scores):
            j = pos[did]
            lex = sum(v * dl[j].get(t, 0.0) for t, v in ql[r].items())
            assert score == pytest.approx(lex + w * float(qd[r] @ dd[j]), abs=1e-5)
    lc = MedAdaptRetriever(retriever=retriever, k=3).invoke(queries[0])
    assert [d.metadata["id"] for d in lc] == results[0].ids


def test_document_route_is_the_frozen_document_tower_bit_for_bit(composed, tmp_path):
    """The document index stays valid: the composed model's document embeddings are the frozen document
    tower's, bit for bit, and the embedding cache finds them under the tower's own namespace (no re-encode)."""
    from sentence_transformers import SentenceTransformer

    from medadapt.cache import EmbeddingCache
    from medadapt.hyrec.model import HyReCModel

    loaded = HyReCModel.load(composed.run, device="cpu")
    frozen = SentenceTransformer(str(composed.doc), device="cpu")
    _, _, docs = _texts(composed.beir)
    route = loaded.st[0].sub_modules["document"][0].auto_model.state_dict()
    source = frozen[0].auto_model.state_dict()
    assert route.keys() == source.keys() and all(torch.equal(route[k], source[k]) for k in route)
    assert np.array_equal(loaded.encode_dense(docs, "document"), frozen.encode_document(docs))
    cache = EmbeddingCache(tmp_path / "cache")
    cached = cache.encode(frozen, docs, role="document", show_progress=False)
    assert cache.count_missing(loaded.st, docs, role="document") == 0
    assert np.array_equal(cache.encode(loaded.st, docs, role="document", show_progress=False), cached)
    assert cache.count_missing(loaded.st, ["symptoms of gout"], role="query") == 1  # the query tower: its own


def test_branch_training_leaves_both_towers_as_they_were(composed, tmp_path, monkeypatch):
    """With stage II off, only the branch trains: the saved query and document towers equal their sources
    (the branch reads the frozen document tower and keeps the query tower, its dense side, fixed)."""
    from sentence_transformers import SentenceTransformer

    from medadapt.recipes import run_recipe

    monkeypatch.setenv("MEDADAPT_CACHE", str(tmp_path / "cache"))
    res = run_recipe(RECIPE, tmp_path / "run", _sets(composed.doc, composed.query, composed.beir,
                                                     "stage2.enabled=false", "branches.0.eval.tune_dense_weight=null"),
                     show_progress=False, log=lambda _m: None)
    assert res.details["branch_steps"] > 0 and "stage2" not in res.details["stages"]
    router = res.model.st[0]
    for route, src in (("query", composed.query), ("document", composed.doc)):
        got = router.sub_modules[route][0].auto_model.state_dict()
        want = SentenceTransformer(str(src), device="cpu")[0].auto_model.state_dict()
        assert all(torch.equal(got[k], want[k]) for k in want), route
    from safetensors.torch import load_file

    (ckpt,) = (tmp_path / "run.checkpoints" / "hyrec_lexical").glob("step-*/head.safetensors")
    keys = set(load_file(str(ckpt)))  # what the branch's optimiser trained: the branch, not a tower's layers
    assert any(".weight_proj." in k for k in keys)
    assert not any(".sub_modules.query." in k or ".encoder.layer." in k for k in keys), sorted(keys)


def test_decoder_document_tower_is_refused_with_the_reason(composed, tiny_qwen2_dir, tmp_path, monkeypatch):
    """A decoder LLM document tower cannot carry the branch: one ConfigError with the reason, from the Python
    API (before any training), from a recipe, and as one CLI line with nothing written."""
    import os
    import subprocess
    import sys

    from sentence_transformers import SentenceTransformer

    from medadapt.adapters.compose import branch_kind
    from medadapt.care.model import build_asymmetric_model
    from medadapt.hyrec.branch import HyReCLexicalBranch
    from medadapt.recipes import run_recipe

    qwen = tiny_qwen2_dir
    asym = build_asymmetric_model(SentenceTransformer(str(composed.query), device="cpu"), doc_tower(qwen))
    kind = branch_kind("hyrec_lexical")
    for call in (lambda: kind.check(asym, HyReCLexicalBranch(), None),
                 lambda: kind.build_and_train(asym, HyReCLexicalBranch(), None, None)):
        with pytest.raises(ConfigError, match=r"document tower of the asymmetric model is a decoder \(qwen2"):
            call()
    monkeypatch.setenv("MEDADAPT_CACHE", str(tmp_path / "cache"))
    bad = [f"document.model={qwen}", "document.kind=decoder"]
    with pytest.raises(ConfigError, match="decoder LLM tower"):
        run_recipe(RECIPE, tmp_path / "r1", _sets(composed.doc, composed.query, composed.beir, *bad),
                   show_progress=False, log=lambda _m: None)
    assert not (tmp_path / "r1").exists()
    # a decoder checkpoint loaded as a plain sentence-transformers tower: refused on the model, before training
    with pytest.raises(ConfigError, match="is a decoder"):
        run_recipe(RECIPE, tmp_path / "r2", _sets(composed.doc, composed.query, composed.beir,
                                                  f"document.model={qwen}"), show_progress=False,
                   log=lambda _m: None)
    assert not (tmp_path / "r2").exists() and not (tmp_path / "r2.checkpoints").exists()
    args = ["train", str(RECIPE), "--output", str(tmp_path / "r3"), "-q",
            *[a for o in _sets(composed.doc, composed.query, composed.beir, *bad) for a in ("--set", o)]]
    proc = subprocess.run([sys.executable, "-m", "medadapt", *args], capture_output=True, text=True, timeout=300, check=False,
                          env={**os.environ, "MEDADAPT_CACHE": str(tmp_path / "cache"), "HF_HUB_OFFLINE": "1"})
    lines = [ln for ln in proc.stderr.splitlines() if ln.strip()]
    assert proc.returncode == 1 and "Traceback" not in proc.stderr + proc.stdout
    assert len(lines) == 1 and "decoder" in lines[0], proc.stderr
    assert not (tmp_path / "r3").exists()
