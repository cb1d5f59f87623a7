"""Paired comparison of two runs (``medadapt eval --compare``) against hand computation."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from medadapt.errors import DataError
from medadapt.eval.compare import compare_runs, paired_comparison, per_query_scores, read_run

L3 = math.log2(3)  # trec_eval's nDCG discount at rank 2
QRELS = {"q1": {"d1": 1}, "q2": {"d2": 1}, "q3": {"d3": 2, "d4": 1}, "q4": {"d5": 1}}
RUN_A = {"q1": {"d1": 0.9, "x": 0.1}, "q2": {"x": 0.9, "d2": 0.5}, "q3": {"d4": 0.9, "d3": 0.8},
         "q4": {"d5": 0.7}}
RUN_B = {"q1": {"x": 0.9, "d1": 0.5}, "q2": {"d2": 0.9}, "q3": {"d3": 0.9, "d4": 0.8}, "q4": {"d5": 0.3}}
# per-query nDCG@10 by hand (gain = grade, discount log2(rank + 1))
A = {"q1": 1.0, "q2": 1 / L3, "q3": (1 + 2 / L3) / (2 + 1 / L3), "q4": 1.0}
B = {"q1": 1 / L3, "q2": 1.0, "q3": 1.0, "q4": 1.0}


def test_per_query_ndcg_by_hand():
    assert per_query_scores(QRELS, RUN_A) == pytest.approx(A, abs=1e-9)
    assert per_query_scores(QRELS, RUN_B) == pytest.approx(B, abs=1e-9)
    # a query the run misses counts 0; mrr@1 on the cut run
    assert per_query_scores(QRELS, {"q1": {"d1": 1.0}})["q2"] == 0.0
    assert per_query_scores(QRELS, RUN_A, "mrr@1") == {"q1": 1.0, "q2": 0.0, "q3": 1.0, "q4": 1.0}


def test_paired_comparison_against_hand_computation():
    result = compare_runs(QRELS, RUN_A, RUN_B, "ndcg@10", n_resamples=10_000, seed=0)
    diffs = [B[q] - A[q] for q in sorted(QRELS)]  # -0.369, +0.369, +0.140, 0
    mean = sum(diffs) / 4
    assert result.queries == 4
    assert result.mean_a == pytest.approx(sum(A.values()) / 4, abs=1e-9)
    assert result.mean_b == pytest.approx(sum(B.values()) / 4, abs=1e-9)
    assert result.difference == pytest.approx(mean, abs=1e-9)
    assert (result.wins, result.ties, result.losses) == (2, 1, 1)
    # paired t-test with 3 degrees of freedom: t = mean / (sd / sqrt(n)); two-sided p from Student's t(3) CDF
    sd = math.sqrt(sum((d - mean) ** 2 for d in diffs) / 3)
    t = mean / (sd / 2)
    # Student's t with 3 degrees of freedom: P(|T| > t) = 1 - (2/pi) (atan(t/sqrt(3)) + sqrt(3) t / (3 + t^2))
    p = 1 - 2 / math.pi * (math.atan(abs(t) / math.sqrt(3)) + abs(t) * math.sqrt(3) / (3 + t * t))
    assert result.p_value == pytest.approx(p, abs=1e-9)
    # bootstrap: with 4 queries the resampled means take few values; the lowest, all four draws on q1
    # (-0.369), has probability 1/256 and the 2.5% quantile lies at the next values: mean of
    # three q1 draws and one q4 draw, etc. Compare with the exact distribution over all 4^4 resamples.
    import itertools

    exact = sorted(sum(diffs[i] for i in idx) / 4 for idx in itertools.product(range(4), repeat=4))
    lo, hi = np.quantile(exact, [0.025, 0.975])
    assert result.ci_low == pytest.approx(lo, abs=0.05) and result.ci_high == pytest.approx(hi, abs=0.05)
    assert result.ci_low < result.difference < result.ci_high
    assert not result.significant
    # seeded: the same seed gives the same interval, another seed another draw
    again = compare_runs(QRELS, RUN_A, RUN_B, "ndcg@10", seed=0)
    assert (again.ci_low, again.ci_high) == (result.ci_low, result.ci_high)


def test_bootstrap_interval_on_a_large_sample():
    rng = np.random.default_rng(1)
    a = {f"q{i}": float(v) for i, v in enumerate(rng.uniform(0.2, 0.8, 400))}
    b = {q: v + 0.05 + float(rng.normal(0, 0.1)) for q, v in a.items()}
    result = paired_comparison(a, b, seed=3)
    diff = np.array([b[q] - a[q] for q in a])
    half = 1.96 * diff.std(ddof=1) / math.sqrt(len(diff))
    assert result.ci_low == pytest.approx(diff.mean() - half, abs=0.15 * half)
    assert result.ci_high == pytest.approx(diff.mean() + half, abs=0.15 * half)
    assert result.significant and result.p_value < 1e-6


def test_degenerate_and_bad_input():
    same = paired_comparison({"a": 0.5, "b": 0.2}, {"a": 0.5, "b": 0.2})
    assert same.p_value == 1.0 and same.difference == 0.0 and (same.ci_low, same.ci_high) == (0.0, 0.0)
    shifted = paired_comparison({"a": 0.5, "b": 0.2}, {"a": 0.6, "b": 0.3})
    assert shifted.p_value == 0.0 and shifted.significant
    json.dumps(shifted.to_dict(per_query=True), allow_nan=False)
    with pytest.raises(DataError, match="different queries"):
        paired_comparison({"a": 1.0}, {"b": 1.0})


def test_read_run_formats_and_errors(tmp_path):
    trec = tmp_path / "a.trec"
    trec.write_text("q1 Q0 d1 1 0.9 tag\nq1 Q0 x 2 0.1 tag\n\nq2 Q0 d2 1 0.5 tag\n")
    assert read_run(trec) == {"q1": {"d1": 0.9, "x": 0.1}, "q2": {"d2": 0.5}}
    js = tmp_path / "a.json"
    js.write_text(json.dumps(RUN_A))
    assert read_run(js) == RUN_A
    bad = tmp_path / "bad.trec"
    bad.write_text("q1 Q0 d1 1 0.9 tag\nq1 Q0 d1 2 0.5 tag\n")
    with pytest.raises(DataError, match="bad.trec:2: document 'd1' appears twice"):
        read_run(bad)
    bad.write_text("q1 Q0 d1 1 nan tag\n")
    with pytest.raises(DataError, match="bad.trec:1"):
        read_run(bad)
    bad.write_text("q1 d1 0.9\n")
    with pytest.raises(DataError, match="6 columns"):
        read_run(bad)


def test_cli_compare_runs_and_models(tmp_path, tiny_bert_dir, monkeypatch):
    from conftest import write_beir
    from typer.testing import CliRunner

    from medadapt.cli import app

    monkeypatch.setenv("MEDADAPT_CACHE", str(tmp_path / "cache"))
    words = {"d1": "gout", "d2": "asthma", "d3": "anemia", "d4": "anemia", "d5": "migraine"}
    corpus = {d: ("", f"{w} text {d}") for d, w in words.items()} | {"x": ("", "noise")}
    queries = {q: f"query about {words[next(iter(rel))]}" for q, rel in QRELS.items()}  # BM25 finds them
    data = write_beir(tmp_path / "beir", corpus, queries, {"test": QRELS})
    for name, run in (("a.trec", RUN_A), ("b.trec", RUN_B)):
        lines = [f"{q} Q0 {d} {r} {s} t" for q, docs in run.items()
                 for r, (d, s) in enumerate(sorted(docs.items(), key=lambda kv: -kv[1]), 1)]
        (tmp_path / name).write_text("\n".join(lines) + "\n")
    out = tmp_path / "cmp.json"
    res = CliRunner().invoke(app, ["eval", "--compare", str(tmp_path / "a.trec"), str(tmp_path / "b.trec"),
                                   "--data", str(data), "--split", "test", "--output", str(out)])
    assert res.exit_code == 0, res.output
    assert "wins / ties / losses" in res.output and "2 / 1 / 1" in res.output
    saved = json.loads(out.read_text())
    assert saved["difference"] == pytest.approx(sum(B[q] - A[q] for q in QRELS) / 4, abs=1e-6)
    assert saved["per_query"]["q2"] == {"a": pytest.approx(1 / L3), "b": 1.0}
    assert saved["names"] == ["a.trec", "b.trec"] and saved["n_resamples"] == 10_000
    # a model on one side: evaluated on the data, same per-query scores as evaluate_retrieval's run
    res = CliRunner().invoke(app, ["eval", "--compare", str(tmp_path / "a.trec"), str(tiny_bert_dir),
                                   "--data", str(data), "--split", "test", "--output", str(out), "-q"])
    assert res.exit_code == 0, res.output
    from medadapt.data import load_beir
    from medadapt.eval import evaluate_retrieval
    from medadapt.models import load

    ref = evaluate_retrieval(load(str(tiny_bert_dir)), load_beir(data, ["test"]), "test", ["ndcg@10"],
                             show_progress=False)["ndcg@10"]
    assert json.loads(out.read_text())["mean_b"] == pytest.approx(ref, abs=1e-6)
    # --mode scores a model side as `medadapt eval --mode` does: the dense model's hybrid (dense + BM25) run
    from medadapt.eval import evaluate
    from medadapt.eval.tasks.retrieval import RetrievalTask

    res = CliRunner().invoke(app, ["eval", "--compare", str(tmp_path / "a.trec"), str(tiny_bert_dir),
                                   "--data", str(data), "--split", "test", "--mode", "hybrid", "--output", str(out),
                                   "-q"])
    assert res.exit_code == 0, res.output
    task = RetrievalTask.create("beir").load_data(str(data), "test")
    hybrid = evaluate(load(str(tiny_bert_dir)), task, metrics=["ndcg@10"], mode="hybrid").metrics["ndcg@10"]
    assert json.loads(out.read_text())["mean_b"] == pytest.approx(hybrid, abs=1e-6)
    assert abs(hybrid - ref) > 1e-6  # the BM25 side changed the ranking: the mode was not ignored
    res = CliRunner().invoke(app, ["eval", "--compare", str(tmp_path / "a.trec"), str(tiny_bert_dir),
                                   "--data", str(data), "--split", "test", "--mode", "lexical"])
    assert res.exit_code == 1 and "error: mode lexical" in res.output
    res = CliRunner().invoke(app, ["eval", "--compare", str(tmp_path / "a.trec"), str(tmp_path / "b.trec"),
                                   "--data", str(data), "--metrics", "ndcg@10,map@10"])
    assert res.exit_code == 1 and "error: --compare takes one metric" in res.output
