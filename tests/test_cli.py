from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from typer.testing import CliRunner

from medadapt.cli import app

pytestmark = pytest.mark.usefixtures("_isolated_cache")  # each test: its own $MEDADAPT_CACHE

runner = CliRunner()


def invoke(*args):
    result = runner.invoke(app, list(args))
    return result, result.output


def test_eval_retrieval_writes_flat_json(tiny_bert_dir, tiny_beir_dir, tmp_path):
    out = tmp_path / "r.json"
    res, text = invoke("eval", "--model", str(tiny_bert_dir), "--data", str(tiny_beir_dir), "--split", "test",
                       "--output", str(out), "--metrics", "ndcg@10,recall@100,f1@10", "-q")
    assert res.exit_code == 0, text
    assert "ndcg@10" in text
    data = json.loads(out.read_text())
    assert set(data) == {"ndcg@10", "recall@100", "f1@10"}
    from sentence_transformers import SentenceTransformer

    from medadapt.data import load_beir
    from medadapt.eval import evaluate_retrieval

    ref = evaluate_retrieval(SentenceTransformer(str(tiny_bert_dir), device="cpu"), load_beir(tiny_beir_dir, ["test"]),
                             "test", ["ndcg@10"], show_progress=False)
    assert data["ndcg@10"] == pytest.approx(ref["ndcg@10"], abs=1e-6) and data["recall@100"] == 1.0


def test_eval_sts_and_rerank(tiny_bert_dir, tmp_path):
    (tmp_path / "sts.jsonl").write_text(
        "\n".join(json.dumps({"sentence1": a, "sentence2": b, "score": s})
                  for a, b, s in [("gout", "gout toe", 4), ("asthma", "eczema", 1), ("flu", "flu fever", 5)]))
    res, text = invoke("eval", "--model", str(tiny_bert_dir), "--data", str(tmp_path), "--task", "sts", "-q")
    assert res.exit_code == 0, text
    assert "pearson" in text and "spearman" in text
    rr = tmp_path / "rr.jsonl"
    rr.write_text(json.dumps({"query": "gout", "candidates": [{"text": "gout toe", "grade": 1}, {"text": "flu"}]}))
    out = tmp_path / "rr.json"
    res, text = invoke("eval", "--model", str(tiny_bert_dir), "--data", str(rr), "--task", "rerank",
                       "--output", str(out), "-q")
    assert res.exit_code == 0, text
    assert set(json.loads(out.read_text())) == {"map@10", "ndcg@10", "mrr@10"}


def _run_cli(*args):
    env = dict(os.environ, HF_HUB_OFFLINE="1")
    return subprocess.run([sys.executable, "-m", "medadapt", *args], capture_output=True, text=True, env=env,
                          timeout=300)


def test_bad_inputs_give_one_clear_line(tiny_bert_dir, tiny_beir_dir, tmp_path):
    (tiny_beir_dir / "qrels" / "train.tsv").unlink()
    bad_json = tmp_path / "badjson"
    bad_json.mkdir()
    (bad_json / "corpus.jsonl").write_text('{"_id": "a", "text": "x"}\n{"_id": \n')
    empty = tmp_path / "empty"
    empty.mkdir()
    (empty / "corpus.jsonl").write_text("")
    cases = [
        (["--model", str(tiny_bert_dir), "--data", str(tiny_beir_dir), "--split", "train"], "qrels file not found"),
        (["--model", str(tiny_bert_dir), "--data", str(bad_json)], "corpus.jsonl:2: invalid JSON"),
        (["--model", str(tiny_bert_dir), "--data", str(empty)], "corpus is empty"),
        (["--model", str(tmp_path / "no-model"), "--data", str(tiny_beir_dir)], "does not exist"),
        (["--model", str(tiny_bert_dir), "--data", str(tiny_beir_dir), "--metrics", "ndcg"], "NAME@K"),
    ]
    from conftest import run_cli_cases

    env = dict(os.environ, HF_HUB_OFFLINE="1")  # the first case in a real process, the others in this one
    for (args, message), proc in zip(cases, run_cli_cases([["eval", *a, "-q"] for a, _ in cases], env)):
        assert proc.returncode == 1, (args, proc.stdout, proc.stderr)
        assert "Traceback" not in proc.stderr + proc.stdout
        err_lines = [ln for ln in proc.stderr.splitlines() if ln.strip()]
        assert len(err_lines) == 1 and message in err_lines[0], (args, proc.stderr)


def test_help_lists_working_commands():
    res, text = invoke("--help")
    assert res.exit_code == 0 and "eval" in text
    proc = _run_cli("version")
    assert proc.returncode == 0 and proc.stdout.strip()


def test_version_flag_and_command_print_the_package_version():
    import medadapt

    for args in (["--version"], ["version"]):
        result = runner.invoke(app, args)
        assert result.exit_code == 0 and result.output.strip() == medadapt.__version__
