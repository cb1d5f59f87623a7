"""``--paper`` (issue #16 item 3): each system's paper settings (its equations and hyperparameters) applied on
top of a recipe, ``--set`` still winning, a run that really uses them, one clear error for a kind without a
paper mode, and docs/recipes.md listing every setting."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

from medadapt.cli import app
from medadapt.errors import ConfigError
from medadapt.recipes import load_recipe
from medadapt.recipes.registry import get_kind, kinds

ROOT = Path(__file__).resolve().parents[1]
RECIPES = {"moe": "med-moe-embed.yaml", "bmretriever": "bmretriever-minilm.yaml",
           "hyrec": "hyrec-minilm-medquad.yaml"}


def _get(dump: dict, path: str):
    node = dump
    for part in path.split("."):
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
        head.set_routing("off")
        torch.testing.assert_close(head.transform(v), shared)
    widths = {m.out_features for e in head.routed_experts for m in e.modules() if isinstance(m, torch.nn.Linear)}
    assert 4 * dim in widths and widths <= {dim, 4 * dim, 8 * dim}  # h -> 4h -> h (SwiGLU: gate + value, 2 x 4h)


def test_a_kind_without_a_paper_mode_is_one_clear_error(tmp_path):
    without = [k for k in kinds() if not get_kind(k).paper]
    assert without, "every kind has a paper mode: move this test to another case"
    recipe = {"hyrec": "hyrec-tiny.yaml", "care": "care-tiny.yaml"}
    name = next(k for k in without if k in recipe)
    with pytest.raises(ConfigError, match=f"recipe kind '{name}' has no paper mode"):
        load_recipe(ROOT / "recipes" / recipe[name], paper=True)
    res = CliRunner().invoke(app, ["plan", str(ROOT / "recipes" / recipe[name]), "--paper"])
    assert res.exit_code == 1 and "has no paper mode" in res.output and "Traceback" not in res.output


def test_docs_list_every_paper_setting():
    text = (ROOT / "docs" / "recipes.md").read_text()
    section = text[text.index("## Paper mode"):]
    for kind in kinds():
        for path in get_kind(kind).paper or {}:
            assert f"`{path}`" in section, (kind, path)
