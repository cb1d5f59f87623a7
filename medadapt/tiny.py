"""Tiny random models and a tiny BEIR set, built offline and deterministically: what the ``*-tiny*`` recipes
and the test suite run on, so a smoke test needs no download and no data of the user's.

Names usable wherever a model or a data folder is expected (built on first use, then reused):

* ``tiny-bert``: a SentenceTransformer (random BERT, hidden 32, 2 layers, mean pooling, ``Normalize``) with a
  fixed WordPiece vocabulary (:func:`tiny_vocab`).
* ``tiny-qwen2``: a Hugging Face folder of a random 3-layer Qwen2 (hidden 48) with a byte-level BPE tokenizer
  whose EOS / pad is ``<|endoftext|>`` (a decoder tower: ``kind: decoder``).
* ``tiny-beir``: a BEIR folder of 12 medical topics whose queries share words with their relevant documents
  (``train`` and ``test`` qrels).

The models are random: they show that a pipeline runs end to end, not what it scores.

A name is built into ``<cache>/tiny/<name>-<key>`` (``<cache>`` is :func:`medadapt.cache.default_cache_dir`,
i.e. ``$MEDADAPT_CACHE``), where ``<key>`` hashes this module's source, :data:`TINY_VERSION` and the versions of
the libraries that write the files, so a changed builder gets a new folder. It is built in a temporary sibling
and renamed into place (several processes may build it at once: the first rename wins, the others reuse that
folder), with a ``SHA256SUMS`` that is checked before every reuse (a damaged folder is rebuilt). Each builder's
bytes are the same in every process (seeded weights, a fixed vocabulary), so the folder does not depend on
who built it.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import uuid
from collections.abc import Callable
from importlib import metadata
from pathlib import Path

from medadapt.cache import default_cache_dir
from medadapt.checksums import ChecksumError, verify_sums, write_sums
from medadapt.errors import MedAdaptError
from medadapt.io import atomic_open, atomic_write_text, clean_leftovers, normalize_modes, swap_in

__all__ = ["TINY_NAMES", "TINY_VERSION", "TOPICS", "build_tiny_beir", "build_tiny_bert", "build_tiny_qwen2",
           "corpus_texts", "tiny_path", "tiny_root", "tiny_vocab", "write_beir"]

#: Bumped when a builder's output changes in a way its source does not show.
TINY_VERSION = 1

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


def corpus_texts() -> list[str]:
    """Texts used both to train the tiny tokenizers and to build the tiny BEIR folder."""
    texts = []
    for name, words in TOPICS:
        texts.append(f"{name} is a condition with {words}. treatment of {name} depends on symptoms.")
        texts.append(f"what are the symptoms of {name}? {words}")
    return texts


def tiny_vocab() -> dict[str, int]:
    """A deterministic WordPiece vocabulary for the tiny BERT: special tokens, every word of
    :func:`corpus_texts`, and every letter as a word start and as a ``##`` continuation, so unseen words
    split into letters. (``tokenizers``' WordPieceTrainer breaks frequency ties in hash-map order, which
    changes from one process to the next: the vocabulary, and every tiny model with it, then differed
    between runs.)"""
    words = sorted({w for t in corpus_texts() for w in re.findall(r"\w+|[^\w\s]", t.lower())})
    letters = sorted({c for w in words for c in w} | set("abcdefghijklmnopqrstuvwxyz"))
    tokens = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *letters, *(f"##{c}" for c in letters),
              *(w for w in words if w not in letters)]
    return {t: i for i, t in enumerate(dict.fromkeys(tokens))}


def build_tiny_bert(path: str | os.PathLike, seed: int = 0) -> Path:
    """Save a random tiny BERT SentenceTransformer under ``path`` (``path/hf``: the Hugging Face model,
    ``path/st``: the SentenceTransformer); returns ``path/st``."""
    import torch
    from sentence_transformers import SentenceTransformer
    from sentence_transformers.sentence_transformer.modules import Normalize, Pooling, Transformer
    from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers
    from tokenizers.processors import TemplateProcessing
    from transformers import BertConfig, BertModel, PreTrainedTokenizerFast

    path = Path(path)
    tok = Tokenizer(models.WordPiece(vocab=tiny_vocab(), unk_token="[UNK]"))
    tok.normalizer = normalizers.BertNormalizer(lowercase=True)
    tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tok.post_processor = TemplateProcessing(
        single="[CLS] $A [SEP]",
        pair="[CLS] $A [SEP] $B [SEP]",
        special_tokens=[("[CLS]", tok.token_to_id("[CLS]")), ("[SEP]", tok.token_to_id("[SEP]"))],
    )
    tok.decoder = decoders.WordPiece()
    hf_tok = PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="[UNK]", pad_token="[PAD]", cls_token="[CLS]",
                                     sep_token="[SEP]", mask_token="[MASK]", model_max_length=64)
    torch.manual_seed(seed)
    config = BertConfig(vocab_size=tok.get_vocab_size(), hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                        intermediate_size=64, max_position_embeddings=64)
    hf_dir = path / "hf"
    BertModel(config).save_pretrained(hf_dir)
    hf_tok.save_pretrained(hf_dir)
    transformer = Transformer(str(hf_dir), max_seq_length=64)
    pooling = Pooling(transformer.get_embedding_dimension(), pooling_mode="mean")
    model = SentenceTransformer(modules=[transformer, pooling, Normalize()], device="cpu")
    out = path / "st"
    model.save(str(out))
    return out


def build_tiny_qwen2(path: str | os.PathLike, seed: int = 0, padding_side: str = "left") -> Path:
    """Save a random 3-layer Qwen2 (hidden 48) with a byte-level BPE tokenizer (300 tokens, trained on
    :func:`corpus_texts`) whose EOS / pad is ``<|endoftext|>`` to ``path/qwen2``; returns that folder."""
    import torch
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast, Qwen2Config, Qwen2Model

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=300, special_tokens=["<|endoftext|>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(corpus_texts() * 3, trainer)
    hf_tok = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|endoftext|>", pad_token="<|endoftext|>",
                                     model_max_length=64, padding_side=padding_side)
    torch.manual_seed(seed)
    config = Qwen2Config(vocab_size=tok.get_vocab_size(), hidden_size=48, intermediate_size=64, num_hidden_layers=3,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128)
    out = Path(path) / "qwen2"
    Qwen2Model(config).save_pretrained(out)
    hf_tok.save_pretrained(out)
    return out


def write_beir(root: str | os.PathLike, corpus: dict, queries: dict,
               qrels: dict[str, dict[str, dict[str, int]]]) -> Path:
    """Write a BEIR folder: ``corpus.jsonl`` (``{id: (title, text)}``), ``queries.jsonl`` and
    ``qrels/<split>.tsv``; returns ``root``."""
    root = Path(root)
    (root / "qrels").mkdir(parents=True, exist_ok=True)
    with atomic_open(root / "corpus.jsonl") as f:
        for did, (title, text) in corpus.items():
            f.write(json.dumps({"_id": did, "title": title, "text": text}) + "\n")
    with atomic_open(root / "queries.jsonl") as f:
        for qid, text in queries.items():
            f.write(json.dumps({"_id": qid, "text": text}) + "\n")
    for split, rel in qrels.items():
        with atomic_open(root / "qrels" / f"{split}.tsv") as f:
            f.write("query-id\tcorpus-id\tscore\n")
            for qid, docs in rel.items():
                for did, score in docs.items():
                    f.write(f"{qid}\t{did}\t{score}\n")
    return root


def build_tiny_beir(root: str | os.PathLike) -> Path:
    """A small BEIR folder whose queries share words with their relevant documents: 12 documents, 12
    ``test`` queries (``q0`` has a graded second relevant document) and 12 ``train`` queries."""
    corpus, queries, test, train = {}, {}, {}, {}
    for i, (name, words) in enumerate(TOPICS):
        corpus[f"d{i}"] = (name, f"{name} is a condition with {words}.")
        queries[f"q{i}"] = f"symptoms of {name}"
        queries[f"t{i}"] = f"treatment {name} {words.split()[0]}"
        test[f"q{i}"] = {f"d{i}": 1}
        train[f"t{i}"] = {f"d{i}": 1}
    test["q0"]["d1"] = 2  # a graded second relevant document
    return write_beir(root, corpus, queries, {"test": test, "train": train})


#: name -> (builder writing under a fresh folder and returning the folder to use, libraries its bytes depend on)
TINY_NAMES: dict[str, tuple[Callable[[Path], Path], tuple[str, ...]]] = {
    "tiny-bert": (build_tiny_bert, ("torch", "transformers", "tokenizers", "sentence-transformers", "safetensors")),
    "tiny-qwen2": (build_tiny_qwen2, ("torch", "transformers", "tokenizers", "safetensors")),
    "tiny-beir": (lambda path: build_tiny_beir(path / "beir"), ()),
}


def tiny_root() -> Path:
    """Where built tiny names are kept: ``<embedding cache dir>/tiny``."""
    return default_cache_dir() / "tiny"


def _key(name: str, libraries: tuple[str, ...]) -> str:
    """What the bytes of ``name`` depend on: this module's source, :data:`TINY_VERSION`, library versions."""
    h = hashlib.sha256(Path(__file__).read_bytes())
    versions = {}
    for lib in libraries:
        try:
            versions[lib] = metadata.version(lib)
        except metadata.PackageNotFoundError:
            versions[lib] = None
    h.update(json.dumps([name, TINY_VERSION, versions], sort_keys=True).encode())
    return h.hexdigest()[:16]


def _verified(final: Path) -> Path:
    """The folder to use inside a built ``final``, after its ``SHA256SUMS`` is checked (:class:`ChecksumError`)."""
    verify_sums(final, cover=["PATH"], complete=True)
    return final / (final / "PATH").read_text(encoding="utf-8").strip()


def tiny_path(name: str, root: str | os.PathLike | None = None) -> Path:
    """The folder of the tiny model or data set ``name`` (see the module docstring), built on first use.

    Args:
        root: where built names are kept (default :func:`tiny_root`).

    Raises:
        MedAdaptError: an unknown name, or the folder cannot be built (one line naming what it needs).
    """
    if name not in TINY_NAMES:
        raise MedAdaptError(f"unknown tiny name {name!r} (known: {', '.join(sorted(TINY_NAMES))})")
    builder, libraries = TINY_NAMES[name]
    root = Path(root) if root is not None else tiny_root()
    final = root / f"{name}-{_key(name, libraries)}"
    damaged = False
    if final.is_dir():
        try:
            return _verified(final)
        except ChecksumError:  # damaged (an edit, a half-deleted folder): build again and swap it out
            damaged = True
    tmp = root / f".{final.name}.tmp-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    try:
        root.mkdir(parents=True, exist_ok=True)
        clean_leftovers(final, own=False)  # what a killed builder left (other threads may be building)
        tmp.mkdir()
        out = builder(tmp)
        atomic_write_text(tmp / "PATH", out.relative_to(tmp).as_posix() + "\n")  # the folder to use in ``final``
        normalize_modes(tmp)  # safetensors writes 0600 files; a shared cache is readable like any output
        write_sums(tmp)
        if damaged:
            swap_in(tmp, final)
        else:
            try:
                os.rename(tmp, final)  # atomic; fails if another process renamed its build there first
            except OSError:
                if not final.is_dir():
                    raise
                shutil.rmtree(tmp, ignore_errors=True)  # theirs has the same bytes (deterministic builders)
    except OSError as exc:
        shutil.rmtree(tmp, ignore_errors=True)
        raise MedAdaptError(f"cannot build {name} in {root}: {exc.strerror or exc} (set MEDADAPT_CACHE to a "
                            "writable folder)") from None
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return _verified(final)
