"""One registration per system (:mod:`medadapt.systems`): a fifth system written outside the package and
found through one entry point trains, saves, evaluates and plans through the real CLI, and contributes its
mining preset and its branch's compositions; the core names no system in code."""

from __future__ import annotations

import ast
import importlib
import importlib.metadata
import json
import sys
import textwrap
import tomllib
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

import medadapt
from medadapt import systems
from medadapt.adapters.compose import allowed, branch_kind, check_composition
from medadapt.cli import app
from medadapt.curation import MiningConfig, presets
from medadapt.errors import ConfigError
from medadapt.recipes import kinds

pytestmark = pytest.mark.usefixtures("_isolated_cache", "_single_thread")

ROOT = Path(__file__).resolve().parents[1] / "medadapt"
SYSTEM_PACKAGES = ("moe", "care", "hyrec", "bmretriever", "asym")  # asym: CARE's old module paths

TOY = textwrap.dedent('''
    """A fifth system, outside medadapt: a backbone trained to pull a query towards its document."""
    from typing import Literal

    import torch
    from sentence_transformers import SentenceTransformer

    from medadapt.adapters.compose import BranchKind
    from medadapt.config import Section
    from medadapt.data import load_beir
    from medadapt.plan import ModelSpec, PhaseSpec, PlanSpec, Usage
    from medadapt.recipes.base import RecipeBase
    from medadapt.recipes.run import evaluate_dense
    from medadapt.systems import System, register_system
    from medadapt.training.config import OptimSection
    from medadapt.training.loop import Stage


    class ToyModel(Section):
        backbone: str


    class ToyRecipe(RecipeBase):
        kind: Literal["toy"] = "toy"
        model: ToyModel
        optim: OptimSection = OptimSection(batch_size=4, lr=1e-3, epochs=2)


    class PairStep:
        def __init__(self, pairs):
            self.pairs = pairs

        def forward(self, model, batch):
            return {f"e{side}": model(model.tokenize([self.pairs[i][side] for i in batch.indices]))
                    ["sentence_embedding"] for side in (0, 1)}

        def loss(self, outputs, batch):
            return {"cos": 1 - torch.nn.functional.cosine_similarity(outputs["e0"], outputs["e1"]).mean()}


    def train(recipe, ctx):
        model = SentenceTransformer(str(recipe.resolve(recipe.model.backbone)), device=ctx.device)
        data = load_beir(recipe.resolve(recipe.data.path), [recipe.data.train_split])
        docs = dict(zip(data.doc_ids, data.doc_texts()))
        queries = data.split_queries(recipe.data.train_split)
        pairs = [(text, docs[next(iter(data.qrels[recipe.data.train_split][qid]))])
                 for qid, text in queries.items()]
        ctx.train(model, [Stage("toy", len(pairs), PairStep(pairs), list(model.parameters()), recipe.optim)])
        return model


    def plan(recipe):
        phase = PhaseSpec("toy phase", recipe.optim.batch_size, 1, (Usage("toy-backbone", 2, 32),))
        return PlanSpec(recipe.name, (ModelSpec("toy-backbone", recipe.model.backbone),), (phase,))


    class ToyBranch(Section):
        kind: Literal["toy_branch"] = "toy_branch"


    register_system(System(
        "toy", ToyRecipe, train, evaluate_dense, summary="a toy system", plan=plan,
        mining_presets={"toy-paper": {"window": (2, 7), "num_negatives": 2}},
        branches=(BranchKind("toy_branch", ToyBranch, None, None,
                             composes_on={"dense": "toy branch beside the dense embedding"}),)))
''')


@pytest.fixture
def toy_entry_point(tmp_path, monkeypatch):
    """The toy module on ``sys.path`` and one ``medadapt.systems`` entry point naming it (beside the real
    ones), with the registry's entry points not yet loaded; the toy is unregistered afterwards."""
    (tmp_path / "medadapt_toy_system.py").write_text(TOY)
    monkeypatch.syspath_prepend(str(tmp_path))
    real = importlib.metadata.entry_points
    toy = importlib.metadata.EntryPoint("toy", "medadapt_toy_system", systems.ENTRY_POINT_GROUP)

    def entry_points(**selection):
        found = real(**selection)
        return [*found, toy] if selection.get("group") == systems.ENTRY_POINT_GROUP else found

    monkeypatch.setattr(importlib.metadata, "entry_points", entry_points)
    monkeypatch.setattr(systems, "_loaded", False)
    yield
    systems._SYSTEMS.pop("toy", None)
    sys.modules.pop("medadapt_toy_system", None)


def test_a_fifth_system_from_outside_trains_saves_and_plans(toy_entry_point, tiny_bert_dir, tiny_beir_dir,
                                                               tmp_path):
    assert "medadapt_toy_system" not in sys.modules  # found through the entry point alone
    recipe = tmp_path / "toy.yaml"
    recipe.write_text(yaml.safe_dump({"kind": "toy", "name": "toy-run", "data": {"path": str(tiny_beir_dir)},
                                      "model": {"backbone": str(tiny_bert_dir)},
                                      "eval": {"baseline": False, "metrics": ["ndcg@10"]}}))
    out = tmp_path / "run"
    res = CliRunner().invoke(app, ["train", str(recipe), "--output", str(out), "--quiet"])
    assert res.exit_code == 0, res.output
    assert "medadapt_toy_system" in sys.modules and "toy" in kinds()
    assert (out / "modules.json").is_file() and (out / "recipe.yaml").is_file()
    log = json.loads((out / "train_log.json").read_text())
    assert [row["stage"] for row in log["loss_history"]] == ["toy"] * len(log["loss_history"]) != []
    assert "ndcg@10" in json.loads((out / "metrics.json").read_text())

    res = CliRunner().invoke(app, ["plan", str(recipe), "--markdown"])
    assert res.exit_code == 0, res.output
    assert "toy-backbone" in res.output and "toy phase" in res.output

    bad = tmp_path / "bad.yaml"
    bad.write_text("kind: nope\nname: x\ndata: {path: medmini}\n")
    res = CliRunner().invoke(app, ["train", str(bad), "--output", str(tmp_path / "bad")])
    assert res.exit_code == 1 and "Traceback" not in res.output
    assert "unknown recipe kind 'nope'" in res.output and "toy" in res.output.split("valid:")[1]
    assert not (tmp_path / "bad").exists()


def test_a_system_contributes_its_preset_and_its_branch_compositions(toy_entry_point, tmp_path):
    assert presets()["toy-paper"] == {"window": (2, 7), "num_negatives": 2}
    assert MiningConfig.preset("toy-paper", seed=1).window == (2, 7)
    assert MiningConfig.preset("hyrec").window == (20, 100)  # the shipped systems' presets stay
    res = CliRunner().invoke(app, ["data", "mine", "--preset", "nope", "--output", str(tmp_path / "n.jsonl")])
    assert res.exit_code == 1 and "Traceback" not in res.output and not (tmp_path / "n.jsonl").exists()
    assert "valid presets: bmretriever, hyrec, med-moe, toy-paper" in res.output
    assert branch_kind("toy_branch").section.__name__ == "ToyBranch"
    assert allowed()[("dense", "toy_branch", "branch")] == "toy branch beside the dense embedding"
    check_composition("dense", [("linear", "all"), ("toy_branch", "branch")])
    with pytest.raises(ConfigError, match="cannot compose toy_branch"):  # it declared no asymmetric base
        check_composition("asymmetric", [("toy_branch", "branch")])


def test_each_entry_point_module_registers_its_system_and_the_old_groups_are_gone():
    points = tomllib.loads((ROOT.parent / "pyproject.toml").read_text())["project"]["entry-points"]
    assert not {"medadapt.recipe_kinds", "medadapt.adapter_types", "medadapt.branches"} & set(points)
    shipped = points[systems.ENTRY_POINT_GROUP]
    assert set(shipped) == {"moe", "care", "hyrec", "bmretriever"}
    for name, module in shipped.items():
        assert module == f"medadapt.{name}.system"
        importlib.import_module(module)
        assert systems.find(name).kind == name and systems.find(name).plan is not None


def test_a_recipe_kind_needs_schema_and_train():
    with pytest.raises(ConfigError, match="needs both schema and train"):
        systems.register_system(systems.System("half", schema=dict))
    assert systems.find("half") is None


def _system_names() -> set[str]:
    """Every name the shipped systems register: kinds, head types, branches, mining presets."""
    found = set()
    for s in systems.registered():
        found |= {s.kind, *s.mining_presets}
        found |= {t.name for t in s.adapter_types} | {b.name for b in s.branches}
    return found


#: (file under medadapt/, name) -> why that core file still names a system; only ever shrinks.
STILL_NAMED = {
    ("models.py", "hyrec"): "HyReC folders saved before the branch was a module keep it in hyrec/ and load",
    ("eval/suites/__init__.py", "bmretriever"): "the suite of the BMRetriever paper's tables (any model)",
    ("eval/suites/bmretriever.py", "bmretriever"): "the suite of the BMRetriever paper's tables (any model)",
}


def _named_in_code(path: Path, names: set[str]) -> set[str]:
    """The ``names`` that occur as a whole string constant in ``path``'s code (docstrings excluded)."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    docstrings = {id(node.body[0].value) for node in ast.walk(tree)
                  if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))
                  and node.body and isinstance(node.body[0], ast.Expr)
                  and isinstance(node.body[0].value, ast.Constant)}
    return {node.value for node in ast.walk(tree) if isinstance(node, ast.Constant)
            and isinstance(node.value, str) and node.value in names and id(node) not in docstrings}


def test_the_core_names_no_system_in_code():
    names = _system_names()
    assert {"moe", "care", "hyrec", "bmretriever", "hyrec_lexical", "med-moe"} <= names
    found = {(str(p.relative_to(ROOT)), name) for p in sorted(ROOT.rglob("*.py"))
             if p.relative_to(ROOT).parts[0] not in SYSTEM_PACKAGES for name in _named_in_code(p, names)}
    assert not found - set(STILL_NAMED), (
        "core code names a system (a string constant): let the system contribute it through its "
        f"register_system call instead: {sorted(found - set(STILL_NAMED))}")
    stale = set(STILL_NAMED) - found
    assert not stale, f"no longer named there: remove {sorted(stale)} from STILL_NAMED"


def test_the_name_check_sees_comparisons_and_skips_docstrings(tmp_path):
    path = tmp_path / "m.py"
    path.write_text('"""The moe docs."""\ndef f(run, x):\n    """moe"""\n'
                    '    return run.kind == "moe" or x in ("care",)\n')
    assert _named_in_code(path, {"moe", "care", "hyrec"}) == {"moe", "care"}
    path.write_text('"""moe"""\nX = "a moe head"\n')
    assert _named_in_code(path, {"moe"}) == set()


def test_each_paper_overlay_is_the_yaml_beside_its_recipe_and_reaches_paper_settings():
    for kind, package in [("moe", "moe"), ("care", "care"), ("hyrec", "hyrec"), ("bmretriever", "bmretriever")]:
        path = Path(medadapt.__file__).parent / package / "paper.yaml"
        overlay = systems.load_paper(path)
        assert systems.find(kind).paper == overlay and len(overlay) >= 10
        assert systems.find(kind).paper_settings() == {k: v for k, (v, _) in overlay.items()}
    assert systems.find("moe").paper_settings()["loss.temperature"] == 1.0
    assert systems.find("hyrec").paper_settings()["negatives.window"] == [20, 100]


@pytest.mark.parametrize("text, says", [
    ("- a\n", "a paper overlay is a mapping"),
    ("loss.temperature: 1.0\n", "loss.temperature: an entry is"),
    ("loss.temperature: {value: 1.0}\n", "loss.temperature: an entry is"),
    ("temperature: {value: 1.0, why: eq. 3}\n", "temperature: an entry is"),
    ("loss.temperature: {value: 1.0, why: ' '}\n", "loss.temperature: an entry is"),
    ("a.b: {value: 1, why: x}\na.b: {value: 2, why: y}\n", "duplicate"),
])
def test_a_malformed_paper_overlay_is_one_error(tmp_path, text, says):
    path = tmp_path / "paper.yaml"
    path.write_text(text)
    with pytest.raises(ConfigError, match=says):
        systems.load_paper(path)
