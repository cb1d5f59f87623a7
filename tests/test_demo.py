"""The first run: the builtin ``medquad-mini`` set, its build script, the demo recipe, and the train command's
result table (frozen base | trained | change, an ``expected`` column only when the recipe sets one)."""

from __future__ import annotations

import importlib.util
import json
import re
from collections import Counter
from pathlib import Path

import pytest
from typer.testing import CliRunner

from medadapt.cli import app
from medadapt.data import BUILTIN_DATASETS, load_beir, resolve_data_dir
from medadapt.recipes import load_recipe

ROOT = Path(__file__).resolve().parents[1]
MINI = ROOT / "medadapt" / "data" / "builtin" / "medquad-mini"
TINY = ROOT / "recipes" / "med-moe-embed-tiny.yaml"
DEMO = ROOT / "recipes" / "med-moe-embed-demo.yaml"
SHARED_MEDQUAD = ROOT.parent / "shared" / "data" / "medquad"


def _script():
    spec = importlib.util.spec_from_file_location("make_medquad_mini", ROOT / "benchmarks" / "make_medquad_mini.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _rows(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


def _qrels(path: Path) -> list[tuple[str, str, str]]:
    lines = path.read_text(encoding="utf-8").splitlines()
    assert lines[0] == "query-id\tcorpus-id\tscore"
    return [tuple(line.split("\t")) for line in lines[1:]]


# ----------------------------------------------------------------------------------------------- the data set
def test_medquad_mini_is_builtin_and_loads():
    assert resolve_data_dir("medquad-mini") == MINI == BUILTIN_DATASETS["medquad-mini"]
    data = load_beir("medquad-mini")
    assert sorted(data.qrels) == ["dev", "test", "train"]
    assert 1000 <= len(data.corpus) <= 2500
    assert len(data.qrels["train"]) == 1000 and len(data.qrels["dev"]) == 150 and len(data.qrels["test"]) == 300
    assert all(doc["text"].strip() for doc in data.corpus.values())
    size = sum(f.stat().st_size for f in MINI.rglob("*") if f.is_file())
    assert size < 4_000_000, size  # a few MB at most inside the package


def test_medquad_mini_ids_unique_every_query_judged_splits_disjoint_by_document():
    corpus, queries = _rows(MINI / "corpus.jsonl"), _rows(MINI / "queries.jsonl")
    ids, qids = [d["_id"] for d in corpus], [q["_id"] for q in queries]
    assert len(ids) == len(set(ids)) and len(qids) == len(set(qids))
    split_of_query: dict[str, str] = {}
    split_of_doc: dict[str, set[str]] = {}
    for split in ("train", "dev", "test"):
        for qid, did, score in _qrels(MINI / "qrels" / f"{split}.tsv"):
            assert score == "1" and did in set(ids)
            assert split_of_query.setdefault(qid, split) == split, qid  # a query is in one split only
            split_of_doc.setdefault(did, set()).add(split)
    assert set(split_of_query) == set(qids)  # every query (test ones included) has its judgement
    assert set(split_of_doc) == set(ids)  # every answer is some query's answer
    assert all(len(s) == 1 for s in split_of_doc.values())  # disjoint by document
    test_docs = {d for d, s in split_of_doc.items() if s == {"test"}}
    train_docs = {d for d, s in split_of_doc.items() if s == {"train"}}
    assert test_docs and train_docs and not test_docs & train_docs


def test_medquad_mini_keeps_whole_topic_clusters_with_distractors():
    corpus = _rows(MINI / "corpus.jsonl")
    clusters = Counter(d["title"].strip().lower() for d in corpus)
    assert min(clusters.values()) >= 2  # every answer has a same-topic distractor
    queries = {q["_id"]: q for q in _rows(MINI / "queries.jsonl")}
    test_qids = [qid for qid, _, _ in _qrels(MINI / "qrels" / "test.tsv")]
    # questions of one topic ask different things of it (symptoms, treatment, ...): hard distractors
    assert len({queries[q]["metadata"]["qtype"] for q in test_qids}) >= 5


def test_medquad_mini_readme_carries_the_cc_by_attribution():
    text = (MINI / "README.md").read_text(encoding="utf-8")
    assert "CC BY 4.0" in text and "creativecommons.org/licenses/by/4.0" in text
    assert "Ben Abacha" in text and "Demner-Fushman" in text and "2019" in text
    assert "benchmarks/make_medquad_mini.py" in text
    corpus = _rows(MINI / "corpus.jsonl")
    assert f"| {len(corpus)} answers" in text  # the counts it states are the files'


# ----------------------------------------------------------------------------------------------- the build script
def _fake_medquad(root: Path) -> Path:
    """A MedQuAD-shaped folder: topic clusters of 1-3 answers over three splits, and one answer judged for
    queries of two splits (as the shared folder's deduplicated boiler-plate is)."""
    corpus, queries, qrels = [], [], {"train": [], "dev": [], "test": []}
    layout = {"train": ["alpha", "beta", "gamma", "delta", "eps"], "dev": ["zeta", "eta"], "test": ["theta", "iota"]}
    n = 0
    for split, topics in layout.items():
        for t, topic in enumerate(topics):
            for k in range(1 + (t % 3)):  # cluster sizes 1, 2, 3, 1, 2
                n += 1
                corpus.append({"_id": f"D{n}", "title": topic.title() if k else topic, "text": f"{topic} answer {k}"})
                queries.append({"_id": f"Q{n}", "text": f"question {k} on {topic}"})
                qrels[split].append((f"Q{n}", f"D{n}"))
    corpus.append({"_id": "Dshared", "title": "beta", "text": "inherited in an autosomal pattern"})
    queries += [{"_id": "Qs1", "text": "is beta inherited"}, {"_id": "Qs2", "text": "is zeta inherited"}]
    qrels["train"].append(("Qs1", "Dshared"))
    qrels["dev"].append(("Qs2", "Dshared"))
    (root / "qrels").mkdir(parents=True)
    (root / "corpus.jsonl").write_text("".join(json.dumps(d) + "\n" for d in corpus))
    (root / "queries.jsonl").write_text("".join(json.dumps(q) + "\n" for q in queries))
    for split, rows in qrels.items():
        (root / "qrels" / f"{split}.tsv").write_text(
            "query-id\tcorpus-id\tscore\n" + "".join(f"{q}\t{d}\t1\n" for q, d in rows))
    return root


def test_build_script_takes_whole_clusters_keeps_splits_and_drops_shared_answers(tmp_path):
    source = _fake_medquad(tmp_path / "src")
    make = _script()
    out = tmp_path / "mini"
    make.main(["--source", str(source), "--out", str(out), "--train", "100", "--dev", "100", "--test", "100",
               "--max-docs", "100", "--min-cluster", "2"])
    corpus = _rows(out / "corpus.jsonl")
    titles = Counter(d["title"].lower() for d in corpus)
    # clusters of 2+ answers only (beta 2, gamma 3, eps 2, eta 2, iota 2), each whole; singletons and the
    # answer judged in two splits are left out with their queries
    assert titles == {"beta": 2, "gamma": 3, "eps": 2, "eta": 2, "iota": 2}
    assert "Dshared" not in {d["_id"] for d in corpus}
    qids = {q["_id"] for q in _rows(out / "queries.jsonl")}
    assert not {"Qs1", "Qs2"} & qids
    src_split = {q: s for s in ("train", "dev", "test") for q, _, _ in _qrels(source / "qrels" / f"{s}.tsv")}
    for split in ("train", "dev", "test"):
        rows = _qrels(out / "qrels" / f"{split}.tsv")
        assert rows and all(src_split[q] == split for q, _, _ in rows)  # the shared split, unchanged
    assert "CC BY 4.0" in (out / "README.md").read_text()
    # deterministic: the same arguments give the same bytes; quotas are honoured
    again = tmp_path / "again"
    make.main(["--source", str(source), "--out", str(again), "--train", "100", "--dev", "100", "--test", "100",
               "--max-docs", "100", "--min-cluster", "2"])
    for f in ("corpus.jsonl", "queries.jsonl", "qrels/train.tsv", "qrels/dev.tsv", "qrels/test.tsv", "README.md"):
        assert (out / f).read_bytes() == (again / f).read_bytes(), f
    small = tmp_path / "small"
    make.main(["--source", str(source), "--out", str(small), "--train", "3", "--dev", "100", "--test", "100",
               "--max-docs", "100", "--min-cluster", "1"])
    assert len(_qrels(small / "qrels" / "train.tsv")) <= 3


def test_build_script_check_refuses_a_document_in_two_splits():
    make = _script()
    sub = {"corpus": [{"_id": "D1"}], "queries": [{"_id": "Q1"}, {"_id": "Q2"}],
           "qrels": {"train": [("Q1", "D1", "1")], "dev": [("Q2", "D1", "1")], "test": []}}
    with pytest.raises(AssertionError, match="D1 in two splits"):
        make.check(sub)


@pytest.mark.skipif(not (SHARED_MEDQUAD / "corpus.jsonl").is_file(), reason="shared MedQuAD folder not present")
def test_shipped_medquad_mini_is_what_the_script_builds(tmp_path):
    _script().main(["--source", str(SHARED_MEDQUAD), "--out", str(tmp_path / "mini")])
    for f in ("corpus.jsonl", "queries.jsonl", "qrels/train.tsv", "qrels/dev.tsv", "qrels/test.tsv", "README.md"):
        assert (tmp_path / "mini" / f).read_bytes() == (MINI / f).read_bytes(), f


# ----------------------------------------------------------------------------------------------- the demo recipe
def test_demo_recipe_trains_on_medquad_mini_and_evaluates_test_against_the_frozen_base():
    recipe = load_recipe(DEMO)
    assert recipe.kind == "moe" and recipe.data.path == "medquad-mini" and recipe.model.backbone == "minilm"
    assert recipe.model.freeze_backbone and recipe.eval.split == "test" and recipe.eval.baseline
    assert resolve_data_dir(recipe.resolve(recipe.data.path)) == MINI
    assert "ndcg@10" in recipe.eval.metrics
    # every metric of the main job's table has a target, so its expected column has no blank cells
    assert set(recipe.eval.expected) == set(recipe.eval.metrics)


# ----------------------------------------------------------------------------------------------- the train table
def _tiny_args(model_dir, data_dir, out) -> list[str]:
    args = ["train", str(TINY), "--output", str(out), "-q"]
    for o in (f"model.backbone={model_dir}", f"data.path={data_dir}", "data.hard_negatives.window=[2, 6]",
              "head.expansion=1", "training.batch_size=4", "training.shared_epochs=1",
              "training.random_routing_epochs=1", "training.epochs=2", "eval.split=test",
              "eval.metrics=[ndcg@10, mrr@10]"):
        args += ["--set", o]
    return args


def _table_rows(output: str) -> dict[str, list[str]]:
    """Rows of the rich table in CLI output: the first cell -> the other cells."""
    rows = {}
    for line in output.splitlines():
        cells = [c.strip() for c in re.split(r"[│┃|]", line) if c.strip()]
        if cells:
            rows[cells[0]] = cells[1:]
    return rows


@pytest.fixture()
def cache_env(tmp_path, monkeypatch):
    monkeypatch.setenv("MEDADAPT_CACHE", str(tmp_path / "cache"))
    return tmp_path / "cache"


def test_train_table_shows_frozen_trained_change_and_no_expected_column(tiny_bert_dir, tiny_beir_dir, tmp_path,
                                                                         cache_env):
    out = tmp_path / "run"
    result = CliRunner().invoke(app, _tiny_args(tiny_bert_dir, tiny_beir_dir, out), terminal_width=200)
    assert result.exit_code == 0, result.output
    rows = _table_rows(result.output)
    assert rows["metric"] == ["frozen base", "trained", "change"]  # no "expected" column: none is set
    assert "expected" not in result.output
    metrics = json.loads((out / "metrics.json").read_text())
    base = json.loads((out / "baseline_metrics.json").read_text())
    for metric in ("ndcg@10", "mrr@10"):
        frozen, trained, change = rows[metric]
        assert float(frozen) == pytest.approx(base[metric], abs=5e-5)
        assert float(trained) == pytest.approx(metrics[metric], abs=5e-5)
        assert float(change) == pytest.approx(metrics[metric] - base[metric], abs=1.5e-4)
        assert change[0] in "+-"  # signed


def test_train_table_expected_column_only_when_set(tiny_bert_dir, tiny_beir_dir, tmp_path, cache_env):
    out = tmp_path / "run"
    args = [*_tiny_args(tiny_bert_dir, tiny_beir_dir, out), "--set", "eval.expected={ndcg@10: 0.0, mrr@10: 1.5}",
            "--set", "eval.baseline=false"]
    result = CliRunner().invoke(app, args, terminal_width=200)
    assert result.exit_code == 0, result.output
    rows = _table_rows(result.output)
    assert rows["metric"] == ["trained", "expected"]  # no baseline asked for: no empty frozen/change columns
    metrics = json.loads((out / "metrics.json").read_text())
    assert rows["ndcg@10"][1] == "ok"
    assert rows["mrr@10"][1] == f"off by {1.5 - metrics['mrr@10']:.4f}"
    assert not (out / "baseline_metrics.json").exists()
    # --check turns the miss into exit code 2 (the rerun resumes from the finished run's checkpoints)
    checked = CliRunner().invoke(app, [*args, "--check"], terminal_width=200)
    assert checked.exit_code == 2, checked.output


def test_result_table_hand_made_values():
    from rich.console import Console

    from medadapt.cli._train_run import result_table
    from medadapt.recipes.run import RunResult

    res = RunResult(output_dir=Path("x"), metrics={"ndcg@10": 0.9, "mrr@10": 0.5, "recall@100": 1.0},
                    baseline={"ndcg@10": 0.78, "mrr@10": 0.55})
    console = Console(width=200, record=True, color_system=None)
    console.print(result_table(res, "t"))
    rows = _table_rows(console.export_text())
    assert rows["metric"] == ["frozen base", "trained", "change"]
    assert rows["ndcg@10"] == ["0.7800", "0.9000", "+0.1200"]
    assert rows["mrr@10"] == ["0.5500", "0.5000", "-0.0500"]
    assert rows["recall@100"] == ["-", "1.0000", "-"]  # no baseline for this metric: a dash, not a blank
    res.expected = {"ndcg@10": (0.95, False)}
    console = Console(width=200, record=True, color_system=None)
    console.print(result_table(res, "t"))
    rows = _table_rows(console.export_text())
    assert rows["metric"][-1] == "expected" and rows["ndcg@10"][-1] == "off by 0.0500"
    assert rows["mrr@10"][-1] == "-"
