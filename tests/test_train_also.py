"""`medadapt train` with `eval.also`: extra evaluation sets scored for the frozen base and the trained model.

One tiny `kind: moe` run (the synonym set of test_train_recipe: the head learns lay word -> condition) with two
more sets: `lay` (the lay word alone as the query: the head gains there too) and `swapped` (the same lay words,
but each query's relevant document is the next condition: the head's learned association now points at the
wrong document, so it must lose to the frozen base). metrics.json, the card, the final table and the warning
lines are checked against the two models scored directly with `evaluate_retrieval`; a bad entry stops the
run before any training.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

import medadapt
from _helpers import tiny_system_recipe
from medadapt.cli import app

TINY = Path(__file__).resolve().parents[1] / "recipes" / "med-moe-embed-tiny.yaml"
METRICS = ["ndcg@10", "mrr@10"]


def _sets(root: Path) -> dict[str, Path]:
    """The training set (`syn`) and the two extra sets (`lay`, `swapped`), all on one corpus."""
    from conftest import TOPICS, build_synonym_beir, write_beir

    n = len(TOPICS)
    corpus = {f"d{i}": ("", f"{name} is a condition") for i, (name, _) in enumerate(TOPICS)}
    lay = [words.split()[2] for _, words in TOPICS]
    syn = build_synonym_beir(root / "syn")
    lay_only = write_beir(root / "lay", corpus, {f"q{i}": w for i, w in enumerate(lay)},
                          {"test": {f"q{i}": {f"d{i}": 1} for i in range(n)}})
    swapped = write_beir(root / "swapped", corpus, {f"q{i}": f"treatment of {w}" for i, w in enumerate(lay)},
                         {"test": {f"q{i}": {f"d{(i + 1) % n}": 1} for i in range(n)}})
    return {"syn": syn, "lay": lay_only, "swapped": swapped}


def _args(model_dir, sets, also: str) -> list[str]:
    sets = {k: str(v) for k, v in sets.items()}
    return [f"model.backbone={model_dir}", f"data.path={sets['syn']}", "data.hard_negatives.window=[2, 6]",
            "head.expansion=1", "head.residual_scale=1.0", "training.batch_size=4", "training.lr=1e-2",
            "training.shared_epochs=5", "training.random_routing_epochs=2", "training.epochs=30",
            "eval.split=test", f"eval.metrics=[{', '.join(METRICS)}]", f"eval.also={also}"]


def _invoke(options: list[str], settings: list[str]):
    return CliRunner().invoke(app, ["train", str(TINY), *options, *(x for s in settings for x in ("--set", s))])


@pytest.fixture(scope="module")
def also_run(tiny_bert_dir, tmp_path_factory):
    """The run, once: its folder, the CLI output, the sets and the cache folder."""
    root = tmp_path_factory.mktemp("also")
    sets = _sets(root)
    also = f"[{{data: {sets['lay']}}}, {{data: {sets['swapped']}, split: test, label: swapped}}]"
    out = root / "run"
    result = _invoke(["--output", str(out), "--cache-dir", str(root / "cache"), "-q"],
                     _args(tiny_bert_dir, sets, also))
    assert result.exit_code == 0, result.output
    return out, result.output, sets, root / "cache"


def test_metrics_json_has_base_trained_delta_as_direct_scoring(also_run, tiny_bert_dir):
    from medadapt.cache import EmbeddingCache
    from medadapt.data import load_beir
    from medadapt.eval import evaluate_retrieval

    out, _, sets, cache_dir = also_run
    written = json.loads((out / "metrics.json").read_text())
    assert set(written["also"]) == {"lay/test", "swapped"}
    assert set(written) == {*METRICS, "also"}  # the eval split's metrics stay flat beside it
    trained, base = medadapt.load(str(out), device="cpu"), medadapt.load(str(tiny_bert_dir), device="cpu")
    for name, folder in (("lay/test", sets["lay"]), ("swapped", sets["swapped"])):
        data = load_beir(folder, "test")
        # a fresh cache: the numbers do not come from what the run stored
        fresh = EmbeddingCache(cache_dir.parent / f"fresh-{folder.name}")
        want_t = evaluate_retrieval(trained, data, "test", METRICS, cache=fresh, show_progress=False)
        want_b = evaluate_retrieval(base, data, "test", METRICS, cache=fresh, show_progress=False)
        row = written["also"][name]
        assert row["trained"] == pytest.approx(want_t, abs=2e-6)
        assert row["base"] == pytest.approx(want_b, abs=2e-6)
        assert row["delta"] == pytest.approx({m: want_t[m] - want_b[m] for m in METRICS}, abs=4e-6)
    # the data does what the test needs: a gain on one set, a loss on the other
    assert written["also"]["lay/test"]["delta"]["ndcg@10"] > 0.02
    assert written["also"]["swapped"]["delta"]["ndcg@10"] < -0.02


def test_warning_exactly_where_the_trained_model_is_below_the_base(also_run):
    out, output, _, _ = also_run
    rows = json.loads((out / "metrics.json").read_text())["also"]
    warnings = [line for line in output.splitlines() if line.startswith("warning: trained model is below")]
    sw = rows["swapped"]
    assert warnings == [f"warning: trained model is below the frozen base on swapped: nDCG@10 "
                        f"{sw['trained']['ndcg@10']:.4f} < {sw['base']['ndcg@10']:.4f} "
                        f"({sw['delta']['ndcg@10']:+.4f})"]
    # the final table has the sets' rows with the base, the trained model and the change
    for name, row in rows.items():
        line = next(x for x in output.splitlines() if f"{name} ndcg@10" in x)
        assert [f"{row[p]['ndcg@10']:{f}}" for p, f in (("base", ".4f"), ("trained", ".4f"), ("delta", "+.4f"))] \
            == line.replace("│", " ").split()[2:5], line


def test_card_shows_the_sets(also_run):
    out, _, _, _ = also_run
    card = (out / "README.md").read_text()
    rows = json.loads((out / "metrics.json").read_text())["also"]
    assert "## Evaluation on other data (`eval.also`)" in card
    for name, row in rows.items():
        for m in METRICS:
            assert (f"| {name} | {m} | {row['trained'][m]:.4f} | {row['base'][m]:.4f} | "
                    f"{row['delta'][m]:+.4f} |") in card


@pytest.mark.parametrize("also, message", [
    ("[{data: NOWHERE}]", "eval.also nowhere/test: data folder not found"),
    ("[{data: LAY, split: dev}]", "eval.also lay/dev: qrels file not found"),
    ("[{data: LAY, splt: test}]", "splt"),
    ("[{data: LAY}, {data: LAY}]", "two sets are named lay/test"),
])
def test_bad_entry_fails_before_training(tiny_bert_dir, tmp_path, also, message):
    sets = _sets(tmp_path)
    also = also.replace("LAY", str(sets["lay"])).replace("NOWHERE", str(tmp_path / "nowhere"))
    out = tmp_path / "run"
    result = _invoke(["--output", str(out), "--cache-dir", str(tmp_path / "cache"), "-q"],
                     _args(tiny_bert_dir, sets, also))
    assert result.exit_code == 1, result.output
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error:") and message in lines[0], result.output
    assert not out.exists() and not (tmp_path / "run.checkpoints").exists()  # nothing trained


@pytest.mark.parametrize("kind", ["hyrec", "care", "bmretriever", "moe-hybrid", "moe-care-query"])
def test_every_kind_scores_its_sets_as_its_own_split(kind, tiny_bert_dir, tiny_qwen2_dir, tiny_beir_dir, tmp_path):
    """The one implementation for every kind: an `also` set that is the run's own eval split gets exactly
    the run's metrics and frozen-base metrics (per mode for a hybrid model, the base as `dense/`), and
    another set gets a base, a trained score and their difference. A head on the query route alone is
    scored against the frozen document embeddings (the base's, from the cache) through the model's own
    encode_query / encode_document."""
    from medadapt.cache import EmbeddingCache
    from medadapt.data import load_beir
    from medadapt.eval import evaluate_retrieval
    from medadapt.recipes import run_recipe

    sets = _sets(tmp_path / "sets")
    recipe, overrides = tiny_system_recipe(kind, tiny_bert_dir, tiny_qwen2_dir, tiny_beir_dir)
    also = f"[{{data: {tiny_beir_dir}, label: same}}, {{data: {sets['swapped']}}}]"
    cache = EmbeddingCache(tmp_path / "cache")
    res = run_recipe(recipe, tmp_path / "run", [*overrides, f"eval.also={also}"], cache=cache,
                     show_progress=False, log=lambda _m: None)
    assert set(res.also) == {"same", "swapped/test"}
    same = res.also["same"]
    assert same["trained"] == pytest.approx(res.metrics, abs=1e-9)
    assert res.baseline and same["base"] == pytest.approx(res.baseline, abs=1e-9)
    for row in res.also.values():
        assert row["base"] and row["delta"] == pytest.approx(
            {k: row["trained"][k] - row["base"][k] for k in row["base"]}, abs=1e-12)
        if kind in ("hyrec", "moe-hybrid"):  # per mode; the base is the dense one
            assert {"lexical/ndcg@10", "dense/ndcg@10", "hybrid/ndcg@10"} <= set(row["trained"])
            assert set(row["base"]) == set(row["delta"]) and all(k.startswith(("dense/", "hybrid/")) for k in row["base"])
            for metric in ("ndcg@10",):  # the served hybrid and the dense side are each set beside the plain base
                assert row["base"][f"hybrid/{metric}"] == row["base"][f"dense/{metric}"]
    assert json.loads((tmp_path / "run" / "metrics.json").read_text())["also"]["swapped/test"]["trained"] \
        == pytest.approx(res.also["swapped/test"]["trained"], abs=1e-6)
    if kind == "moe-care-query":
        data = load_beir(sets["swapped"], "test")
        trained = medadapt.load(str(tmp_path / "run"), device="cpu")
        fresh = EmbeddingCache(tmp_path / "fresh")
        direct = evaluate_retrieval(trained, data, "test", list(res.metrics), cache=fresh, show_progress=False)
        assert res.also["swapped/test"]["trained"] == pytest.approx(direct, abs=1e-6)
        base = medadapt.load(overrides[-2].split("=", 1)[1], device="cpu")  # model.backbone: the asymmetric base
        docs = data.doc_texts()
        assert cache.role_fingerprint(trained, "document") == cache.role_fingerprint(base, "document")
        assert cache.count_missing(base, docs, "document") == 0  # the base's corpus encode, shared
        assert abs(trained.encode_document(docs) - base.encode_document(docs)).max() < 1e-6


def test_per_mode_rows_compare_the_dense_and_hybrid_modes_with_the_plain_base():
    """A hybrid model's `<mode>/<metric>` beside a plain (dense) base: the base stands beside `dense/` and the
    served `hybrid/` rows, never `lexical/`; the warning reads the first metric's hybrid mode (what is served);
    equal scores give no warning."""
    from medadapt.recipes.also import compare, regression_warning

    trained = {"lexical/ndcg@10": 0.5, "dense/ndcg@10": 0.375, "hybrid/ndcg@10": 0.9, "dense/mrr@10": 0.25,
               "hybrid/mrr@10": 0.125, "lexical/q_terms": 7.0}
    row = compare(trained, {"ndcg@10": 0.4, "mrr@10": 0.2})
    assert row["base"] == {"dense/ndcg@10": 0.4, "dense/mrr@10": 0.2, "hybrid/ndcg@10": 0.4, "hybrid/mrr@10": 0.2}
    assert row["delta"] == pytest.approx({"dense/ndcg@10": -0.025, "dense/mrr@10": 0.05, "hybrid/ndcg@10": 0.5,
                                          "hybrid/mrr@10": -0.075})
    assert regression_warning("x/test", row, "ndcg@10") is None  # the dense side is below, the served model above
    assert regression_warning("x/test", row, "mrr@10") == \
        "warning: trained model is below the frozen base on x/test: hybrid/MRR@10 0.1250 < 0.2000 (-0.0750)"
    dense_only = compare({"dense/ndcg@10": 0.375}, {"ndcg@10": 0.4})
    assert regression_warning("x/test", dense_only, "ndcg@10") == \
        "warning: trained model is below the frozen base on x/test: dense/nDCG@10 0.3750 < 0.4000 (-0.0250)"
    same = compare({"ndcg@10": 0.4}, {"ndcg@10": 0.4})
    assert regression_warning("x/test", same, "ndcg@10") is None
