"""``--paper`` (issue #16 item 3): each system's paper settings (its equations and hyperparameters) applied on
top of a recipe, ``--set`` still winning, a run that really uses them, one clear error for a kind without a
paper mode, and docs/recipes.md listing every setting. CARE: every shipped recipe of kind ``care`` either takes the paper
settings or is refused with one error naming why (a pruned / static query tower cannot take the paper's
RetroMAE query init), and the tiny twin runs every paper phase."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
import yaml
from typer.testing import CliRunner

from medadapt.cli import app
from medadapt.errors import ConfigError
from medadapt.recipes import load_recipe
from medadapt.recipes.registry import get_kind, kinds

ROOT = Path(__file__).resolve().parents[1]
RECIPES = {"moe": "med-moe-embed.yaml", "bmretriever": "bmretriever-minilm.yaml",
           "hyrec": "hyrec-minilm-medquad.yaml", "care": "care-minilm-query-ft.yaml"}
# every shipped recipe of kind care (care-query-ft-moe-hybrid.yaml is a moe recipe on a CARE run: not one)
CARE_RECIPES = sorted(p.name for p in (ROOT / "recipes").glob("*.yaml")
                      if yaml.safe_load(p.read_text(encoding="utf-8")).get("kind") == "care")


def _get(dump: dict, path: str):
    node = dump
    for part in path.split("."):
        if node is None:  # a section the recipe leaves out (e.g. no document LoRA)
            return None
        node = node[part]
    return node


@pytest.mark.parametrize("kind", sorted(RECIPES))
def test_paper_settings_are_applied_and_set_still_wins(kind):
    paper = get_kind(kind).paper
    assert paper and all(isinstance(why, str) and why for _, why in paper.values())
    plain = load_recipe(ROOT / "recipes" / RECIPES[kind]).model_dump(mode="json")
    dump = load_recipe(ROOT / "recipes" / RECIPES[kind], paper=True).model_dump(mode="json")
    changed = 0
    for path, (value, _) in paper.items():
        got = _get(dump, path)
        if isinstance(value, dict):  # a section: the given fields, the rest at their defaults
            assert {k: got[k] for k in value} == value or all(
                {f: got[k][f] for f in v} == v for k, v in value.items()), path
        else:
            assert got == (list(value) if isinstance(value, tuple) else value), path
        changed += _get(plain, path) != got
    assert changed >= 3, "the shipped CPU recipe should deviate from the paper somewhere"
    first, value = next((p, v) for p, (v, _) in paper.items()
                        if isinstance(v, (int, float)) and not isinstance(v, bool))
    over = load_recipe(ROOT / "recipes" / RECIPES[kind], [f"{first}={value * 2}"], paper=True)
    assert _get(over.model_dump(mode="json"), first) == value * 2


def test_the_moe_paper_head_is_equation_1(tiny_bert_dir, tiny_beir_dir, tmp_path, monkeypatch):
    """A run with --paper trains the paper's head: h replaces v (no residual), experts h -> 4h -> h, a full
    (not block-diagonal) MLP-KAN, InfoNCE without temperature; its loss goes down."""
    monkeypatch.setenv("MEDADAPT_CACHE", str(tmp_path / "cache"))
    out = tmp_path / "run"
    args = ["train", str(ROOT / "recipes" / "med-moe-embed-tiny.yaml"), "--paper", "--output", str(out), "-q",
            "--no-eval"]
    for o in [f"model.backbone={tiny_bert_dir}", f"data.path={tiny_beir_dir}", "data.hard_negatives.window=[2, 6]",
              "training.batch_size=4", "training.lr=1e-2", "training.shared_epochs=2",
              "training.random_routing_epochs=1", "training.epochs=4"]:
        args += ["--set", o]
    res = CliRunner().invoke(app, args)
    assert res.exit_code == 0, res.output
    saved = load_recipe(out / "recipe.yaml")
    assert (saved.head.expansion, saved.head.residual, saved.loss.temperature) == (4, False, 1.0)
    assert saved.head.expert_options["mlp_kan"]["groups"] == 1
    assert saved.head.renormalize_top_k is False
    losses = [r["loss"] for r in json.loads((out / "train_log.json").read_text())["loss_history"]]
    assert losses[-1] < losses[0]

    import medadapt
    from medadapt.moe.head import MoEHead

    model = medadapt.load(str(out), device="cpu")
    head = next(m for m in model.modules() if isinstance(m, MoEHead))
    dim = head.config.dim
    v = torch.randn(3, dim)
    with torch.no_grad():
        shared = sum(e(v) for e in head.shared_experts)
        out_h = head.transform(v)  # learned routing: h = shared + alpha * sum_topk g_i E_i(v), eq. (1)-(2)
        routed = head._routed(v)
        torch.testing.assert_close(out_h, shared + head.alpha * routed)  # h itself, not v + h
        head.alpha.fill_(0.5)  # a trained alpha may stay near its start: pin it so the check can fail
        torch.testing.assert_close(head.transform(v), shared + 0.5 * routed)
        decision = head.router(v, "learned")  # eq. (2): g_i = s_i for the kept experts, not renormalised
        torch.testing.assert_close(decision.weights[decision.selected], decision.probs[decision.selected])
        assert (decision.weights.sum(-1) < 1 - 1e-6).all()
        head.set_routing("off")
        torch.testing.assert_close(head.transform(v), shared)
    widths = {m.out_features for e in head.routed_experts for m in e.modules() if isinstance(m, torch.nn.Linear)}
    assert 4 * dim in widths and widths <= {dim, 4 * dim, 8 * dim}  # h -> 4h -> h (SwiGLU: gate + value, 2 x 4h)


def test_a_kind_without_a_paper_mode_is_one_clear_error(tmp_path, monkeypatch):
    from medadapt.recipes import registry

    care = get_kind("care")  # every shipped kind has a paper mode: a stand-in kind without one
    monkeypatch.setitem(registry.systems._SYSTEMS, "nopaper", registry.RecipeKind("nopaper", care.schema, care.train))
    recipe = tmp_path / "nopaper.yaml"
    recipe.write_text("kind: nopaper\nname: x\ndata: {path: medmini}\n")
    with pytest.raises(ConfigError, match="recipe kind 'nopaper' has no paper mode"):
        load_recipe(recipe, paper=True)
    res = CliRunner().invoke(app, ["plan", str(recipe), "--paper"])
    assert res.exit_code == 1 and "has no paper mode" in res.output and "Traceback" not in res.output


def test_docs_list_every_paper_setting():
    text = (ROOT / "docs" / "recipes.md").read_text()
    section = text[text.index("## Paper mode"):]
    for kind in kinds():
        for path in get_kind(kind).paper or {}:
            assert f"`{path}`" in section, (kind, path)


# ------------------------------------------------------------------------------------------------------ CARE
def test_care_paper_values_are_the_papers():
    """Each value checked by hand against CARE / CMedTEB Table 17 and Appendix C.3 (not read back from the
    dict); what the paper does not give stays the recipe's."""
    plain = load_recipe(ROOT / "recipes" / "care.yaml")
    r = load_recipe(ROOT / "recipes" / "care.yaml", paper=True)
    q, pre, un, doc = r.init.query, r.init.query.pretrain, r.init.query.unsupervised, r.init.document

    def optim(sec):
        return sec.lr, sec.warmup_ratio, sec.effective_batch_size, sec.epochs

    assert optim(pre) == (2e-4, 0.0, 384, 3)  # Table 17, RetroMAE
    assert optim(un) == (1e-4, 0.05, 19_200, 3) and un.learn_temperature and un.positives == "title_text"
    assert optim(q) == optim(doc) == (1e-4, 0.05, 640, 1) and q.supervised  # C.3: one epoch of fine-tuning
    assert optim(r.stage1) == (1e-4, 0.05, 2560, 1) and r.stage1.enabled and r.stage1.include_corpus
    assert r.stage1.max_texts is None and r.stage1.max_corpus_texts is None
    assert optim(r.stage2) == (1e-4, 0.05, 640, 1) and r.stage2.enabled and r.stage2.train_document
    assert r.document.lora.r == 32 and r.document.gradient_checkpointing
    assert (r.architecture.projection, r.architecture.truncate_to) == (False, "auto")
    assert {r.document.max_seq_length, r.query.max_seq_length, r.init.max_length, pre.max_length, un.max_length,
            r.stage1.max_length, r.stage2.query_max_length, r.stage2.document_max_length} == {512}
    # not given in the paper: the recipe's own
    assert (r.document.lora.alpha, r.document.lora.dropout, r.document.mrl_dims) == \
        (plain.document.lora.alpha, plain.document.lora.dropout, plain.document.mrl_dims)
    assert (r.stage1.temperature, r.stage1.mse_weight, r.stage1.contrastive_weight, r.stage2.temperature,
            r.stage2.negatives, r.init.negatives, r.init.temperature, un.temperature, pre.encoder_mask_ratio) == \
        (plain.stage1.temperature, plain.stage1.mse_weight, plain.stage1.contrastive_weight, plain.stage2.temperature,
         plain.stage2.negatives, plain.init.negatives, plain.init.temperature,
         plain.init.query.unsupervised.temperature, plain.init.query.pretrain.encoder_mask_ratio)
    # the paper's global batch through accumulation (memory), --set after --paper
    fit = load_recipe(ROOT / "recipes" / "care.yaml", ["init.query.pretrain.batch_size=192",
                                                       "init.query.pretrain.gradient_accumulation_steps=2"],
                      paper=True)
    assert (fit.init.query.pretrain.batch_size, fit.init.query.pretrain.effective_batch_size) == (192, 384)


@pytest.mark.parametrize("name", CARE_RECIPES)
def test_every_care_recipe_takes_the_paper_settings_or_is_refused_clearly(name):
    """A pruned or static query tower cannot take the paper's RetroMAE query init: refused with one error
    naming why; every other shipped CARE recipe validates with every paper value."""
    plain = load_recipe(ROOT / "recipes" / name)
    if plain.query.kind in ("pruned", "static"):
        with pytest.raises(ConfigError, match=rf"{name}: .*init\.query\.pretrain \(RetroMAE.*--paper.*needs a "
                                              rf"query tower of kind sentence_transformer.*not "
                                              rf"'{plain.query.kind}'") as err:
            load_recipe(ROOT / "recipes" / name, paper=True)
        assert str(err.value).count("init.query.pretrain") == 1  # one error, not a list of field errors
        res = CliRunner().invoke(app, ["plan", str(ROOT / "recipes" / name), "--paper"])
        assert res.exit_code == 1 and "query tower of kind sentence_transformer" in " ".join(res.output.split())
        assert "Traceback" not in res.output
        return
    dump = load_recipe(ROOT / "recipes" / name, paper=True).model_dump(mode="json")
    for path, (value, _) in get_kind("care").paper.items():
        assert _get(dump, path) == value, (name, path)


def test_care_plan_with_paper_prints_the_accumulation_for_table_17(capsys):
    res = CliRunner().invoke(app, ["plan", str(ROOT / "recipes" / "care.yaml"), "--paper", "--gpu-memory", "80"])
    assert res.exit_code == 0, res.output
    out = " ".join(res.output.split())
    assert "global batch 19200" in out and "global batch 2560" in out and "global batch 384" in out
    assert "the recipe declares 1: set batch_size=" in out  # Table 17's batches need accumulation on 80 GB


def test_the_care_tiny_twin_runs_every_paper_phase(tiny_bert_dir, tiny_qwen2_dir, tiny_beir_dir, tmp_path,
                                                    monkeypatch):
    """``medadapt train recipes/care-tiny.yaml --paper``: the paper's phases (document init, RetroMAE,
    unsupervised InfoNCE, supervised init, stage I, stage II with the document tower training) on the tiny
    towers, at Table 17's batches (larger than the tiny data set: one step per epoch)."""
    monkeypatch.setenv("MEDADAPT_CACHE", str(tmp_path / "cache"))
    qwen = tiny_qwen2_dir
    out = tmp_path / "run"
    args = ["train", str(ROOT / "recipes" / "care-tiny.yaml"), "--paper", "--output", str(out), "-q", "--no-eval"]
    for o in [f"document.model={qwen}", f"query.model={tiny_bert_dir}", f"data.path={tiny_beir_dir}"]:
        args += ["--set", o]
    res = CliRunner().invoke(app, args)
    assert res.exit_code == 0, res.output
    saved = load_recipe(out / "recipe.yaml")
    assert (saved.stage1.batch_size, saved.init.query.pretrain.lr, saved.document.lora.r) == (2560, 2e-4, 32)
    assert saved.stage2.train_document and saved.document.max_seq_length == 512
    stages = json.loads((out / "train_log.json").read_text())["stages"]
    # 12 train pairs, 24 texts (12 queries + 12 documents), every batch larger: one step per epoch; RetroMAE
    # and the unsupervised step 3 epochs, every other phase 1 (C.3)
    assert {k: v["steps"] for k, v in stages.items()} == {
        "init_document": 1, "init_query_pretrain": 3, "init_query_unsupervised": 3, "init_query": 1,
        "stage1": 1, "stage2": 1}
