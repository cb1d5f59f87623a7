"""Shared fixtures: tiny randomly initialised models built offline, never downloaded.

The builders are the library's (:mod:`medadapt.tiny`, also behind the ``tiny-bert`` / ``tiny-qwen2`` /
``tiny-beir`` names the ``*-tiny*`` recipes use), re-exported here for the tests that import them.

* ``tiny_bert_dir``: a saved SentenceTransformer (BERT, hidden 32, 2 layers, mean pooling, Normalize)
  with a fixed WordPiece vocabulary (``medadapt.tiny.tiny_vocab``).
* ``tiny_bert``: a fresh ``SentenceTransformer`` loaded from that directory (function scope, so tests
  may mutate it).
* ``tiny_qwen2_dir`` / ``tiny_qwen2_right_dir``: a saved tiny Qwen2 decoder (left / right padding), built
  once per session; tests load models from it and never write into it.
* ``tiny_beir_dir``: a small BEIR folder whose queries share words with their relevant documents.
* ``_isolated_cache``: ``$MEDADAPT_CACHE`` in the test's own folder (``pytestmark =
  pytest.mark.usefixtures("_isolated_cache")``).

Helpers shared by several test files that are not fixtures live in ``tests/_helpers.py``; no test file
imports another.
"""

from __future__ import annotations

import atexit
import os
import shutil
import tempfile
from pathlib import Path

import pytest

from medadapt import progress
from medadapt.cli import main as cli_main
from medadapt.tiny import (  # noqa: F401 - re-exported: tests import the builders from conftest
    TOPICS,
    build_tiny_beir,
    build_tiny_bert,
    build_tiny_qwen2,
    corpus_texts,
    tiny_vocab,
    write_beir,
)

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

# Tests write only to temporary folders: the sentence-transformers trainer builds `datasets` datasets, whose
# cache would otherwise land in ~/.cache/huggingface/datasets (set before `datasets` is imported; the
# subprocesses the tests start inherit it). The embedding cache is per test (tmp_path) or $MEDADAPT_CACHE.
_TEST_TMP = tempfile.mkdtemp(prefix="medadapt-tests-")
os.environ["HF_DATASETS_CACHE"] = os.path.join(_TEST_TMP, "hf-datasets")
os.environ.setdefault("MEDADAPT_CACHE", os.path.join(_TEST_TMP, "embeddings"))
atexit.register(shutil.rmtree, _TEST_TMP, ignore_errors=True)


def build_synonym_beir(root: Path, word: int = 2, topics=None, dev: bool = False) -> Path:
    """The synonym set: documents name a condition (``d<i>``: "<name> is a condition"); train queries
    ``t<i>`` ("treatment of <lay>") and test queries ``q<i>`` ("symptoms of <lay>") use word ``word`` of the
    topic, never the name, so a frozen random model has nothing to go on and a head must learn the words from
    the train queries. ``dev``: the test queries also form a dev split."""
    corpus, queries, train, test = {}, {}, {}, {}
    for i, (name, words) in enumerate(TOPICS if topics is None else topics):
        lay = words.split()[word]
        corpus[f"d{i}"] = ("", f"{name} is a condition")
        queries[f"t{i}"], train[f"t{i}"] = f"treatment of {lay}", {f"d{i}": 1}
        queries[f"q{i}"], test[f"q{i}"] = f"symptoms of {lay}", {f"d{i}": 1}
    return write_beir(root, corpus, queries, {"train": train, "test": test, **({"dev": test} if dev else {})})

class CpuAccelerator:
    """What medadapt's training loop reads of an ``accelerate.Accelerator`` of plain CPU processes (no engine):
    rank, world size, device, optimiser preparation, autocast, backward and a barrier (gloo, when there is
    more than one process). Tests drive the loop with it inside ``torch.multiprocessing`` workers, where a
    real ``Accelerator`` would need ``accelerate launch``."""

    device = __import__("torch").device("cpu")
    distributed_type = "MULTI_CPU"
    is_main_process = True

    def __init__(self, rank: int = 0, world: int = 1) -> None:
        from types import SimpleNamespace

        self.process_index, self.num_processes, self.state = rank, world, SimpleNamespace()
        self.is_main_process = rank == 0

    def prepare_optimizer(self, optimizer):
        return optimizer

    def autocast(self):
        import contextlib

        return contextlib.nullcontext()

    def backward(self, loss):
        loss.backward()

    def wait_for_everyone(self):
        if self.num_processes > 1:
            import torch.distributed as dist

            dist.barrier()


def run_cli_processes(arg_lists: list[list[str]], env: dict | None = None, cwd: Path | None = None,
                      timeout: float = 300) -> list:
    """``python -m medadapt ARGS`` for each argument list, each in a process of its own (exit code and stderr
    as a user sees them), up to one per usable core (at least 2, at most 4) at a time: most of a short run is
    importing torch, and the bad-input tests run a dozen of them. Results in the order given."""
    import subprocess
    import sys
    from concurrent.futures import ThreadPoolExecutor

    def one(args):
        return subprocess.run([sys.executable, "-m", "medadapt", *args], capture_output=True, text=True, env=env,
                              timeout=timeout, cwd=cwd)

    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    with ThreadPoolExecutor(max_workers=min(4, max(2, cores))) as pool:
        return list(pool.map(one, arg_lists))


def run_cli(args: list[str], env: dict | None = None, cwd: Path | None = None):
    """``medadapt ARGS`` in this process, through the console script's entry point (``medadapt.cli.main``) with
    ``sys.argv``, the environment (``env`` replaces it, as for a subprocess) and the working folder set for the
    call and restored after. A ``subprocess.CompletedProcess`` as :func:`run_cli_processes` gives: the exit code
    ``sys.exit`` asked for, stdout and stderr as printed, and an exception that escapes as its traceback on stderr
    with code 1 (what the interpreter would do). No import of torch per call, so a test can afford many bad
    inputs; what only a real process shows (import-time warnings on stderr) is for :func:`run_cli_cases`."""
    import contextlib
    import io
    import logging
    import subprocess
    import sys
    import traceback
    import warnings

    out, err, code = io.StringIO(), io.StringIO(), 0
    saved_env, saved_argv, saved_cwd, saved_level = dict(os.environ), sys.argv, os.getcwd(), progress.level()
    loggers = {name: logging.getLogger(name).level for name in ("sentence_transformers", "accelerate", "datasets",
                                                                "faiss", "jieba", "mteb", "transformers")}
    try:
        if env is not None:
            os.environ.clear()
            os.environ.update(env)
        if cwd is not None:
            os.chdir(cwd)
        sys.argv = ["medadapt", *map(str, args)]
        with warnings.catch_warnings(), contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                cli_main()
            except SystemExit as exc:
                if exc.code is None or isinstance(exc.code, int):
                    code = exc.code or 0
                else:
                    print(exc.code, file=sys.stderr)
                    code = 1
            except Exception:  # noqa: BLE001 - shown as the interpreter would show it
                traceback.print_exc(file=sys.stderr)
                code = 1
    finally:
        sys.argv = saved_argv
        os.chdir(saved_cwd)
        os.environ.clear()
        os.environ.update(saved_env)
        progress.set_level(saved_level)
        for name, value in loggers.items():
            logging.getLogger(name).setLevel(value)
    return subprocess.CompletedProcess(["medadapt", *map(str, args)], code, out.getvalue(), err.getvalue())


def run_cli_cases(arg_lists: list[list[str]], env: dict | None = None, cwd: Path | None = None,
                  processes: int = 1, timeout: float = 300) -> list:
    """The first ``processes`` argument lists as real ``python -m medadapt`` processes (:func:`run_cli_processes`:
    the exit code and stderr of the process itself, import-time output included), the rest in this process
    (:func:`run_cli`) while those run. Results in the order given."""
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(max_workers=1) as pool:
        real = pool.submit(run_cli_processes, arg_lists[:processes], env, cwd, timeout)
        here = [run_cli(args, env, cwd) for args in arg_lists[processes:]]
        return [*real.result(), *here]


@pytest.fixture(scope="session")
def tiny_bert_dir(tmp_path_factory) -> Path:
    return build_tiny_bert(tmp_path_factory.mktemp("tiny_bert"))


@pytest.fixture()
def tiny_bert(tiny_bert_dir):
    from sentence_transformers import SentenceTransformer

    return SentenceTransformer(str(tiny_bert_dir), device="cpu")


@pytest.fixture(scope="session")
def tiny_qwen2_dir(tmp_path_factory) -> Path:
    return build_tiny_qwen2(tmp_path_factory.mktemp("tiny_qwen2"))


@pytest.fixture(scope="session")
def tiny_qwen2_right_dir(tmp_path_factory) -> Path:
    return build_tiny_qwen2(tmp_path_factory.mktemp("tiny_qwen2_right"), padding_side="right")


@pytest.fixture()
def tiny_beir_dir(tmp_path) -> Path:
    return build_tiny_beir(tmp_path / "beir")


@pytest.fixture
def _isolated_cache(tmp_path, monkeypatch):
    """``$MEDADAPT_CACHE`` in the test's own folder: nothing cached by another test is found, nothing leaks."""
    monkeypatch.setenv("MEDADAPT_CACHE", str(tmp_path / "cache"))


@pytest.fixture
def _single_thread():
    """Tiny tensors: intra-op threading only adds overhead (and stalls on a busy 2-core box). Use with
    ``pytestmark = pytest.mark.usefixtures("_single_thread")``."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)
