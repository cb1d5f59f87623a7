"""Tiny random models and a tiny BEIR set, built offline and deterministically, for the ``*-tiny*`` recipes
and the tests: ``tiny-bert`` (random BERT SentenceTransformer, hidden 32), ``tiny-qwen2`` (random 3-layer
Qwen2 with a byte-level BPE tokenizer, a decoder tower) and ``tiny-beir`` (12 medical topics). Random: they
show that a pipeline runs, not what it scores.

A name is built into ``<cache>/tiny/<name>-<key>`` (``<key>``: this module's source, :data:`TINY_VERSION`,
the writing libraries' versions) in a temporary sibling renamed into place (the first rename wins), with a
``SHA256SUMS`` checked before every reuse (a damaged folder is rebuilt).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
from collections.abc import Callable
from importlib import metadata
from pathlib import Path

from medadapt.cache import default_cache_dir
from medadapt.checksums import ChecksumError, verify_sums, write_sums
from medadapt.errors import MedAdaptError
from medadapt.io import atomic_open, atomic_write_text, clean_leftovers, normalize_modes, swap_in, temp_name

__all__ = ["TINY_NAMES", "TINY_VERSION", "TOPICS", "build_tiny_beir", "build_tiny_bert", "build_tiny_qwen2",
           "corpus_texts", "tiny_path", "tiny_root", "tiny_vocab", "write_beir", "write_qrels"]

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
    """A deterministic WordPiece vocabulary: special tokens, every word of :func:`corpus_texts`, and every
    letter as a start and a ``##`` continuation (``tokenizers``' trainer breaks ties in hash-map order)."""
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
        write_qrels(root / "qrels" / f"{split}.tsv", rel)
    return root


def write_qrels(path: Path, qrels: dict[str, dict[str, int]]) -> None:
    """A BEIR qrels TSV (with header), atomically."""
    with atomic_open(path) as f:
        f.write("query-id\tcorpus-id\tscore\n")
        for qid, docs in qrels.items():
            for did, score in docs.items():
                f.write(f"{qid}\t{did}\t{score}\n")


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
    """The folder of the tiny model or data set ``name``, built on first use under ``root`` (default
    :func:`tiny_root`); an unknown name or a failed build is one :class:`MedAdaptError`."""
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
    tmp = temp_name(final)
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
