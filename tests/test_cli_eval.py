"""``medadapt eval`` scores an index folder (``--index``) and a dense model in hybrid mode (dense + BM25) on a
split; a mode an input cannot give is one ``error:`` line naming the modes it supports."""

from __future__ import annotations

import json
import re

import pytest
from sentence_transformers import SentenceTransformer
from typer.testing import CliRunner

from medadapt.cli import app
from medadapt.data import load_beir
from medadapt.eval import evaluate_run
from medadapt.retrieval import Retriever, load_documents

pytestmark = pytest.mark.usefixtures("_single_thread", "_isolated_cache")
METRICS = "ndcg@10,recall@10,mrr@10"


def _eval(*args):
    result = CliRunner().invoke(app, ["eval", *args, "--metrics", METRICS, "-q"])
    return result, [ln for ln in result.output.splitlines() if ln.strip()]


def _scores(out):
    return json.loads(out.read_text())


def _by_hand(retriever, beir):
    data = load_beir(beir, ["test"])
    queries = data.split_queries("test")
    results = retriever.batch_search(list(queries.values()), 100)
    run = {q: {h.id: h.score for h in res} for q, res in zip(queries, results)}
    return evaluate_run(data.qrels["test"], run, METRICS.split(","))


def test_a_dense_model_in_hybrid_mode_is_dense_plus_bm25(tiny_bert_dir, tiny_beir_dir, tmp_path):
    hybrid, dense, index = tmp_path / "hybrid.json", tmp_path / "dense.json", tmp_path / "index.json"
    res, _ = _eval("--model", str(tiny_bert_dir), "--data", str(tiny_beir_dir), "--mode", "hybrid",
                   "--output", str(hybrid))
    assert res.exit_code == 0, res.output
    ref = Retriever.build(load_documents(tiny_beir_dir), SentenceTransformer(str(tiny_bert_dir), device="cpu"),
                          kind="hybrid", show_progress=False)
    assert _scores(hybrid) == pytest.approx(_by_hand(ref, tiny_beir_dir), abs=1e-6)

    res, _ = _eval("--model", str(tiny_bert_dir), "--data", str(tiny_beir_dir), "--output", str(dense))
    assert res.exit_code == 0, res.output
    assert _scores(hybrid) != _scores(dense)  # the BM25 side changes the ranking of the random tiny model

    # the same hybrid index saved by `medadapt index` scores the same through --index
    folder = tmp_path / "hybrid.index"
    built = CliRunner().invoke(app, ["index", "--corpus", str(tiny_beir_dir), "--out", str(folder), "--model",
                                     str(tiny_bert_dir), "--kind", "hybrid", "-q"])
    assert built.exit_code == 0, built.output
    res, lines = _eval("--index", str(folder), "--data", str(tiny_beir_dir), "--output", str(index))
    assert res.exit_code == 0, res.output
    assert _scores(index) == pytest.approx(_scores(hybrid), abs=1e-6)
    assert any("hybrid.index on beir/test" in line for line in lines)

    # one side of the hybrid index: --mode dense is the model's dense retrieval
    res, _ = _eval("--index", str(folder), "--data", str(tiny_beir_dir), "--mode", "dense", "--output", str(index))
    assert res.exit_code == 0, res.output
    assert _scores(index) == pytest.approx(_scores(dense), abs=1e-6)


def test_a_lexical_index_is_scored_as_its_search_run(tiny_beir_dir, tmp_path):
    folder = tmp_path / "bm25.index"
    Retriever.build(load_documents(tiny_beir_dir), kind="lexical", show_progress=False).save(folder)
    out = tmp_path / "bm25.json"
    res, _ = _eval("--index", str(folder), "--data", str(tiny_beir_dir), "--output", str(out))
    assert res.exit_code == 0, res.output
    assert _scores(out) == pytest.approx(_by_hand(Retriever.load(folder), tiny_beir_dir), abs=1e-6)
    assert _scores(out)["ndcg@10"] > 0.5  # queries share words with their documents


def test_an_impossible_mode_names_the_modes_the_input_supports(tiny_bert_dir, tiny_beir_dir, tmp_path):
    folder = tmp_path / "bm25.index"
    Retriever.build(load_documents(tiny_beir_dir), kind="lexical", show_progress=False).save(folder)
    cases = [
        (["--index", str(folder), "--mode", "hybrid"],
         rf"^error: --mode hybrid: index {re.escape(str(folder))} \(lexical\) supports --mode lexical$"),
        (["--model", str(tiny_bert_dir), "--mode", "lexical"],
         r"^error: --mode lexical: .* is a dense model: it supports --mode dense or hybrid \(dense \+ BM25\); "
         r"--mode lexical needs a model with a learned-lexical module"),
        (["--index", str(folder), "--task", "sts"], r"^error: --index evaluates retrieval .*--task sts does not apply"),
        (["--model", str(tiny_bert_dir), "--task", "sts", "--mode", "hybrid"],
         r"^error: --mode hybrid applies to --task retrieval$"),
    ]
    sts = tmp_path / "sts.jsonl"
    sts.write_text('{"sentence1": "a", "sentence2": "b", "score": 1}\n{"sentence1": "c", "sentence2": "d", '
                   '"score": 2}\n')
    for args, message in cases:
        res, lines = _eval(*args, "--data", str(sts if "sts" in args else tiny_beir_dir))
        assert res.exit_code == 1 and len(lines) == 1 and re.search(message, lines[0]), (args, res.output)
