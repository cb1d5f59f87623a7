"""ANCE-style self-mining for HyReC (``negatives.refresh_every``): the rounds train as one stage would (one
schedule, one data order), a refresh really changes the negatives (mined by the model being trained), a run
killed inside a refreshed round resumes onto the uninterrupted run, and bad settings are one clear error."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from medadapt.errors import ConfigError
from medadapt.hyrec.sections import HyReCRecipe
from medadapt.recipes import load_recipe, run_recipe

pytestmark = pytest.mark.usefixtures("_single_thread")

TINY = Path(__file__).resolve().parents[1] / "recipes" / "hyrec-tiny.yaml"
QUIET = {"show_progress": False, "log": lambda m: None}


def _recipe(bert, beir, *extra) -> HyReCRecipe:
    """12 train queries, batch 4: 3 steps an epoch, 3 epochs; BM25 negatives in ranks 1-6 first, then the
    model's own every epoch (rounds of 3 steps)."""
    return load_recipe(TINY, [f"model.backbone={bert}", f"data.path={beir}", "training.epochs=3",
                              "training.max_steps=null", "training.batch_size=4", "training.lr=2e-3",
                              "training.head_lr=2e-3", "negatives.source=bm25", "negatives.num=2",
                              "negatives.window=[1,6]", "negatives.refresh_every=1", *extra], expect=HyReCRecipe)


def test_rounds_train_exactly_as_one_stage(tiny_bert_dir, tiny_beir_dir):
    """Cut into rounds with a refresh that changes nothing, the stage gives the same losses and learning
    rates (one optimiser, one schedule, the loop's own data order)."""
    from medadapt.data import load_beir
    from medadapt.hyrec.data import build_examples
    from medadapt.hyrec.model import HyReCConfig, HyReCModel
    from medadapt.hyrec.sections import HyReCTrainingSection
    from medadapt.hyrec.train import hyrec_stage, refreshed_stages
    from medadapt.training.loop import train

    data = load_beir(tiny_beir_dir, ["train"])
    examples = build_examples(data, "train", negatives="bm25", window=(1, 6), num_negatives=2, show_progress=False)
    tr = HyReCTrainingSection(epochs=2, batch_size=4, lr=2e-3, warmup_ratio=0.2)
    runs, refreshed = [], []
    for cut in (False, True):
        torch.manual_seed(0)
        model = HyReCModel.from_backbone(str(tiny_bert_dir), HyReCConfig(language="en"))
        stage = hyrec_stage(model, examples, tr, negatives=2)
        stages = refreshed_stages(stage, 2, refreshed.append, tr.seed) if cut else [stage]
        runs.append(train(model, stages, seed=tr.seed).loss_history)
    assert refreshed == [1, 2]  # 6 steps in rounds of 2: two refreshes
    assert [r["stage"] for r in runs[1]] == ["hyrec"] * 2 + ["hyrec.1"] * 2 + ["hyrec.2"] * 2
    assert [(r["loss"], r["lr"]) for r in runs[0]] == [(r["loss"], r["lr"]) for r in runs[1]]


def test_refresh_changes_the_negatives_and_resume_is_exact(tiny_bert_dir, tiny_beir_dir, tmp_path, monkeypatch):
    import medadapt.recipes.run as rr
    from medadapt.hyrec.model import HyReCModel
    from medadapt.recipes.run import checkpoint_dir_for

    recipe = _recipe(tiny_bert_dir, tiny_beir_dir, "training.checkpoint_every_steps=2")
    ref = run_recipe(recipe, tmp_path / "whole", evaluate=False, **QUIET)
    sm = ref.details["self_mining"]
    assert sm["every_steps"] == 3 and sm["rounds"] == 3
    assert set(sm["changed"]) == {"1", "2"} and sm["changed"]["1"] > 0  # the model mines other negatives than BM25
    assert {r["stage"] for r in ref.loss_history} == {"hyrec", "hyrec.1", "hyrec.2"}

    class Kill(Exception):
        pass

    class KillBar:
        def __call__(self, stage, step, total, row):
            if step == 5:  # inside round 1 (steps 4-6), after its negatives were mined
                raise Kill

        def close(self):
            pass

    monkeypatch.setattr(rr.RunContext, "progress", lambda self: KillBar())
    out = tmp_path / "killed"
    with pytest.raises(Kill):
        run_recipe(recipe, out, evaluate=False, **QUIET)
    assert (checkpoint_dir_for(out) / "self-mining" / "round-1.json").is_file()
    assert max(p.name for p in checkpoint_dir_for(out).glob("step-*")) == "step-00000004"

    monkeypatch.setattr(rr.RunContext, "progress", lambda self: None)
    res = run_recipe(recipe, out, evaluate=False, **QUIET)
    assert [r["loss"] for r in res.loss_history] == [r["loss"] for r in ref.loss_history]
    a, b = HyReCModel.load(tmp_path / "whole"), HyReCModel.load(out)
    for (name, pa), pb in zip(a.named_parameters(), b.parameters()):
        assert torch.equal(pa, pb), name


def test_bad_self_mining_settings(tiny_bert_dir, tiny_beir_dir):
    with pytest.raises(ConfigError, match="never be refreshed"):
        _recipe(tiny_bert_dir, tiny_beir_dir, "negatives.refresh_every=3")
    with pytest.raises(ConfigError, match="needs negatives.num >= 1"):
        _recipe(tiny_bert_dir, tiny_beir_dir, "negatives.source=none")
    with pytest.raises(ConfigError, match="does not train here"):
        _recipe(tiny_bert_dir, tiny_beir_dir, "model.variant=frozen", "training.train_dense_encoder=false")
    assert _recipe(tiny_bert_dir, tiny_beir_dir, "negatives.refresh_unit=steps",
                   "negatives.refresh_every=5").negatives.refresh_every == 5


def test_a_composed_branch_refuses_kind_hyrec_only_settings():
    """A ``hyrec_lexical`` branch trains on a frozen dense model's caches: no self-mining, no per-device
    batch, no backbone from scratch (each would be silently ignored otherwise)."""
    from medadapt.hyrec.branch import HyReCLexicalBranch

    assert HyReCLexicalBranch.model_validate({}).negatives.refresh_every is None
    for bad in ({"negatives": {"refresh_every": 1}}, {"training": {**HyReCLexicalBranch().training.model_dump(),
                                                                   "batch_size_scope": "per_device"}}):
        with pytest.raises(ValueError, match="kind: hyrec's"):
            HyReCLexicalBranch.model_validate(bad)
    with pytest.raises(ValueError, match="init are not available"):
        HyReCLexicalBranch.model_validate({"model": {"init": "scratch"}})
