"""Recipe errors a user can act on (medadapt.recipes.loader): unknown keys get a did-you-mean from the schema at
their exact path (the path the user wrote, never pydantic's union tag), file errors carry the line, ``--set``
errors name the flag and not the recipe file, and a recipe that would train nothing (0 epochs) is refused."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from pydantic import ValidationError
from typer.testing import CliRunner

from medadapt.cli import app
from medadapt.errors import ConfigError
from medadapt.recipes import load_recipe
from medadapt.recipes.registry import kinds

RECIPES = Path(__file__).resolve().parents[1] / "recipes"
TINY = RECIPES / "med-moe-embed-tiny.yaml"


def _edited(tmp_path: Path, shipped: str, old: str, new: str) -> Path:
    """A copy of a shipped recipe with ``old`` (found once) replaced by ``new``."""
    text = (RECIPES / shipped).read_text()
    assert text.count(old) == 1, old
    path = tmp_path / shipped
    path.write_text(text.replace(old, new))
    return path


def _line_of_key(path: Path, key: str) -> int:
    """The line where ``key:`` is written (block or flow style)."""
    return next(n for n, line in enumerate(path.read_text().splitlines(), 1)
                if re.search(rf"(^|[\s{{,]){re.escape(key)}:", line))


# (case, shipped recipe, text replaced, replacement, the error after "<file>:<line>: invalid recipe: ")
TYPOS = [
    ("top level", "med-moe-embed-tiny.yaml", "training:\n", "trainig:\n",
     "unknown key trainig (did you mean training?)"),
    ("head, a tagged union: no .moe. in the path", "med-moe-embed-tiny.yaml", "  residual_scale: 0.5",
     "  residual_scal: 0.5", "unknown key head.residual_scal (did you mean head.residual_scale?)"),
    ("data.hard_negatives", "med-moe-embed-tiny.yaml", "hard_negatives: {window:", "hard_negatives: {windw:",
     "unknown key data.hard_negatives.windw (did you mean data.hard_negatives.window?)"),
    ("loss, a tagged union", "med-moe-embed-tiny.yaml", "temperature: 0.05,", "temprature: 0.05,",
     "unknown key loss.temprature (did you mean loss.temperature?)"),
    ("eval.also list item", "med-moe-embed-tiny.yaml", "  split: dev\n",
     "  split: dev\n  also:\n    - {data: medmini, splt: test}\n",
     "unknown key eval.also.0.splt (did you mean eval.also.0.split?)"),
    ("branches item", "med-moe-embed-tiny.yaml", "eval:\n", "branches:\n  - kind: hyrec_lexical\n    trainig: {}\neval:\n",
     "unknown key branches.0.trainig (did you mean branches.0.training?)"),
    ("inside a branch's section", "med-moe-embed-tiny.yaml", "eval:\n",
     "branches:\n  - kind: hyrec_lexical\n    training: {epoch: 1}\neval:\n",
     "unknown key branches.0.training.epoch (did you mean branches.0.training.epochs?)"),
    ("a key of another section", "med-moe-embed-tiny.yaml", "  freeze_backbone: true", "  device: cpu",
     "unknown key model.device (did you mean training.device?)"),
    ("no close match: the valid keys", "med-moe-embed-tiny.yaml", "  freeze_backbone: true", "  colour: red",
     "unknown key model.colour (valid keys of model: backbone, max_seq_length, freeze_backbone, peft)"),
    ("CARE stage", "care-tiny.yaml", "  mse_weight: 1.0", "  mse_weigth: 1.0",
     "unknown key stage1.mse_weigth (did you mean stage1.mse_weight?)"),
    ("CARE query tower, a tagged union", "care-tiny.yaml", "  max_seq_length: 32", "  max_seq_lenght: 32",
     "unknown key query.max_seq_lenght (did you mean query.max_seq_length?)"),
    ("HyReC model", "hyrec-tiny.yaml", "  branch_layers: 1", "  branch_layer: 1",
     "unknown key model.branch_layer (did you mean model.branch_layers?)"),
    ("BMRetriever mining (a MiningConfig)", "bmretriever-tiny.yaml", "num_negatives: 1, text_dup",
     "num_negative: 1, text_dup",
     "unknown key stage2.mining.num_negative (did you mean stage2.mining.num_negatives?)"),
]


@pytest.mark.parametrize("shipped, old, new, message", [t[1:] for t in TYPOS], ids=[t[0] for t in TYPOS])
def test_a_typo_gets_a_did_you_mean_at_its_exact_path_and_line(tmp_path, shipped, old, new, message):
    path = _edited(tmp_path, shipped, old, new)
    line = _line_of_key(path, message.split(" ")[2].split(".")[-1])
    with pytest.raises(ConfigError) as info:
        load_recipe(path)
    assert str(info.value) == f"{path}:{line}: invalid recipe: {message}"


def test_several_errors_keep_one_line_each_with_its_own_line_number(tmp_path):
    path = _edited(tmp_path, "med-moe-embed-tiny.yaml", "  residual_scale: 0.5", "  residual_scal: 0.5")
    line = _line_of_key(path, "residual_scal")
    text = path.read_text().replace("  lr: 1.0e-3", "  lr: fast")
    path.write_text(text)
    lr_line = text.splitlines().index("  lr: fast") + 1
    with pytest.raises(ConfigError) as info:
        load_recipe(path)
    assert str(info.value) == (f"{path}:{line}: invalid recipe: unknown key head.residual_scal (did you mean "
                               f"head.residual_scale?); training.lr: Input should be a valid number, unable to "
                               f"parse string as a number (line {lr_line})")


def test_the_python_api_gets_the_same_did_you_mean():
    from medadapt.moe.sections import MoEHeadSection

    with pytest.raises(ValidationError, match=r"residual_scal\n  unknown key \(did you mean residual_scale\?\)"):
        MoEHeadSection(residual_scal=0.3)
    recipe = {"kind": "moe", "name": "t", "model": {"backbone": "minilm"}, "data": {"path": "medmini"},
              "head": {"kind": "linear", "top_k": 2}}
    with pytest.raises(ConfigError) as info:
        load_recipe(recipe)
    assert str(info.value) == ("<dict>: invalid recipe: unknown key head.top_k (valid keys of head (kind linear): "
                               "kind, route, bias)")


# ---------------------------------------------------------------------------------------------- --set
SET_ERRORS = [
    (["head.residual_scal=0.3"], "unknown key head.residual_scal (did you mean head.residual_scale?)"),
    (["trainin.lr=1"], "unknown key trainin (did you mean training?)"),
    (["foo"], "must look like section.field=value"),
    ([".lr=1"], "the key '.lr' has an empty part"),
    (["training.lr=fast"], "training.lr: Input should be a valid number, unable to parse string as a number"),
    (["training.batch_size=true"], "training: batch_size must be a number, not true"),
    (["training.lr.x=1"], "training.lr is a value (0.001), not a section"),
    (["training.epochs=" + "1" * 30], "training: epochs is out of range (30 digits)"),
    (["head.top_k=9"], "head: top_k must be in [1, 4] (routed experts), got 9"),
    (["kind=nope"], f"unknown recipe kind 'nope' (valid: {', '.join(kinds())})"),
    (["name={a: 1, a: 2}"], "duplicate key 'a' (also on line 1); YAML would keep only the last one"),
    (["eval.metrics=&a [*a]"], "alias *a inside its own anchor (a cyclic document)"),
    (["branches=[[1]]"], "branches.0: a branch is a mapping with a kind: key, not list"),
    (["branches=5"], "branches: Input should be a valid list"),
    (["branches=[{kind: hyrec_lexical, trainig: {}}]"],
     "unknown key branches.0.trainig (did you mean branches.0.training?)"),
    (["training.lr=1e-3", "training.lrr=1"], "unknown key training.lrr (did you mean training.lr?)"),
]


@pytest.mark.parametrize("sets, message", SET_ERRORS, ids=[s[0][-1] for s in SET_ERRORS])
def test_set_errors_name_the_flag_not_the_recipe(tmp_path, sets, message):
    args = ["train", str(TINY), "--output", str(tmp_path / "run")]
    for item in sets:
        args += ["--set", item]
    result = CliRunner().invoke(app, args)
    lines = [ln for ln in result.stderr.splitlines() if ln.strip()]
    assert result.exit_code == 1 and "Traceback" not in result.output, result.output
    assert lines == [f"error: --set {sets[-1]}: {message}"]
    assert not (tmp_path / "run").exists()


def test_plan_set_errors_name_the_flag_too():
    result = CliRunner().invoke(app, ["plan", str(TINY), "--set", "training.lrr=1"])
    assert result.exit_code == 1
    assert [ln for ln in result.stderr.splitlines() if ln.strip()] == [
        "error: --set training.lrr=1: unknown key training.lrr (did you mean training.lr?)"]


def test_set_and_file_errors_together(tmp_path):
    path = _edited(tmp_path, "med-moe-embed-tiny.yaml", "  residual_scale: 0.5", "  residual_scal: 0.5")
    line = _line_of_key(path, "residual_scal")
    with pytest.raises(ConfigError) as info:
        load_recipe(path, ["training.lrr=1"])
    assert str(info.value) == ("--set training.lrr=1: unknown key training.lrr (did you mean training.lr?); "
                               f"{path}:{line}: invalid recipe: unknown key head.residual_scal (did you mean "
                               "head.residual_scale?)")


def test_undecodable_bytes_on_the_command_line_are_refused():
    with pytest.raises(ConfigError, match=r"^'--set data.path=\\udcff': not valid UTF-8 text$"):
        load_recipe(TINY, ["data.path=\udcff"])


# ---------------------------------------------------------------------------------------------- no-op runs
MOE_ZERO = ["training.epochs=0", "training.shared_epochs=0", "training.random_routing_epochs=0"]
NOTHING = "nothing would train and the untrained {} would be saved; train at least 1 epoch (to score a model " \
          "without training, use medadapt eval)"
NO_OP = [
    ("moe head, every stage 0", "med-moe-embed-tiny.yaml", MOE_ZERO,
     "invalid recipe: training.epochs, training.shared_epochs and training.random_routing_epochs are 0: "
     + NOTHING.format("head") + " (with --set training.epochs=0, --set training.shared_epochs=0, "
     "--set training.random_routing_epochs=0)"),
    ("linear head", "med-moe-embed-tiny.yaml", ["head={kind: linear}", *MOE_ZERO, "loss.load_balance_weight=0"],
     "invalid recipe: training.epochs is 0: " + NOTHING.format("head") + " (with --set training.epochs=0)"),
    ("backbone fine-tuning", "med-moe-embed-tiny.yaml",
     ["model.freeze_backbone=false", *MOE_ZERO, "loss.load_balance_weight=0"],
     "invalid recipe: training.epochs is 0: " + NOTHING.format("model") + " (with --set training.epochs=0)"),
    ("negative epochs", "med-moe-embed-tiny.yaml", ["training.epochs=-1"],
     "--set training.epochs=-1: training.epochs: Input should be greater than or equal to 0"),
    ("CARE stage", "care-tiny.yaml", ["stage1.epochs=0"],
     "--set stage1.epochs=0: stage1.epochs: Input should be greater than or equal to 1"),
    ("HyReC", "hyrec-tiny.yaml", ["training.epochs=0"],
     "--set training.epochs=0: training.epochs: Input should be greater than or equal to 1"),
    ("BMRetriever stage", "bmretriever-tiny.yaml", ["stage1.epochs=0"],
     "--set stage1.epochs=0: stage1.epochs: Input should be greater than 0"),
    ("batch size 0", "med-moe-embed-tiny.yaml", ["training.batch_size=0"],
     "--set training.batch_size=0: training.batch_size: Input should be greater than or equal to 1"),
    ("max_steps 0", "med-moe-embed-tiny.yaml", ["training.max_steps=0"],
     "--set training.max_steps=0: training.max_steps: Input should be greater than or equal to 1"),
]


@pytest.mark.parametrize("shipped, sets, message", [c[1:] for c in NO_OP], ids=[c[0] for c in NO_OP])
def test_a_recipe_that_would_train_nothing_is_refused(shipped, sets, message):
    with pytest.raises(ConfigError) as info:
        load_recipe(RECIPES / shipped, sets)
    expected = message if message.startswith("--set") else f"{RECIPES / shipped}: {message}"
    assert str(info.value) == expected


def test_zero_learned_epochs_are_fine_while_another_stage_trains():
    from medadapt.moe.sections import MoETrainingSection
    from medadapt.training.config import OptimSection

    recipe = load_recipe(TINY, ["training.epochs=0"])  # the shared and random-routing stages still train
    assert (recipe.training.epochs, recipe.training.shared_epochs) == (0, 2)
    assert MoETrainingSection(epochs=0, shared_epochs=1).epochs == 0  # the Python API's stage schedule
    with pytest.raises(ValidationError, match="greater than or equal to 1"):
        OptimSection(epochs=0)


def test_the_cli_refuses_a_no_op_run_before_writing_anything(tmp_path):
    args = ["train", str(TINY), "--output", str(tmp_path / "run")]
    for item in MOE_ZERO:
        args += ["--set", item]
    result = CliRunner().invoke(app, args)
    lines = [ln for ln in result.stderr.splitlines() if ln.strip()]
    assert result.exit_code == 1 and len(lines) == 1 and "nothing would train" in lines[0], result.output
    assert not (tmp_path / "run").exists() and not (tmp_path / "run.checkpoints").exists()
