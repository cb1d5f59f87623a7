from __future__ import annotations

from pathlib import Path

import pytest

from medadapt.errors import ConfigError
from medadapt.recipes import load_recipe, recipe_from_dict, resolve_path

MINIMAL = {"name": "t", "model": {"backbone": "minilm"}, "data": {"path": "medmini"}}


def test_defaults_and_overrides():
    r = recipe_from_dict(MINIMAL, overrides=["training.lr=1e-4", "training.epochs=3", "eval.metrics=[ndcg@5]"])
    assert r.training.lr == pytest.approx(1e-4) and r.training.epochs == 3
    assert r.eval.metrics == ["ndcg@5"]
    assert r.head.kind == "none" and r.loss.kind == "infonce"


@pytest.mark.parametrize(
    "overrides, message",
    [
        (["model.colour=red"], "model.colour: Extra inputs are not permitted"),
        (["training.lr=fast"], "training.lr: Input should be a valid number"),
        (["head.kind=banana"], "does not match any of the expected tags"),
        (["eval.metrics=[ndcg]"], "not of the form NAME@K"),
        (["training.mixed_precision=fp8"], "training.mixed_precision"),
        (["nonsense"], "must look like section.field=value"),
    ],
)
def test_errors_name_the_field(overrides, message):
    with pytest.raises(ConfigError, match=message.replace("[", r"\[")):
        recipe_from_dict(MINIMAL, "my.yaml", overrides)


def test_load_recipe_file_errors(tmp_path):
    with pytest.raises(ConfigError, match="recipe not found"):
        load_recipe(tmp_path / "nope.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: x\nmodel: [unclosed\n")
    with pytest.raises(ConfigError, match=r"bad.yaml:\d+: invalid YAML"):
        load_recipe(bad)
    missing = tmp_path / "m.yaml"
    missing.write_text("name: x\nmodel: {backbone: minilm}\n")
    with pytest.raises(ConfigError, match=r"m.yaml: invalid recipe: data: Field required"):
        load_recipe(missing)


def test_resolve_path_relative_to_recipe(tmp_path):
    (tmp_path / "data").mkdir()
    (tmp_path / "recipes").mkdir()
    recipe = tmp_path / "recipes" / "r.yaml"
    assert resolve_path("../data", recipe) == tmp_path / "recipes" / ".." / "data"
    assert resolve_path("/abs", recipe) == Path("/abs")


@pytest.mark.parametrize("path", sorted(Path(__file__).resolve().parents[1].glob("recipes/*.yaml")))
def test_shipped_recipes_validate(path):
    from medadapt.recipes.kinds import resolve_kind

    load, _run = resolve_kind(path)  # the loader `medadapt train` would use for this recipe's `kind:`
    assert load(path, []).name


def test_unknown_recipe_kind_lists_valid_kinds(tmp_path):
    from medadapt.errors import ConfigError
    from medadapt.recipes.kinds import resolve_kind

    path = tmp_path / "r.yaml"
    path.write_text("kind: nonsense\nname: x\n")
    with pytest.raises(ConfigError, match="unknown recipe kind 'nonsense'.*care"):
        resolve_kind(path)
