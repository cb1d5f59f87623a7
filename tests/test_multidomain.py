"""One model for several medical domains: ``data.mix`` / ``data.balance`` of the ``moe`` recipe
(medadapt.data.merge_beir, medadapt.moe.train.balanced_pairs)."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import numpy as np
import pytest

from medadapt.data import domain_of, load_beir, merge_beir
from medadapt.errors import ConfigError, DataError
from medadapt.moe.train import balanced_pairs
from medadapt.training.pairs import HeadTrainingData, pairs_from_qrels

pytestmark = pytest.mark.usefixtures("_single_thread")
RECIPE = Path(__file__).resolve().parents[1] / "recipes" / "linear-query-demo.yaml"


@pytest.fixture
def two_domains(tmp_path):
    """Two synonym sets on the same conditions, each naming them by a different lay word."""
    from conftest import TOPICS, build_synonym_beir

    return (build_synonym_beir(tmp_path / "alpha", 2, dev=True),
            build_synonym_beir(tmp_path / "beta", 3, TOPICS[: len(TOPICS) // 2], dev=True))


def test_merge_beir_prefixes_every_id_and_keeps_every_judgement(two_domains):
    a, b = (load_beir(p, ["train", "test"]) for p in two_domains)
    merged = merge_beir({"alpha": a, "beta": b})
    assert len(merged.corpus) == len(a.corpus) + len(b.corpus)
    assert len(merged.queries) == len(a.queries) + len(b.queries)
    for split in ("train", "test"):
        assert sum(len(r) for r in merged.qrels[split].values()) == \
            sum(len(r) for r in a.qrels[split].values()) + sum(len(r) for r in b.qrels[split].values())
    assert merged.qrels["train"]["beta/t0"] == {"beta/d0": 1}
    assert merged.doc_text("alpha/d1") == a.doc_text("d1")
    assert domain_of("beta/t0") == "beta" and domain_of("alpha/x/y") == "alpha"
    with pytest.raises(DataError, match="without '/'"):
        merge_beir({"a/b": a})


def test_balanced_pairs_gives_every_domain_the_largest_domains_count_and_keeps_every_pair(two_domains):
    merged = merge_beir({"alpha": load_beir(two_domains[0], "train"), "beta": load_beir(two_domains[1], "train")})
    pairs = pairs_from_qrels(merged, "train")
    prepared = HeadTrainingData(pairs, np.zeros((len(pairs.query_ids), 2)), np.zeros((len(merged.corpus), 2)), None)
    keep = balanced_pairs(prepared, seed=0)
    counts = Counter(domain_of(pairs.query_ids[pairs.pair_query[i]]) for i in keep)
    n_alpha = sum(domain_of(q) == "alpha" for q in pairs.query_ids)
    assert counts == {"alpha": n_alpha, "beta": n_alpha} and n_alpha > len(pairs) - n_alpha
    assert set(keep.tolist()) == set(range(len(pairs)))  # nothing dropped
    np.testing.assert_array_equal(keep, balanced_pairs(prepared, seed=0))  # seeded


def test_mix_recipe_trains_one_head_that_gains_on_both_domains(tiny_bert_dir, two_domains, tmp_path, monkeypatch):
    from medadapt.recipes import load_recipe, run_recipe

    monkeypatch.setenv("MEDADAPT_CACHE", str(tmp_path / "cache"))
    alpha, beta = two_domains
    sets = [f"model.backbone={tiny_bert_dir}", f"data.path={alpha}", f"data.mix=[{{path: {beta}}}]",
            "data.balance=domain", "training.batch_size=4", "training.lr=3e-2", "training.epochs=30",
            "training.warmup_ratio=0", "eval.split=test", "eval.metrics=[ndcg@10]", "eval.expected={}",
            f"eval.also=[{{data: {beta}, split: test}}]"]
    out = tmp_path / "run"
    result = run_recipe(load_recipe(RECIPE, sets), out, show_progress=False, log=lambda _m: None)
    log = json.loads((out / "train_log.json").read_text())
    from conftest import TOPICS

    n_alpha = len(TOPICS)
    assert log["pairs_per_domain"] == {"alpha": n_alpha, "beta": n_alpha // 2}
    assert log["balanced_pairs"] == 2 * n_alpha
    metrics = json.loads((out / "metrics.json").read_text())
    base = json.loads((out / "baseline_metrics.json").read_text())
    assert result.metrics["ndcg@10"] > base["ndcg@10"] + 0.05
    also = metrics["also"]["beta/test"]
    assert also["trained"]["ndcg@10"] > also["base"]["ndcg@10"] + 0.05


def test_mix_bad_input_is_one_clear_error(two_domains):
    from medadapt.recipes import load_recipe

    with pytest.raises(ConfigError, match="same name"):
        load_recipe(RECIPE, [f"data.mix=[{{path: {two_domains[0]}}}]", f"data.path={two_domains[0]}"])
    with pytest.raises(ConfigError, match="needs data.mix"):
        load_recipe(RECIPE, ["data.balance=domain"])
