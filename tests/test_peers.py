"""`eval.peers` (medadapt.moe.peers): peer baselines trained in the same `medadapt train` run.

Tiny `kind: moe` runs on the synonym set of test_train_recipe (the head learns lay word -> condition) with a
`lay` extra set (`eval.also`). A strong query-only linear peer (it learns the same association) and a weak
one (lr 1e-6, one epoch: the frozen model) train beside the head; metrics.json must hold the scores of the
same linear head trained directly (`train_head`) and scored with `evaluate_retrieval`; the table and the
card show them, the warning line appears exactly where a peer beats the head, and a run whose head hardly
trains (lr 1e-6) gets the warning. Peers on a non-moe kind or on the slow path are one error line.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

import medadapt
from medadapt.cli import app
from medadapt.errors import ConfigError
from medadapt.recipes.also import peer_warning

pytestmark = pytest.mark.usefixtures("_single_thread")

TINY = Path(__file__).resolve().parents[1] / "recipes" / "med-moe-embed-tiny.yaml"
METRICS = ["ndcg@10", "mrr@10"]
STRONG = {"label": "strong", "lr": 3e-2, "epochs": 30, "batch_size": 4, "temperature": 0.05}
PEERS = ("[{kind: linear_query, label: strong, lr: 3.0e-2, epochs: 30, batch_size: 4}, "
         "{kind: linear_query, label: weak, lr: 1.0e-6, epochs: 1, batch_size: 4}]")


def _sets(root: Path) -> dict[str, Path]:
    from conftest import TOPICS, build_synonym_beir, write_beir

    n = len(TOPICS)
    corpus = {f"d{i}": ("", f"{name} is a condition") for i, (name, _) in enumerate(TOPICS)}
    lay = [words.split()[2] for _, words in TOPICS]
    syn = build_synonym_beir(root / "syn")
    lay_only = write_beir(root / "lay", corpus, {f"q{i}": w for i, w in enumerate(lay)},
                          {"test": {f"q{i}": {f"d{i}": 1} for i in range(n)}})
    return {"syn": syn, "lay": lay_only}


def _args(model_dir, sets, peers: str, lr: str = "1e-2") -> list[str]:
    return [f"model.backbone={model_dir}", f"data.path={sets['syn']}", "data.hard_negatives.window=[2, 6]",
            "head.expansion=1", "head.residual_scale=1.0", "training.batch_size=4", f"training.lr={lr}",
            "training.shared_epochs=5", "training.random_routing_epochs=2", "training.epochs=30",
            "training.seed=7", "eval.split=test", f"eval.metrics=[{', '.join(METRICS)}]",
            f"eval.also=[{{data: {sets['lay']}}}]", f"eval.peers={peers}"]


def _invoke(options: list[str], settings: list[str]):
    sets = [x for s in settings for x in ("--set", s)]
    return CliRunner().invoke(app, ["train", str(TINY), *options, *sets])


@pytest.fixture(scope="module")
def peers_run(tiny_bert_dir, tmp_path_factory):
    """The run, once: its folder, the CLI output, the sets and the cache folder."""
    root = tmp_path_factory.mktemp("peers")
    sets = _sets(root)
    out = root / "run"
    result = _invoke(["--output", str(out), "--cache-dir", str(root / "cache"), "-q"],
                     _args(tiny_bert_dir, sets, PEERS))
    assert result.exit_code == 0, result.output
    return out, result.output, sets, root / "cache"


def _direct(model_dir, sets, cache_dir, settings: dict) -> dict[str, dict[str, float]]:
    """The peer by hand: a query-only LinearHead trained with train_head on the training pairs' frozen
    embeddings (in-batch negatives, the run's seed) and scored with evaluate_retrieval on each set."""
    from medadapt.cache import EmbeddingCache
    from medadapt.data import load_beir
    from medadapt.eval import evaluate_retrieval
    from medadapt.adapters.linear import LinearHeadConfig
    from medadapt.moe import train_head
    from medadapt.moe.sections import InfoNCESection, MoETrainingSection
    from medadapt.training.pairs import prepare_head_training

    cache = EmbeddingCache(cache_dir)
    model = medadapt.load(str(model_dir), device="cpu")
    prepared = prepare_head_training(model, load_beir(sets["syn"], ["train"]), "train", cache,
                                     show_progress=False, log=lambda _m: None)
    q, p, _ = prepared.tensors()
    head = model.add_adapter(LinearHeadConfig(route="query"), adapter_name="q")
    train_head(head, q, p, None, MoETrainingSection(epochs=settings["epochs"], lr=settings["lr"], seed=7,
                                                    batch_size=settings["batch_size"], weight_decay=0.0),
               InfoNCESection(temperature=settings["temperature"], load_balance_weight=0.0), route="query")
    return {name: evaluate_retrieval(model, load_beir(sets[key], "test"), "test", METRICS, cache=cache,
                                     show_progress=False)
            for name, key in (("test", "syn"), ("lay/test", "lay"))}


def test_metrics_json_has_the_peer_trained_and_scored_directly(peers_run, tiny_bert_dir):
    out, _, sets, cache_dir = peers_run
    written = json.loads((out / "metrics.json").read_text())
    assert set(written) == {*METRICS, "also", "peers"} and set(written["peers"]) == {"strong", "weak"}
    want = _direct(tiny_bert_dir, sets, cache_dir.parent / "fresh", STRONG)  # a fresh cache
    strong = written["peers"]["strong"]
    assert {m: strong[m] for m in METRICS} == pytest.approx(want["test"], abs=2e-6)
    assert strong["also"]["lay/test"] == pytest.approx(want["lay/test"], abs=2e-6)
    assert strong["train_seconds"] > 0
    base = json.loads((out / "baseline_metrics.json").read_text())
    assert strong["ndcg@10"] > base["ndcg@10"] + 0.05  # the peer learned: a real competitor
    # the weak peer is the frozen model (lr 1e-6, one epoch)
    assert written["peers"]["weak"]["ndcg@10"] == pytest.approx(base["ndcg@10"], abs=1e-6)
    # not saved: the run folder holds the head alone
    assert "peer" not in json.loads((out / "medadapt_adapter.json").read_text())["adapters"]


def test_warning_exactly_where_a_peer_beats_the_head_and_table_and_card(peers_run):
    out, output, _, _ = peers_run
    written = json.loads((out / "metrics.json").read_text())
    expected = []
    for label, row in written["peers"].items():
        lay = written["also"]["lay/test"]["trained"]
        for where, trained, peer in [("syn/test", written, row), ("lay/test", lay, row["also"]["lay/test"])]:
            if peer["ndcg@10"] > trained["ndcg@10"]:
                expected.append(f"warning: the {label} trained in this run beats the head on {where}: "
                                f"nDCG@10 {peer['ndcg@10']:.4f} > {trained['ndcg@10']:.4f}")
    assert written["peers"]["weak"]["ndcg@10"] < written["ndcg@10"]  # the weak peer never warns here
    assert [line for line in output.splitlines() if line.startswith("warning: the ")] == expected
    # the final table: a column per peer after the change column, on the eval split's and the also rows
    header = next(line for line in output.splitlines() if "frozen base" in line)
    assert header.index("strong") > header.index("change") and header.index("weak") > header.index("strong")
    for metric in METRICS:
        line = next(x for x in output.splitlines() if x.replace("│", " ").split()[:1] == [metric])
        cells = line.replace("│", " ").split()
        assert cells[4:6] == [f"{written['peers'][p][metric]:.4f}" for p in ("strong", "weak")], line
        line = next(x for x in output.splitlines() if f"lay/test {metric}" in x)
        assert line.replace("│", " ").split()[5:7] == [
            f"{written['peers'][p]['also']['lay/test'][metric]:.4f}" for p in ("strong", "weak")], line
    card = (out / "README.md").read_text()
    assert "| metric | this model | frozen base model | strong (peer) | weak (peer) |" in card
    base = json.loads((out / "baseline_metrics.json").read_text())
    for m in METRICS:
        assert (f"| {m} | {written[m]:.4f} | {base[m]:.4f} | {written['peers']['strong'][m]:.4f} | "
                f"{written['peers']['weak'][m]:.4f} |") in card
    assert "Peer baselines (`eval.peers`): strong (" in card


def test_a_head_that_hardly_trains_is_beaten_with_one_warning(tiny_bert_dir, tmp_path):
    sets = _sets(tmp_path)
    out = tmp_path / "run"
    peer = "[{kind: linear_query, lr: 3.0e-2, epochs: 30, batch_size: 4}]"
    result = _invoke(["--output", str(out), "--cache-dir", str(tmp_path / "cache"), "-q"],
                     [*_args(tiny_bert_dir, sets, peer, lr="1e-6"), "eval.also=[]"])
    assert result.exit_code == 0, result.output
    written = json.loads((out / "metrics.json").read_text())
    peer_ndcg = written["peers"]["linear query adapter"]["ndcg@10"]
    assert peer_ndcg > written["ndcg@10"] + 0.05
    assert [line for line in result.output.splitlines() if line.startswith("warning:")] == [
        f"warning: the linear query adapter trained in this run beats the head on syn/test: nDCG@10 "
        f"{peer_ndcg:.4f} > {written['ndcg@10']:.4f}"]


def test_no_eval_trains_no_peer(tiny_bert_dir, tmp_path):
    sets = _sets(tmp_path)
    options = ["--output", str(tmp_path / "run"), "--cache-dir", str(tmp_path / "cache"), "-q", "--no-eval"]
    result = _invoke(options, [*_args(tiny_bert_dir, sets, "[linear_query]"), "training.epochs=1",
                               "training.shared_epochs=0", "training.random_routing_epochs=0"])
    assert result.exit_code == 0, result.output
    assert "parameter head on" in result.output  # the head trained
    assert "training peer baseline" not in result.output and "warning" not in result.output
    assert not (tmp_path / "run" / "metrics.json").exists()


def test_peer_warning_by_hand():
    line = peer_warning("linear query adapter", "medquad-mini/test", {"ndcg@10": 0.895}, {"ndcg@10": 0.9237},
                        "ndcg@10")
    assert line == ("warning: the linear query adapter trained in this run beats the head on "
                    "medquad-mini/test: nDCG@10 0.9237 > 0.8950")
    assert peer_warning("p", "s", {"ndcg@10": 0.9}, {"ndcg@10": 0.9}, "ndcg@10") is None  # a tie: no warning
    assert peer_warning("p", "s", {"ndcg@10": 0.9}, {"ndcg@10": 0.8}, "ndcg@10") is None
    assert peer_warning("p", "s", {"mrr@10": 0.1}, {"ndcg@10": 0.8}, "ndcg@10") is None


def test_peers_off_the_fast_path_or_on_another_kind_are_one_error(tiny_bert_dir, tmp_path):
    from medadapt.recipes import load_recipe

    sets = [f"model.backbone={tiny_bert_dir}", "eval.peers=[linear_query]"]
    recipe = load_recipe(TINY, sets)
    assert recipe.eval.peers[0].lr == 3e-3 and recipe.eval.peers[0].epochs == 20  # the demo's settings
    slow = [*sets, "model.freeze_backbone=false", "training.shared_epochs=0",
            "training.random_routing_epochs=0", "loss.load_balance_weight=0"]
    with pytest.raises(ConfigError, match="eval.peers .* needs the fast path"):
        load_recipe(TINY, slow)
    with pytest.raises(ConfigError, match="two peers are labelled linear query adapter"):
        load_recipe(TINY, [*sets[:1], "eval.peers=[linear_query, {kind: linear_query, lr: 1.0e-3}]"])
    other = Path(__file__).resolve().parents[1] / "recipes" / "hyrec-tiny.yaml"
    for recipe_file, settings in ((TINY, slow), (other, ["eval.peers=[linear_query]"])):
        result = CliRunner().invoke(app, ["train", str(recipe_file), "--output", str(tmp_path / "o"), "-q",
                                          *(x for s in settings for x in ("--set", s))])
        lines = [line for line in result.output.splitlines() if line.strip()]
        assert result.exit_code == 1 and len(lines) == 1 and "eval.peers" in lines[0], result.output
        assert not (tmp_path / "o").exists()


def test_result_table_hand_made_peer_columns():
    """A column per peer between `change` and `expected`; a metric a peer lacks is a dash, never a blank."""
    from rich.console import Console

    from medadapt.cli._train_run import result_table
    from medadapt.recipes.run import RunResult

    res = RunResult(output_dir=Path("x"), metrics={"ndcg@10": 0.9, "recall@100": 1.0},
                    baseline={"ndcg@10": 0.78, "recall@100": 1.0}, expected={"ndcg@10": (0.95, False)},
                    peers={"linear query adapter": {"metrics": {"ndcg@10": 0.9237}, "also": {},
                                                    "train_seconds": 70.0}})
    console = Console(width=200, record=True, color_system=None)
    console.print(result_table(res, "t"))
    rows = {}
    for line in console.export_text().splitlines():
        cells = [c.strip() for c in line.replace("┃", "│").split("│") if c.strip()]
        if cells:
            rows[cells[0]] = cells[1:]
    assert rows["metric"] == ["frozen base", "trained", "change", "linear query adapter", "expected"]
    assert rows["ndcg@10"] == ["0.7800", "0.9000", "+0.1200", "0.9237", "off by 0.0500"]
    assert rows["recall@100"] == ["1.0000", "1.0000", "+0.0000", "-", "-"]
