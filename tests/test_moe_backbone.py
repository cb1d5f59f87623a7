"""Med-MoE-Embed's backbone / LoRA path (``model.freeze_backbone: false`` or ``model.peft``), one stage of the one
loop (:func:`medadapt.moe.train.backbone_phase`): it learns (beats the untrained backbone on held-out queries), a LoRA is
merged into a folder that loads without PEFT, a non-finite loss stops it before anything is written, and
non-finite weights are never saved. Save/load, exact resume and 2 processes = 1 are in tests/test_systems.py
(``moe-lora``, ``moe-backbone``)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import pytest
import torch

import medadapt
from medadapt.cache import EmbeddingCache
from medadapt.data import load_beir
from medadapt.errors import ConfigError
from medadapt.eval import evaluate_retrieval
from medadapt.adapters import find_head
from medadapt.moe import MoEHead
from medadapt.losses.infonce import InfoNCELoss
from medadapt.recipes import registry, run_recipe
from medadapt.training import TrainingError
from medadapt.training.checkpoint import load_checkpoint
from medadapt.training.loop import Batch
from medadapt.training.steps import TextPairStep, embed

RECIPE = Path(__file__).resolve().parents[1] / "recipes" / "med-moe-embed-tiny.yaml"
QUIET = {"show_progress": False, "log": lambda _m: None}
SLOW = ["training.shared_epochs=0", "training.random_routing_epochs=0", "loss.load_balance_weight=0",
        "training.batch_size=4"]
LORA = "model.peft={kind: lora, r: 4, alpha: 8, target_modules: [query, value]}"


@pytest.fixture()
def synonym_beir_dir(tmp_path):
    """Queries name a topic's lay word, documents its condition: a random backbone has nothing to go on."""
    from conftest import build_synonym_beir

    return build_synonym_beir(tmp_path / "syn")


def _frozen_ndcg(bert: Path, beir: Path, cache: Path) -> float:
    data = load_beir(beir, "test")
    return evaluate_retrieval(medadapt.load(str(bert), device="cpu"), data, "test", ["ndcg@10"],
                              cache=EmbeddingCache(cache), show_progress=False)["ndcg@10"]


def _overrides(bert, beir, *extra):
    return [f"model.backbone={bert}", f"data.path={beir}", "eval.split=test", "eval.metrics=[ndcg@10]", *SLOW,
            *extra]


def test_backbone_training_beats_the_untrained_model(tiny_bert_dir, synonym_beir_dir, tmp_path):
    frozen = _frozen_ndcg(tiny_bert_dir, synonym_beir_dir, tmp_path / "cache")
    res = run_recipe(RECIPE, tmp_path / "run", _overrides(
        tiny_bert_dir, synonym_beir_dir, "model.freeze_backbone=false", "head={kind: none}",
        "data.hard_negatives=null", "training.epochs=20", "training.lr=3e-3"), **QUIET)
    losses = [r["loss"] for r in res.loss_history]
    assert {r["stage"] for r in res.loss_history} == {"train"} and res.details["stage_steps"] == {"train": 60}
    assert np.mean(losses[-3:]) < 0.5 * np.mean(losses[:3])
    assert res.metrics["ndcg@10"] > frozen + 0.3, (res.metrics, frozen)  # held-out queries, other wording
    assert sorted(p.name for p in (tmp_path / "run.checkpoints").iterdir())[-1] == "step-00000060"


def test_lora_with_head_learns_merges_and_reloads(tiny_bert_dir, synonym_beir_dir, tmp_path):
    """LoRA on the backbone plus the MoE head, trained together, beat the untrained model; the LoRA is merged
    and the folder (standalone: the backbone changed) loads without PEFT, head included."""
    frozen = _frozen_ndcg(tiny_bert_dir, synonym_beir_dir, tmp_path / "cache")
    out = tmp_path / "lora"
    res = run_recipe(RECIPE, out, _overrides(
        tiny_bert_dir, synonym_beir_dir, LORA, "data.hard_negatives.window=[2, 6]", "head.expansion=1",
        "head.residual_scale=1.0", "training.epochs=30", "training.lr=1e-2"), **QUIET)
    assert res.metrics["ndcg@10"] > frozen + 0.1, (res.metrics, frozen)
    assert "routing_stats" in res.details and res.details["stage_steps"] == {"train": 90}
    model = medadapt.load(str(out), device="cpu")
    assert isinstance(find_head(model, MoEHead), MoEHead)
    assert not (out / "medadapt_adapter.json").exists()  # the backbone trained: a standalone folder
    assert not any("lora" in n for n, _ in model.named_parameters())  # merged
    base = medadapt.load(str(tiny_bert_dir), device="cpu")
    query = "encoder.layer.0.attention.self.query.weight"
    weights = [dict(m[0].auto_model.named_parameters())[query] for m in (model, base)]
    assert not torch.allclose(*weights)  # the adapter trained the backbone's query projections
    key = "encoder.layer.0.attention.self.key.weight"  # not a LoRA target: unchanged
    torch.testing.assert_close(*[dict(m[0].auto_model.named_parameters())[key] for m in (model, base)])


def test_a_non_finite_loss_stops_the_backbone_path_and_writes_nothing(tiny_bert_dir, tiny_beir_dir, tmp_path,
                                                                     monkeypatch):
    forward, calls = InfoNCELoss.forward, []

    def nan_at_the_third_step(self, *args, **kwargs):
        calls.append(1)
        parts = forward(self, *args, **kwargs)
        return {k: v * float("nan") for k, v in parts.items()} if len(calls) == 3 else parts

    monkeypatch.setattr(InfoNCELoss, "forward", nan_at_the_third_step)
    out = tmp_path / "run"
    with pytest.raises(TrainingError, match="step 3: the loss is not finite"):
        run_recipe(RECIPE, out, _overrides(tiny_bert_dir, tiny_beir_dir, "model.freeze_backbone=false",
                                           "head={kind: none}", "data.hard_negatives=null", "training.epochs=2",
                                           "training.checkpoint_every_steps=2"), evaluate=False, **QUIET)
    assert not out.exists()  # no model folder
    kept = sorted(p.name for p in (tmp_path / "run.checkpoints").iterdir())
    assert kept == ["step-00000002"] and load_checkpoint(tmp_path / "run.checkpoints" / kept[0])[2]["step"] == 2
    assert len(calls) == 3


def test_non_finite_parameters_are_never_saved(tiny_bert_dir, tiny_beir_dir, tmp_path, monkeypatch):
    """Whatever loop a system uses, ``medadapt train`` checks the returned model before writing its folder."""
    kind = registry.get_kind("moe")
    train = kind.train

    def poisoned(recipe, ctx):
        model = train(recipe, ctx)
        with torch.no_grad():
            next(p for p in model.parameters() if p.is_floating_point()).view(-1)[0] = float("inf")
        return model

    get_kind = registry.get_kind
    monkeypatch.setattr(registry, "get_kind", lambda name, *a, **k: dataclasses.replace(kind, train=poisoned)
                        if name == "moe" else get_kind(name, *a, **k))
    out = tmp_path / "run"
    with pytest.raises(TrainingError, match="not finite .*the model folder .* was not written"):
        run_recipe(RECIPE, out, _overrides(tiny_bert_dir, tiny_beir_dir, "model.freeze_backbone=false",
                                           "head={kind: none}", "data.hard_negatives=null", "training.epochs=1"),
                   evaluate=False, **QUIET)
    assert not out.exists()


def test_text_pair_step_with_tasks_and_hard_negatives(tiny_bert):
    """Side a embeds with the query prompt, side b and the negatives with the document prompt; the negatives
    reach the loss as ``(B, k, d)``. Plain pairs keep the task-less embedding."""
    tiny_bert.prompts = {"query": "query: ", "document": "passage: "}
    tiny_bert.eval()
    items = [("gout", "gout is a condition", "asthma", "wheezing"), ("thirst", "diabetes", "rash", "eczema")]
    step = TextPairStep(tiny_bert, items, InfoNCELoss(0.05), tasks=("query", "document"))
    batch = Batch(indices=[0, 1], all_indices=[0, 1], step=0, epoch=0, seed=0)
    with torch.no_grad():
        out = step.forward(tiny_bert, batch)
        assert out["negatives"].shape == (2, 2, out["a"].shape[1])
        torch.testing.assert_close(out["a"], embed(tiny_bert, ["gout", "thirst"], "query"))
        torch.testing.assert_close(out["negatives"][1, 0], embed(tiny_bert, ["rash"], "document")[0])
        assert not torch.allclose(out["a"], embed(tiny_bert, ["gout", "thirst"], None))  # the prompt counts
        expected = InfoNCELoss(0.05)(out["a"], out["b"], out["negatives"])["infonce"]
        torch.testing.assert_close(step.loss(out, batch)["infonce"], expected)
        plain = TextPairStep(tiny_bert, [(a, b) for a, b, *_ in items], InfoNCELoss(0.05))
        assert set(plain.forward(tiny_bert, batch)) == {"a", "b"}
    with pytest.raises(ConfigError, match="same number of hard negatives"):
        TextPairStep(tiny_bert, [("a", "b", "n"), ("a", "b")], InfoNCELoss())


def test_bf16_autocast_trains_the_backbone_path_and_the_head(tiny_bert_dir, tiny_beir_dir, tmp_path):
    """``training.mixed_precision: bf16`` is the accelerator's autocast on the loop (here on the CPU): the
    LoRA + MoE head run trains with finite losses close to, but not equal to, the float32 run's, and the folder
    loads. The MoE head itself routes under autocast in both routing modes (bf16 expert outputs are summed
    into the float32 rows)."""
    from medadapt.moe import MoEConfig
    from medadapt.moe import MoEHead as Head

    args = _overrides(tiny_bert_dir, tiny_beir_dir, LORA, "data.hard_negatives.window=[2, 6]", "training.epochs=1",
                      "training.device=cpu")
    full = run_recipe(RECIPE, tmp_path / "fp32", args, evaluate=False, **QUIET)
    half = run_recipe(RECIPE, tmp_path / "bf16", [*args, "training.mixed_precision=bf16"], evaluate=False, **QUIET)
    a, b = ([r["loss"] for r in res.loss_history] for res in (full, half))
    assert len(a) == len(b) and all(np.isfinite(b))
    assert a != b and np.allclose(a, b, atol=0.05)  # autocast computed in bf16, the same run otherwise
    assert medadapt.load(str(tmp_path / "bf16"), device="cpu").encode_query(["gout"]).shape == (1, 32)
    head = Head(MoEConfig(dim=32, top_k=2))
    x = torch.randn(6, 32)
    for mode in ("learned", "random"):
        head.set_routing(mode)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            out = head({"sentence_embedding": x.clone()})["sentence_embedding"]
        assert out.shape == (6, 32) and bool(torch.isfinite(out).all())
