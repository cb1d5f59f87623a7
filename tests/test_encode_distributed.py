"""``medadapt encode`` / :func:`medadapt.encode.encode_corpus` (docs/cache.md, "Out-of-core and distributed
encoding"): 2 CPU processes under ``accelerate launch`` store what 1 process stores (within 1e-6, each text
once, both processes working); a run killed midway resumes from its shards and ends equal to an
uninterrupted run, and a reader polling the cache meanwhile never sees a half-written shard.

The launches use ``recipes/accelerate/cpu-2proc.yaml`` (torchrun launcher, gloo), as tests/test_distributed.py
explains.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest
from conftest import TOPICS, write_beir
from typer.testing import CliRunner

from medadapt.cache import EmbeddingCache
from medadapt.cache_shards import read_embeddings, read_hashes
from medadapt.cli import app
from medadapt.encode import corpus_texts, encode_corpus

ROOT = Path(__file__).resolve().parents[1]
CPU_2PROC = ROOT / "recipes" / "accelerate" / "cpu-2proc.yaml"

pytestmark = pytest.mark.usefixtures("_single_thread")


def _corpus(root: Path, n: int) -> Path:
    """A BEIR folder of ``n`` documents of varied lengths (1 to 6 topic sentences), two repeated texts."""
    corpus = {}
    for i in range(n):
        parts = [f"{TOPICS[(i + k) % len(TOPICS)][0]} {TOPICS[(i * 7 + k) % len(TOPICS)][1]}" for k in range(1 + i % 6)]
        corpus[f"d{i}"] = (f"note {i}", " ; ".join(parts))
    corpus["dup1"] = corpus["d3"]  # the same text twice: stored once
    corpus["dup2"] = corpus["d4"]
    queries = {f"q{i}": f"symptoms of {name}" for i, (name, _) in enumerate(TOPICS)}
    return write_beir(root, corpus, queries, {"test": {"q0": {"d0": 1}}})


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _launch(model: Path, corpus: Path, cache: Path, report: Path, *extra: str) -> subprocess.Popen:
    """``accelerate launch`` of ``medadapt encode`` on 2 CPU processes, in its own process group."""
    return _launch_cli("encode", "--model", str(model), "--corpus", str(corpus), "--cache-dir", str(cache),
                       "--report", str(report), "--device", "cpu", "-q", *extra)


def _launch_cli(*args: str) -> subprocess.Popen:
    """``accelerate launch`` of ``medadapt ARGS`` on 2 CPU processes, in its own process group."""
    cmd = [sys.executable, "-m", "accelerate.commands.launch", "--config_file", str(CPU_2PROC),
           "--main_process_port", str(_free_port()), "-m", "medadapt", *args]
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "CUDA_VISIBLE_DEVICES": "", "TOKENIZERS_PARALLELISM": "false",
           "OMP_NUM_THREADS": "1"}
    return subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)


def _kill_tree(proc: subprocess.Popen) -> str:
    """SIGKILL the launcher and every process under it (torchrun starts its workers in sessions of their
    own, so killing the launcher's process group would leave them running): a crash, not a clean stop."""
    import psutil

    try:
        launcher = psutil.Process(proc.pid)
        workers = launcher.children(recursive=True)
    except psutil.NoSuchProcess:
        launcher, workers = None, []
    for p in [*workers, *([launcher] if launcher else [])]:
        try:
            p.send_signal(signal.SIGKILL)
        except psutil.NoSuchProcess:
            pass
    psutil.wait_procs(workers, timeout=30)
    return proc.communicate()[0]


def _finish(proc: subprocess.Popen, timeout: float = 300) -> str:
    try:
        out, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        out = _kill_tree(proc)
        pytest.fail(f"accelerate launch timed out:\n{out[-3000:]}")
    assert proc.returncode == 0, out[-5000:]
    return out


def _shards(cache: Path) -> list[Path]:
    return sorted(cache.glob("*/shard-*.safetensors"))


def _rows_stored(cache: Path) -> int:
    return sum(len(read_hashes(s)) for s in _shards(cache))


def _model(tiny_bert_dir):
    from sentence_transformers import SentenceTransformer

    return SentenceTransformer(str(tiny_bert_dir), device="cpu")


def test_one_process_encode_fills_what_eval_reads(tiny_bert_dir, tmp_path):
    """The library call: every distinct text cached once under the namespace ``encode(role="document")``
    reads, nothing encoded on a rerun, float16 in its own namespace."""
    beir = _corpus(tmp_path / "beir", 30)
    texts = corpus_texts(beir)
    assert len(texts) == 32 and texts[30] == texts[3]
    model = _model(tiny_bert_dir)
    cache = EmbeddingCache(tmp_path / "c", chunk_size=7)
    first = encode_corpus(model, texts, cache=cache, show_progress=False)
    assert (first.texts, first.unique, first.cached_before, first.encoded, first.processes) == (32, 30, 0, 30, 1)
    assert first.per_process == [30] and first.rounds == 1
    assert len(_shards(tmp_path / "c")) == 5 and _rows_stored(tmp_path / "c") == 30  # 7+7+7+7+2
    again = encode_corpus(model, texts, cache=cache, show_progress=False)
    assert (again.encoded, again.cached_before, again.rounds) == (0, 30, 0)
    np.testing.assert_allclose(cache.view(model, texts, role="document").to_numpy(),
                               model.encode_document(texts), atol=1e-6)
    half = EmbeddingCache(tmp_path / "c", chunk_size=7, dtype="float16")
    r16 = encode_corpus(model, texts, cache=half, show_progress=False)
    assert r16.encoded == 30 and r16.namespace != first.namespace and r16.dtype == "float16"
    assert {read_embeddings(s).dtype for s in Path(r16.folder).glob("shard-*.safetensors")} == {np.dtype("float16")}


def test_encode_cli_one_process_and_bad_input(tiny_bert_dir, tmp_path):
    beir = _corpus(tmp_path / "beir", 10)
    runner = CliRunner()
    res = runner.invoke(app, ["encode", "--model", str(tiny_bert_dir), "--corpus", str(beir), "--cache-dir",
                              str(tmp_path / "c"), "--dtype", "float16", "--queries", "--report",
                              str(tmp_path / "r.json"), "-q", "--device", "cpu"])
    assert res.exit_code == 0, res.output
    assert "documents: 10 distinct texts cached (float16)" in res.output
    assert "queries: 12 distinct texts cached (float16)" in res.output
    report = json.loads((tmp_path / "r.json").read_text())
    assert report["document"]["encoded"] == 10 and report["query"]["encoded"] == 12
    assert report["document"]["dtype"] == "float16"
    bad = runner.invoke(app, ["encode", "--model", str(tiny_bert_dir), "--corpus", str(tmp_path / "nope"),
                              "--cache-dir", str(tmp_path / "c2")])
    assert bad.exit_code == 1 and "error:" in bad.output and "nope" in bad.output
    assert not (tmp_path / "c2").exists()  # nothing written
    bad_dtype = runner.invoke(app, ["encode", "--corpus", str(beir), "--dtype", "float64"])
    assert bad_dtype.exit_code != 0 and "float64" in bad_dtype.output


def test_two_processes_store_what_one_process_stores(tiny_bert_dir, tmp_path):
    beir = _corpus(tmp_path / "beir", 40)
    texts = corpus_texts(beir)
    model = _model(tiny_bert_dir)
    one = EmbeddingCache(tmp_path / "one", chunk_size=5)
    solo = encode_corpus(model, texts, cache=one, show_progress=False)

    out = _finish(_launch(tiny_bert_dir, beir, tmp_path / "two", tmp_path / "r.json", "--chunk-size", "5"))
    report = json.loads((tmp_path / "r.json").read_text())["document"]
    assert report["processes"] == 2 and report["namespace"] == solo.namespace
    assert report["encoded"] == report["unique"] == 40 and report["cached_before"] == 0
    assert sorted(report["per_process"]) == [20, 20], out  # both processes worked, on disjoint halves
    assert "process 0: 20, process 1: 20" in out
    assert _rows_stored(tmp_path / "two") == 40  # each distinct text stored once
    assert len(_shards(tmp_path / "two")) == 8  # 20 per process in chunks of 5

    two = EmbeddingCache(tmp_path / "two")
    a = one.view(model, texts, role="document").to_numpy()
    b = two.view(model, texts, role="document").to_numpy()
    np.testing.assert_allclose(b, a, rtol=0, atol=1e-6)

    # a rerun finds every text (a launched rerun skipping what is cached is the resume in the killed-run test)
    again = encode_corpus(model, texts, cache=two, show_progress=False)
    assert (again.encoded, again.cached_before, again.namespace) == (0, 40, solo.namespace)
    assert _rows_stored(tmp_path / "two") == 40


class _Reader(threading.Thread):
    """Polls the cache while a writer works: every shard file it can list must read back complete and
    verified (safetensors header, SHA-256 of hashes and embeddings, finiteness)."""

    def __init__(self, root: Path):
        super().__init__(daemon=True)
        self.root, self.stop, self.failures, self.reads = root, threading.Event(), [], 0

    def run(self):
        seen = set()
        while not self.stop.is_set():
            for shard in _shards(self.root):
                if shard in seen:
                    continue
                try:
                    read_hashes(shard)
                    read_embeddings(shard)
                    seen.add(shard)
                    self.reads += 1
                except Exception as e:  # noqa: BLE001 - any failure is a half-written shard seen
                    self.failures.append(f"{shard.name}: {type(e).__name__}: {e}")
            time.sleep(0.005)


def test_killed_encode_resumes_and_equals_an_uninterrupted_run(tiny_bert_dir, tmp_path):
    beir = _corpus(tmp_path / "beir", 400)
    texts = corpus_texts(beir)
    unique = 400
    cache_dir = tmp_path / "killed"
    reader = _Reader(cache_dir)
    reader.start()
    proc = _launch(tiny_bert_dir, beir, cache_dir, tmp_path / "r.json", "--chunk-size", "4", "--batch-size", "2")
    deadline = time.monotonic() + 240
    while len(_shards(cache_dir)) < 6:
        assert proc.poll() is None, proc.communicate()[0][-3000:]
        assert time.monotonic() < deadline, "no shards were written in time"
        time.sleep(0.01)
    assert proc.poll() is None  # still encoding: the kill lands midway
    _kill_tree(proc)
    time.sleep(0.5)  # no survivor keeps writing
    before = _rows_stored(cache_dir)
    assert 0 < before < unique and before % 4 == 0  # whole chunks only
    assert not (tmp_path / "r.json").exists()

    out = _finish(_launch(tiny_bert_dir, beir, cache_dir, tmp_path / "r.json", "--chunk-size", "4"))
    reader.stop.set()
    reader.join(timeout=10)
    assert reader.failures == [], reader.failures  # no reader ever saw a half-written shard
    assert reader.reads >= len(_shards(cache_dir)) // 2  # the reader really was reading
    report = json.loads((tmp_path / "r.json").read_text())["document"]
    assert report["cached_before"] >= before and report["encoded"] == unique - report["cached_before"], out
    assert _rows_stored(cache_dir) == unique  # resumed: nothing encoded twice
    assert not list(cache_dir.glob("*/corrupt-*"))

    model = _model(tiny_bert_dir)
    fresh = EmbeddingCache(tmp_path / "uninterrupted", chunk_size=4)
    encode_corpus(model, texts, cache=fresh, show_progress=False)
    np.testing.assert_allclose(EmbeddingCache(cache_dir).view(model, texts, role="document").to_numpy(),
                               fresh.view(model, texts, role="document").to_numpy(), rtol=0, atol=1e-6)


@pytest.mark.parametrize("outcome", ["returns", "fails"])
def test_launched_commands_close_the_process_group(tmp_path, outcome):
    """``train`` and ``encode`` close the ``torch.distributed`` group on every process, whether they return
    or fail: a worker that left it to interpreter shutdown aborted there in CI (``terminate called without
    an active exception``) and failed a launch whose work was done."""
    import torch.distributed as dist

    from medadapt.cli._encode_run import run_encode
    from medadapt.cli._train_run import run_train
    from medadapt.training.distributed import closes_process_group

    assert {run_encode.__wrapped__.__name__, run_train.__wrapped__.__name__} == {"run_encode", "run_train"}

    @closes_process_group
    def command():
        assert dist.is_initialized()
        if outcome == "fails":
            raise RuntimeError("boom")
        return 3

    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1)
    try:
        if outcome == "fails":
            with pytest.raises(RuntimeError, match="boom"):
                command()
        else:
            assert command() == 3
        assert not dist.is_initialized()
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


def test_eval_and_index_under_two_processes_share_the_corpus_encode(tiny_bert_dir, tmp_path):
    """``medadapt eval`` / ``medadapt index`` under ``accelerate launch``: both processes encode a part of the
    corpus into the cache (one shard each where one process writes one), the main process alone evaluates
    or builds, and the figures equal a one-process run's."""
    beir = _corpus(tmp_path / "beir", 40)
    runner = CliRunner()
    res = runner.invoke(app, ["eval", "--model", str(tiny_bert_dir), "--data", str(beir), "--split", "test",
                              "--device", "cpu", "--cache-dir", str(tmp_path / "c1"), "--output",
                              str(tmp_path / "one.json"), "-q"])
    assert res.exit_code == 0, res.output
    out = _finish(_launch_cli("eval", "--model", str(tiny_bert_dir), "--data", str(beir), "--split", "test",
                              "--device", "cpu", "--cache-dir", str(tmp_path / "c2"), "--output",
                              str(tmp_path / "two.json"), "-q"))
    one, two = (json.loads((tmp_path / f"{n}.json").read_text()) for n in ("one", "two"))
    metrics = {k: v for k, v in one.items() if isinstance(v, float)}
    assert metrics and {k: two[k] for k in metrics} == pytest.approx(metrics, abs=1e-6), (one, two)
    assert out.count("ndcg_at_10") <= 1, out  # one table, from the main process
    by_ns = {d.name: len(list(d.glob("shard-*.safetensors"))) for d in (tmp_path / "c2").iterdir() if d.is_dir()}
    assert sorted(by_ns.values()) == [1, 2], by_ns  # queries by the main process; documents: a shard each
    assert {len(list(d.glob("shard-*.safetensors"))) for d in (tmp_path / "c1").iterdir() if d.is_dir()} == {1}

    _finish(_launch_cli("index", "--model", str(tiny_bert_dir), "--corpus", str(beir), "--out",
                        str(tmp_path / "idx"), "--kind", "dense", "--device", "cpu", "--cache-dir",
                        str(tmp_path / "c3"), "-q"))
    assert (tmp_path / "idx" / "manifest.json").is_file()
    docs = [d for d in (tmp_path / "c3").iterdir() if d.is_dir()]
    assert [len(list(d.glob("shard-*.safetensors"))) for d in docs] == [2]
    from medadapt.retrieval.retriever import Retriever

    hits = Retriever.load(tmp_path / "idx").search("symptoms of " + TOPICS[0][0], k=3)
    assert len(hits) == 3


def test_eval_under_a_launch_refuses_what_it_cannot_share(tiny_bert_dir, tmp_path, monkeypatch):
    """Under ``accelerate launch`` (WORLD_SIZE > 1) a suite, a comparison, --no-cache or a non-retrieval task
    is one error line, given before any process group starts or any model loads."""
    beir = _corpus(tmp_path / "beir", 8)
    monkeypatch.setenv("WORLD_SIZE", "2")
    res = CliRunner().invoke(app, ["eval", "--model", str(tiny_bert_dir), "--data", str(beir), "--split", "test",
                                   "--no-cache", "-q"])
    assert res.exit_code == 1 and "--no-cache: run without accelerate launch" in res.output, res.output
    import torch.distributed as dist

    assert not dist.is_initialized()
