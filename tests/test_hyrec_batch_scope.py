"""HyReC's batch semantics (``training.batch_size_scope`` / ``pretrain.batch_size_scope``): ``global`` (the
default) is the batch over all processes, ``per_device`` multiplies it by the number of processes for each
stage it governs; the paper recipe reads the fine-tuning batch per GPU and says so in ``medadapt plan``."""

from __future__ import annotations

import contextlib
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from medadapt.hyrec.sections import HyReCRecipe
from medadapt.recipes import load_recipe

ROOT = Path(__file__).resolve().parents[1]
TINY = ROOT / "recipes" / "hyrec-tiny.yaml"


class Stop(Exception):
    pass


def _stage_batches(monkeypatch, tmp_path, recipe, processes: int) -> dict[str, int]:
    """The batch_size each stage of ``recipe.train`` gets under ``processes`` processes (training stops
    before the loop: only the stages' settings are looked at)."""
    import medadapt.hyrec.train as ht
    from medadapt.recipes.run import RunContext, RunResult

    seen: dict[str, int] = {}
    real_pre = ht.pretrain_stage

    def pretrain_stage(model, texts, section, training=None, *, name="pretrain"):
        seen[name] = section.batch_size
        return real_pre(model, texts, section, training, name=name)

    def hyrec_stage(model, examples, training=None, loss=None, *, name="hyrec", **kw):
        seen[name] = training.batch_size
        return ht.Stage(name, len(examples), None, [], training)

    def stop(model, stages, *a, **k):
        raise Stop

    monkeypatch.setattr(ht, "pretrain_stage", pretrain_stage)
    monkeypatch.setattr(ht, "hyrec_stage", hyrec_stage)
    accelerator = SimpleNamespace(num_processes=processes, device=torch.device("cpu"), is_main_process=True,
                                  process_index=0, main_process_first=contextlib.nullcontext)
    ctx = RunContext(recipe, tmp_path / "out", tmp_path / "ck", accelerator, None, RunResult(tmp_path / "out"),
                     "fp", show_progress=False, log=lambda m: None)
    monkeypatch.setattr(ctx, "train", stop)
    with pytest.raises(Stop):
        ht.train(recipe, ctx)
    return seen


def _recipe(bert, beir, *extra) -> HyReCRecipe:
    return load_recipe(TINY, [f"model.backbone={bert}", f"data.path={beir}", "training.batch_size=4",
                              "pretrain.batch_size=8", *extra], expect=HyReCRecipe)


def test_global_is_the_default_and_per_device_multiplies_by_processes(tiny_bert_dir, tiny_beir_dir, tmp_path,
                                                                       monkeypatch):
    recipe = _recipe(tiny_bert_dir, tiny_beir_dir)
    assert recipe.training.batch_size_scope == recipe.pretrain.batch_size_scope == "global"
    assert _stage_batches(monkeypatch, tmp_path, recipe, 3) == {"pretrain": 8, "hyrec": 4}
    per_device = _recipe(tiny_bert_dir, tiny_beir_dir, "training.batch_size_scope=per_device")
    assert _stage_batches(monkeypatch, tmp_path, per_device, 3) == {"pretrain": 8, "hyrec": 12}
    both = _recipe(tiny_bert_dir, tiny_beir_dir, "training.batch_size_scope=per_device",
                   "pretrain.batch_size_scope=per_device")
    assert _stage_batches(monkeypatch, tmp_path, both, 2) == {"pretrain": 16, "hyrec": 8}
    assert _stage_batches(monkeypatch, tmp_path, both, 1) == {"pretrain": 8, "hyrec": 4}


def test_the_paper_recipe_states_its_batch_semantics():
    from medadapt.plan import plan_recipe
    from medadapt.systems import find

    r = load_recipe(ROOT / "recipes" / "hyrec.yaml", expect=HyReCRecipe)
    assert r.training.batch_size_scope == "per_device" and r.pretrain.batch_size_scope == "global"
    paper = find("hyrec").paper
    assert paper["training.batch_size_scope"][0] == "per_device" and "per GPU" in paper["training.batch_size_scope"][1]
    notes = plan_recipe(r).notes
    assert any("batch_size_scope: per_device (training)" in n for n in notes), notes
    with pytest.raises(Exception, match="batch_size_scope"):
        load_recipe(TINY, ["training.batch_size_scope=per_gpu"], expect=HyReCRecipe)
