"""Shared fixtures: tiny randomly initialised models built offline, never downloaded.

* ``tiny_bert_dir``: a saved SentenceTransformer (BERT, hidden 32, 2 layers, mean pooling, Normalize)
  with a WordPiece tokenizer trained on the fly with ``tokenizers``.
* ``tiny_bert``: a fresh ``SentenceTransformer`` loaded from that directory (function scope, so tests
  may mutate it).
* ``tiny_beir_dir``: a small BEIR folder whose queries share words with their relevant documents.
"""

from __future__ import annotations

import atexit
import json
import os
import shutil
import tempfile
from pathlib import Path

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

# Tests write only to temporary folders: the sentence-transformers trainer builds `datasets` datasets, whose
# cache would otherwise land in ~/.cache/huggingface/datasets (set before `datasets` is imported; the
# subprocesses the tests start inherit it). The embedding cache is per test (tmp_path) or $MEDADAPT_CACHE.
_TEST_TMP = tempfile.mkdtemp(prefix="medadapt-tests-")
os.environ["HF_DATASETS_CACHE"] = os.path.join(_TEST_TMP, "hf-datasets")
os.environ.setdefault("MEDADAPT_CACHE", os.path.join(_TEST_TMP, "embeddings"))
atexit.register(shutil.rmtree, _TEST_TMP, ignore_errors=True)

TOPICS = [
    ("diabetes", "blood sugar insulin thirst urination glucose"),
    ("asthma", "wheezing inhaler airway breath cough"),
    ("migraine", "headache aura light nausea throbbing"),
    ("eczema", "itchy skin rash dry cream dermatitis"),
    ("hypertension", "blood pressure salt heart stroke kidney"),
    ("influenza", "fever flu vaccine aches virus season"),
    ("anemia", "iron tired pale hemoglobin red cells"),
    ("arthritis", "joint pain stiffness swelling knee morning"),
    ("insomnia", "sleep night awake tired bedtime routine"),
    ("gout", "toe uric acid crystals purine attack"),
    ("pneumonia", "lung infection cough fever antibiotics xray"),
    ("depression", "mood sad interest therapy antidepressant sleep"),
]


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


def corpus_texts() -> list[str]:
    """Texts used both to train the tiny tokenizer and to build the tiny BEIR folder."""
    texts = []
    for name, words in TOPICS:
        texts.append(f"{name} is a condition with {words}. treatment of {name} depends on symptoms.")
        texts.append(f"what are the symptoms of {name}? {words}")
    return texts


def tiny_vocab() -> dict[str, int]:
    """A deterministic WordPiece vocabulary for the tiny test models: special tokens, every word of
    :func:`corpus_texts`, and every letter as a word start and as a ``##`` continuation, so unseen words
    split into letters. (``tokenizers``' WordPieceTrainer breaks frequency ties in hash-map order, which
    changes from one process to the next: the vocabulary, and every tiny model with it, then differed
    between runs.)"""
    import re

    words = sorted({w for t in corpus_texts() for w in re.findall(r"\w+|[^\w\s]", t.lower())})
    letters = sorted({c for w in words for c in w} | set("abcdefghijklmnopqrstuvwxyz"))
    tokens = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *letters, *(f"##{c}" for c in letters),
              *(w for w in words if w not in letters)]
    return {t: i for i, t in enumerate(dict.fromkeys(tokens))}


def build_tiny_bert(path: Path, seed: int = 0) -> Path:
    import torch
    from sentence_transformers import SentenceTransformer
    from sentence_transformers.sentence_transformer.modules import Normalize, Pooling, Transformer
    from tokenizers import Tokenizer, models, normalizers, pre_tokenizers
    from transformers import BertConfig, BertModel, PreTrainedTokenizerFast

    tok = Tokenizer(models.WordPiece(vocab=tiny_vocab(), unk_token="[UNK]"))
    tok.normalizer = normalizers.BertNormalizer(lowercase=True)
    tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    from tokenizers.processors import TemplateProcessing

    tok.post_processor = TemplateProcessing(
        single="[CLS] $A [SEP]",
        pair="[CLS] $A [SEP] $B [SEP]",
        special_tokens=[("[CLS]", tok.token_to_id("[CLS]")), ("[SEP]", tok.token_to_id("[SEP]"))],
    )
    from tokenizers import decoders

    tok.decoder = decoders.WordPiece()
    hf_tok = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        unk_token="[UNK]",
        pad_token="[PAD]",
        cls_token="[CLS]",
        sep_token="[SEP]",
        mask_token="[MASK]",
        model_max_length=64,
    )
    torch.manual_seed(seed)
    config = BertConfig(
        vocab_size=tok.get_vocab_size(),
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=64,
        max_position_embeddings=64,
    )
    hf_dir = path / "hf"
    BertModel(config).save_pretrained(hf_dir)
    hf_tok.save_pretrained(hf_dir)
    transformer = Transformer(str(hf_dir), max_seq_length=64)
    pooling = Pooling(transformer.get_embedding_dimension(), pooling_mode="mean")
    model = SentenceTransformer(modules=[transformer, pooling, Normalize()], device="cpu")
    out = path / "st"
    model.save(str(out))
    return out


@pytest.fixture(scope="session")
def tiny_bert_dir(tmp_path_factory) -> Path:
    return build_tiny_bert(tmp_path_factory.mktemp("tiny_bert"))


@pytest.fixture()
def tiny_bert(tiny_bert_dir):
    from sentence_transformers import SentenceTransformer

    return SentenceTransformer(str(tiny_bert_dir), device="cpu")


def write_beir(root: Path, corpus: dict, queries: dict, qrels: dict[str, dict[str, dict[str, int]]]) -> Path:
    """Write a BEIR folder: corpus.jsonl, queries.jsonl and qrels/<split>.tsv."""
    root.mkdir(parents=True, exist_ok=True)
    with open(root / "corpus.jsonl", "w", encoding="utf-8") as f:
        for did, (title, text) in corpus.items():
            f.write(json.dumps({"_id": did, "title": title, "text": text}) + "\n")
    with open(root / "queries.jsonl", "w", encoding="utf-8") as f:
        for qid, text in queries.items():
            f.write(json.dumps({"_id": qid, "text": text}) + "\n")
    (root / "qrels").mkdir(exist_ok=True)
    for split, rel in qrels.items():
        with open(root / "qrels" / f"{split}.tsv", "w", encoding="utf-8") as f:
            f.write("query-id\tcorpus-id\tscore\n")
            for qid, docs in rel.items():
                for did, score in docs.items():
                    f.write(f"{qid}\t{did}\t{score}\n")
    return root


@pytest.fixture()
def tiny_beir_dir(tmp_path) -> Path:
    return build_tiny_beir(tmp_path / "beir")


def build_tiny_beir(root: Path) -> Path:
    """A small BEIR folder whose queries share words with their relevant documents (train and test)."""
    corpus, queries, test, train = {}, {}, {}, {}
    for i, (name, words) in enumerate(TOPICS):
        corpus[f"d{i}"] = (name, f"{name} is a condition with {words}.")
        queries[f"q{i}"] = f"symptoms of {name}"
        queries[f"t{i}"] = f"treatment {name} {words.split()[0]}"
        test[f"q{i}"] = {f"d{i}": 1}
        train[f"t{i}"] = {f"d{i}": 1}
    test["q0"]["d1"] = 2  # a graded second relevant document
    return write_beir(root, corpus, queries, {"test": test, "train": train})


@pytest.fixture
def _single_thread():
    """Tiny tensors: intra-op threading only adds overhead (and stalls on a busy 2-core box). Use with
    ``pytestmark = pytest.mark.usefixtures("_single_thread")``."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)
