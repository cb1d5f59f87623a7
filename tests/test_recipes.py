"""Recipe loading through the kind registry: defaults, overrides, errors that name the field, the Python API
building the same configuration as YAML, and every shipped recipe validating against its kind's schema."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from medadapt.errors import ConfigError
from medadapt.recipes import load_recipe, resolve_path

MINIMAL = {"kind": "moe", "name": "t", "model": {"backbone": "minilm"}, "data": {"path": "medmini"},
           "head": {"kind": "moe"}}


def test_defaults_and_overrides():
    from medadapt.moe import MoERecipe

    r = load_recipe(MINIMAL, overrides=["training.lr=1e-4", "training.epochs=3", "eval.metrics=[ndcg@5]"])
    assert isinstance(r, MoERecipe)
    assert r.training.lr == pytest.approx(1e-4) and r.training.epochs == 3
    assert r.eval.metrics == ["ndcg@5"]
    assert r.head.kind == "moe" and r.loss.kind == "infonce"
    # the one set of defaults the shipped MoE recipes rely on
    t = r.training
    assert (t.batch_size, t.warmup_ratio, t.weight_decay, t.scheduler, t.seed, t.shared_epochs,
            t.random_routing_epochs) == (64, 0.0, 0.0, "cosine", 42, 0, 0)
    assert load_recipe(MINIMAL).training.lr == 2e-5


def test_python_api_and_yaml_give_the_same_recipe(tmp_path):
    """A recipe built in Python with the minimal fields equals the minimal YAML file, defaults included
    (one class, one set of defaults)."""
    from medadapt.moe.sections import MoEDataSection, MoEHeadSection, MoEModelSection, MoERecipe

    api = MoERecipe(name="t", model=MoEModelSection(backbone="minilm"), data=MoEDataSection(path="medmini"),
                    head=MoEHeadSection())
    path = tmp_path / "t.yaml"
    path.write_text("kind: moe\nname: t\nmodel: {backbone: minilm}\ndata: {path: medmini}\n"
                    "head: {kind: moe}\n")
    loaded = load_recipe(path)
    assert type(loaded) is MoERecipe
    assert loaded.model_dump() == api.model_dump()
    assert (loaded.model, loaded.data, loaded.head, loaded.loss, loaded.training, loaded.eval) == (
        api.model, api.data, api.head, api.loss, api.training, api.eval)
    assert loaded.head.to_config(384) == api.head.to_config(384)


@pytest.mark.parametrize(
    "overrides, message",
    [
        (["model.colour=red"], "--set model.colour=red: unknown key model.colour (valid keys of model: backbone, "),
        (["training.lr=fast"], "--set training.lr=fast: training.lr: Input should be a valid number"),
        (["training.lr=.inf"], "--set training.lr=.inf: training: lr must be a finite number"),
        (["training.batch_size=true"], "--set training.batch_size=true: training: batch_size must be a number, not true"),
        (["training.lr=1e300"], "--set training.lr=1e300: training.lr: Input should be less than or equal to 10"),
        (["head.alpha_init=.nan"], "--set head.alpha_init=.nan: head: alpha_init must be a finite number"),
        (["head.kind=banana"], "--set head.kind=banana: head: Input tag 'banana' .*does not match any of the expected tags"),
        (["eval.metrics=[ndcg]"], "--set eval.metrics=[ndcg]: eval.metrics: .*not of the form NAME@K"),
        (["training.mixed_precision=fp8"], "--set training.mixed_precision=fp8: training.mixed_precision"),
        (["model.device=cpu"], "--set model.device=cpu: unknown key model.device (did you mean training.device?)"),
        (["nonsense"], "--set nonsense: must look like section.field=value"),
    ],
)
def test_errors_name_the_field(overrides, message):
    with pytest.raises(ConfigError, match=re.escape(message).replace(r"\.\*", ".*")):  # .* is a wildcard
        load_recipe(MINIMAL, overrides)
    assert "colour" not in MINIMAL["model"]  # overrides never change the caller's dict


def test_load_recipe_file_errors(tmp_path):
    with pytest.raises(ConfigError, match="recipe not found"):
        load_recipe(tmp_path / "nope.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("kind: moe\nname: x\nmodel: [unclosed\n")
    with pytest.raises(ConfigError, match=r"bad.yaml:\d+: invalid YAML"):
        load_recipe(bad)
    missing = tmp_path / "m.yaml"
    missing.write_text("kind: moe\nname: x\nmodel: {backbone: minilm}\n")
    with pytest.raises(ConfigError, match=r"m.yaml: invalid recipe: data: Field required"):
        load_recipe(missing)


def test_resolve_path_relative_to_recipe(tmp_path):
    (tmp_path / "data").mkdir()
    (tmp_path / "recipes").mkdir()
    recipe = tmp_path / "recipes" / "r.yaml"
    assert resolve_path("../data", recipe) == tmp_path / "recipes" / ".." / "data"
    assert resolve_path("/abs", recipe) == Path("/abs")


@pytest.mark.parametrize("path", sorted(Path(__file__).resolve().parents[1].glob("recipes/*.yaml")),
                         ids=lambda p: p.name)
def test_shipped_recipes_validate(path):
    """What `medadapt train` does first: the recipe's `kind:` picks the schema from the registry."""
    from medadapt.recipes import get_kind

    recipe = load_recipe(path)
    assert recipe.name and isinstance(recipe, get_kind(recipe.kind).schema)


def test_recipes_without_kind_or_with_an_unknown_kind_list_the_valid_kinds(tmp_path):
    path = tmp_path / "r.yaml"
    path.write_text("name: x\nmodel: {backbone: minilm}\ndata: {path: medmini}\n")
    with pytest.raises(ConfigError, match="no 'kind:' .*moe"):
        load_recipe(path)
    path.write_text("kind: nonsense\nname: x\n")
    with pytest.raises(ConfigError, match="unknown recipe kind 'nonsense'.*moe"):
        load_recipe(path)
