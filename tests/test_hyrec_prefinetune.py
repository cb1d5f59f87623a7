"""HyReC's paper stages (issue 16 item 1): weight decay really reaches the optimiser, the preliminary
fine-tuning on score-filtered pairs runs end to end in the tiny twin (filter = hand-computed cosines, its loss
goes down, the main stage starts from its weights, resumable across the stage boundary), clear errors, and the
paper recipe plans as the 768-d 1 + 1 + 1 small model."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from typer.testing import CliRunner

from medadapt.errors import ConfigError, DataError
from medadapt.hyrec.data import Example, filter_pairs, load_pairs, score_pairs
from medadapt.hyrec.model import HyReCConfig, HyReCModel
from medadapt.hyrec.sections import HyReCLossSection, HyReCRecipe, HyReCTrainingSection
from medadapt.hyrec.train import train_hyrec
from medadapt.recipes import load_recipe, run_recipe

pytestmark = pytest.mark.usefixtures("_single_thread")

ROOT = Path(__file__).resolve().parents[1]
TINY = ROOT / "recipes" / "hyrec-tiny.yaml"


def _pairs() -> list[tuple[str, str]]:
    from conftest import TOPICS

    pairs = []
    for i, (name, words) in enumerate(TOPICS):
        pairs.append((f"what is {name}", f"{name} is a condition with {words}."))
        other = TOPICS[(i + 3) % len(TOPICS)]
        pairs.append((f"{name} treatment", f"{other[0]} {other[1]}"))  # a noisy pair
    return pairs


def _write_pairs(path: Path, pairs) -> Path:
    with open(path, "w", encoding="utf-8") as f:
        f.writelines(json.dumps({"query": q, "pos": [p]}) + "\n" for q, p in pairs)
    return path


def _hand_cosines(st, pairs) -> np.ndarray:
    """Cosine of each pair, by hand from the un-normalised embeddings."""
    q = st.encode([a for a, _ in pairs], normalize_embeddings=False, convert_to_numpy=True)
    p = st.encode([b for _, b in pairs], normalize_embeddings=False, convert_to_numpy=True)
    return (q * p).sum(1) / (np.linalg.norm(q, axis=1) * np.linalg.norm(p, axis=1))


def _threshold(cos: np.ndarray) -> float:
    """A threshold half-way between two scores near the median (some pairs kept, some dropped, none on
    the edge)."""
    s = np.sort(cos)
    i = len(s) // 2
    assert s[i] - s[i - 1] > 1e-5
    return float((s[i] + s[i - 1]) / 2)


def test_weight_decay_reaches_the_optimizer(tiny_bert_dir):
    """One AdamW step (lr 1e-2, no warm-up) with weight decay 0.5 vs 0: the same gradient update, plus the
    decoupled decay ``lr * wd * p`` on every matrix and nothing on vectors (biases, LayerNorm)."""
    lr, wd = 1e-2, 0.5
    ex = [Example("gout pain in the toe", "gout is a condition with toe uric acid crystals"),
          Example("asthma inhaler", "asthma is a condition with wheezing inhaler airway")]
    models = {}
    for decay in (0.0, wd):
        torch.manual_seed(0)
        model = HyReCModel.from_backbone(str(tiny_bert_dir), HyReCConfig(language="en"))
        before = {n: p.detach().clone() for n, p in model.named_parameters()}
        train_hyrec(model, ex, HyReCTrainingSection(batch_size=2, max_steps=1, lr=lr, warmup_ratio=0.0,
                                                    weight_decay=decay), HyReCLossSection(), negatives=0)
        models[decay] = (before, dict(model.named_parameters()))
    before, plain = models[0.0]
    before_wd, decayed = models[wd]
    n_mat = 0
    for name, p in plain.items():
        torch.testing.assert_close(before[name], before_wd[name])  # the same start
        diff = (p - decayed[name]).detach()
        if torch.equal(p.detach(), before[name]):  # no gradient (BERT's unused pooler): AdamW skips it
            assert torch.equal(decayed[name].detach(), before[name]), name
            continue
        if p.ndim >= 2:
            n_mat += 1
            assert (lr * wd * before[name]).abs().max() > 1e-4  # the check has teeth
            torch.testing.assert_close(diff, lr * wd * before[name], atol=5e-8, rtol=1e-4)
        else:
            assert torch.equal(diff, torch.zeros_like(diff)), name
    assert n_mat >= 20  # embeddings, shared, lexicon and dense layers, the three projectors


def test_paper_recipe_declares_weight_decay_and_prefinetune():
    r = load_recipe(ROOT / "recipes" / "hyrec.yaml", expect=HyReCRecipe)
    assert r.training.weight_decay == 0.01
    pre = r.prefinetune
    assert pre is not None and pre.scorer == "shibing624/text2vec-base-chinese" and pre.min_score == 0.43
    assert pre.data.startswith("data/hyrec/")
    ptr = pre.training(r.training)  # unset fields come from the main stage (the paper: same settings)
    assert (ptr.lr, ptr.batch_size, ptr.weight_decay, ptr.epochs, ptr.max_steps) == (5e-5, 64, 0.01, 5, None)
    assert (r.model.backbone, r.model.num_layers, r.model.branch_layers) == ("BAAI/bge-base-zh-v1.5", 2, 1)


def test_paper_recipe_plans_the_768d_small_model():
    """`medadapt plan` from the shipped bge-base-zh config: embeddings + 3 BERT layers (1 shared, 1 lexicon,
    1 dense; the unused pooler is counted, it is in the loaded model) + the three projectors, counted by
    hand; the preliminary fine-tuning is a phase of its own (query + positive, no hard negatives)."""
    from medadapt.plan import Hardware, plan_recipe

    cfg = json.loads((ROOT / "recipes/configs/bge-base-zh-v1.5/config.json").read_text())
    h, ff, v, pos = cfg["hidden_size"], cfg["intermediate_size"], cfg["vocab_size"], cfg["max_position_embeddings"]
    assert (h, cfg["num_hidden_layers"]) == (768, 12)
    emb = v * h + pos * h + cfg["type_vocab_size"] * h + 2 * h
    layer = 4 * (h * h + h) + 2 * h + (h * ff + ff) + (ff * h + h) + 2 * h
    projectors = (h + 1) + (4 * h + 4) + (h * h + h)
    encoder = emb + 3 * layer
    assert round(encoder / 1e6, 1) == 37.9  # the paper's "38M"
    r = load_recipe(ROOT / "recipes" / "hyrec.yaml", expect=HyReCRecipe)
    plan = plan_recipe(r, Hardware(num_gpus=1, gpu_memory_gb=80))
    assert plan.models[0].total_params == encoder + (h * h + h) + projectors == 39_071_237
    assert [p.name for p in plan.phases] == ["RetroMAE pre-training", "preliminary fine-tuning", "fine-tuning"] and plan.fits
    assert plan.phases[1].tokens_per_step == 64 * (64 + 256)
    assert plan.phases[2].tokens_per_step == 64 * (64 + 4 * 256)


def test_filter_keeps_exactly_the_pairs_at_or_above_the_threshold(tiny_bert, tmp_path):
    from medadapt.cache import EmbeddingCache

    pairs = _pairs()
    cos = _hand_cosines(tiny_bert, pairs)
    t = _threshold(cos)
    scores = score_pairs(tiny_bert, pairs)
    np.testing.assert_allclose(scores, cos, atol=1e-5)
    cache = EmbeddingCache(tmp_path / "cache")
    np.testing.assert_allclose(score_pairs(tiny_bert, pairs, cache=cache), cos, atol=1e-3)  # fp16 cache
    kept = filter_pairs(pairs, scores, t)
    assert [(e.query, e.positive) for e in kept] == [pr for pr, c in zip(pairs, cos) if c >= t]
    assert 0 < len(kept) < len(pairs) and all(e.negatives == [] for e in kept)
    assert len(filter_pairs(pairs, scores, -1.0)) == len(pairs)
    k = int(np.argsort(scores)[len(scores) // 2])  # a threshold equal to a score keeps that pair (>=)
    assert (pairs[k][0], pairs[k][1]) in [(e.query, e.positive) for e in filter_pairs(pairs, scores, scores[k])]
    assert len(filter_pairs(pairs, scores, t, max_pairs=2)) == 2
    with pytest.raises(DataError, match="no pair scores >= 1.0"):
        filter_pairs(pairs, scores, 1.0)
    # JSONL groups (every positive is a pair) and BEIR folders
    path = tmp_path / "p.jsonl"
    path.write_text(json.dumps({"query": "a", "pos": ["x", "y"]}) + "\n" + json.dumps({"query": "b", "pos": ["z"]}))
    assert load_pairs(path) == [("a", "x"), ("a", "y"), ("b", "z")]
    with pytest.raises(DataError, match="pairs not found"):
        load_pairs(tmp_path / "nope.jsonl")


def _overrides(tiny_bert_dir, tiny_beir_dir, pairs_file, threshold, *extra):
    return [f"model.backbone={tiny_bert_dir}", f"data.path={tiny_beir_dir}", "training.epochs=1",
            "training.weight_decay=0.01", f"prefinetune.data={pairs_file}", f"prefinetune.scorer={tiny_bert_dir}",
            f"prefinetune.min_score={threshold}", "prefinetune.epochs=8", "prefinetune.lr=1e-3",
            "prefinetune.batch_size=4", *extra]


class _Snapshots:
    """Wraps :func:`medadapt.hyrec.train.hyrec_stage` so every stage records the model's weights when it
    starts and when it ends."""

    def __init__(self, monkeypatch):
        import medadapt.hyrec.train as ht

        self.at: dict[str, dict[str, torch.Tensor]] = {}
        real = ht.hyrec_stage

        def wrapped(model, *a, **k):
            stage = real(model, *a, **k)
            start, end = stage.on_start, stage.on_end

            def snap(when):
                self.at[f"{stage.name}:{when}"] = {n: p.detach().clone() for n, p in model.named_parameters()}

            def on_start():
                snap("start")
                if start is not None:
                    start()

            def on_end():
                snap("end")
                if end is not None:
                    end()

            stage.on_start, stage.on_end = on_start, on_end
            return stage

        monkeypatch.setattr(ht, "hyrec_stage", wrapped)


def _equal(a: dict, b: dict) -> bool:
    return all(torch.equal(a[n], b[n]) for n in a)


def test_prefinetune_runs_end_to_end_in_the_tiny_twin(tiny_bert, tiny_bert_dir, tiny_beir_dir, tmp_path,
                                                       monkeypatch):
    pairs = _pairs()
    cos = _hand_cosines(tiny_bert, pairs)
    t = _threshold(cos)
    n_kept = int((cos >= t).sum())
    pairs_file = _write_pairs(tmp_path / "pairs.jsonl", pairs)
    snaps = _Snapshots(monkeypatch)
    recipe = load_recipe(TINY, _overrides(tiny_bert_dir, tiny_beir_dir, pairs_file, t), expect=HyReCRecipe)
    res = run_recipe(recipe, tmp_path / "run", show_progress=False, log=lambda m: None)

    d = res.details["prefinetune"]
    assert (d["pairs"], d["passed_filter"], d["train_examples"]) == (len(pairs), n_kept, n_kept)
    steps_per_epoch = -(-n_kept // 4)
    assert d["steps"] == 8 * steps_per_epoch
    rows = [r for r in res.loss_history if r["stage"] == "prefinetune"]
    assert len(rows) == d["steps"] and {r["stage"] for r in res.loss_history} == {"prefinetune", "hyrec"}
    first = np.mean([r["loss"] for r in rows[: 2 * steps_per_epoch]])  # first two epochs vs last two
    last = np.mean([r["loss"] for r in rows[-2 * steps_per_epoch:]])
    assert last < 0.8 * first, (first, last)  # measured 3.90 -> 2.22

    # the main stage starts from the pre-fine-tuned weights, which are not the initial ones
    at = dict(snaps.at)
    assert _equal(at["hyrec:start"], at["prefinetune:end"])
    assert not _equal(at["prefinetune:start"], at["prefinetune:end"])
    assert not _equal(at["hyrec:end"], at["hyrec:start"])
    saved = HyReCModel.load(tmp_path / "run")  # the saved model is the main stage's result
    for n, p in saved.named_parameters():
        torch.testing.assert_close(p, at["hyrec:end"][n])

    # without the stage, the main stage starts from the initial weights (the same seed)
    snaps.at.clear()
    plain = load_recipe(TINY, [f"model.backbone={tiny_bert_dir}", f"data.path={tiny_beir_dir}", "training.epochs=1"],
                        expect=HyReCRecipe)
    run_recipe(plain, tmp_path / "plain", show_progress=False, log=lambda m: None, evaluate=False)
    assert set(snaps.at) == {"hyrec:start", "hyrec:end"}
    assert _equal(snaps.at["hyrec:start"], at["prefinetune:start"])


def test_prefinetune_resumes_across_the_stage_boundary(tiny_bert_dir, tiny_beir_dir, tmp_path, monkeypatch):
    """Killed at the main stage's first step, the run resumes from the checkpoint at the end of the
    preliminary stage (not re-run) and ends with exactly the weights and losses of an uninterrupted run."""
    import medadapt.recipes.run as rr
    from medadapt.recipes.run import checkpoint_dir_for

    pairs_file = _write_pairs(tmp_path / "pairs.jsonl", _pairs())
    over = _overrides(tiny_bert_dir, tiny_beir_dir, pairs_file, -1.0, "prefinetune.epochs=1")
    recipe = load_recipe(TINY, over, expect=HyReCRecipe)
    ref = run_recipe(recipe, tmp_path / "whole", show_progress=False, log=lambda m: None, evaluate=False)
    n_pre = ref.details["prefinetune"]["steps"]
    assert n_pre == -(-len(_pairs()) // 4)

    class Kill(Exception):
        pass

    class KillBar:  # the run's progress bar, stopping the run at the main stage's first step
        def __call__(self, stage, step, total, row):
            if stage == "hyrec":
                raise Kill

        def close(self):
            pass

    kill = KillBar()

    monkeypatch.setattr(rr.RunContext, "progress", lambda self: kill)
    out = tmp_path / "killed"
    with pytest.raises(Kill):
        run_recipe(recipe, out, show_progress=False, log=lambda m: None, evaluate=False)
    assert not out.exists()
    assert sorted(p.name for p in checkpoint_dir_for(out).glob("step-*")) == [f"step-{n_pre:08d}"]
    monkeypatch.setattr(rr.RunContext, "progress", lambda self: None)
    res = run_recipe(recipe, out, show_progress=False, log=lambda m: None, evaluate=False)
    assert [r["loss"] for r in res.loss_history] == [r["loss"] for r in ref.loss_history]
    for (name, a), b in zip(ref.model.named_parameters(), res.model.parameters()):
        assert torch.equal(a, b), name


def test_bad_prefinetune_input_is_one_clear_error(tiny_bert_dir, tiny_beir_dir, tmp_path):
    from medadapt.cli import app

    for bad in ("1.5", "-1.01"):
        with pytest.raises(ConfigError, match="min_score"):
            load_recipe(TINY, [f"prefinetune.data={tmp_path}", f"prefinetune.min_score={bad}"])
    with pytest.raises(ConfigError, match="in-batch negatives"):
        load_recipe(TINY, [f"prefinetune.data={tmp_path}", "prefinetune.batch_size=1"])
    missing = tmp_path / "missing.jsonl"
    over = _overrides(tiny_bert_dir, tiny_beir_dir, missing, 0.4)
    with pytest.raises(DataError, match="pairs not found"):
        run_recipe(load_recipe(TINY, over), tmp_path / "run", show_progress=False, log=lambda m: None)
    assert not (tmp_path / "run").exists()
    res = CliRunner().invoke(app, ["train", str(TINY), "--output", str(tmp_path / "cli"), "--quiet",
                                   *[a for o in over for a in ("--set", o)]])
    assert res.exit_code == 1 and "Traceback" not in res.output, res.output
    errors = [ln for ln in res.output.splitlines() if ln.startswith("error:")]
    assert len(errors) == 1 and "pairs not found" in errors[0] and str(missing) in res.output.replace("\n", "")
