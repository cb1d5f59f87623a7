"""What ``medadapt data`` runs (its options: :mod:`medadapt.cli.data`): training-data curation (mine, filter,
dedup, label, sts-triplets). Every command checks its inputs before loading a model, writes its output
atomically and reports a user error as one line."""

from __future__ import annotations

import functools
import importlib
import re
from pathlib import Path

from pydantic import ValidationError

from medadapt.cache import EmbeddingCache
from medadapt.cli._common import console, fail, quiet_libraries
from medadapt.curation import (
    BM25Searcher,
    DedupConfig,
    DenseSearcher,
    MiningConfig,
    MiningReport,
    OpenAIChat,
    PromptGenerator,
    PromptJudge,
    StsReport,
    build_sts_triplets,
    diversity_dedup,
    filter_consistent_groups,
    get_rubric,
    label_pairs,
    load_synonyms,
    mine_hard_negatives,
    to_sts_pairs,
    write_jsonl,
    write_training_groups,
)
from medadapt.data import load_beir, load_corpus, load_training_groups, resolve_data_dir
from medadapt.data.jsonl import field as get_field
from medadapt.data.jsonl import iter_jsonl, iter_lines
from medadapt.errors import ConfigError, DataError, MedAdaptError
from medadapt.io import atomic_write_json, check_output, check_outputs
from medadapt.models import load
from medadapt.retrieval.tokenize import detect_language


def _message(exc: Exception) -> str:
    """One line for a user error (pydantic errors shortened to their first problem)."""
    if isinstance(exc, ValidationError):
        err = exc.errors()[0]
        loc = ".".join(str(x) for x in err.get("loc", ())) or "config"
        return f"invalid {loc}: {err.get('msg', exc)}".replace("Value error, ", "")
    return " ".join(str(exc).split())


def _guarded(command):
    """Run a data command's body so that a user error (a bad value, a pydantic error included) or Ctrl-C is
    one ``error:`` line."""

    @functools.wraps(command)
    def run(*args, **kwargs) -> None:
        quiet_libraries()
        try:
            try:
                command(*args, **kwargs)
            except (MedAdaptError, ValueError, ValidationError) as exc:
                fail(_message(exc))
        except KeyboardInterrupt:
            fail("interrupted")

    return run


def _searcher(retriever, ids: list[str], texts: list[str], model: str, device, cache_dir, language,
              quiet: bool):
    if retriever.value == "bm25":
        lang = detect_language(texts) if language.value == "auto" else language.value
        return BM25Searcher(ids, texts, language=lang)

    return DenseSearcher(load(model, device=device), ids, texts, cache=EmbeddingCache(cache_dir),
                         show_progress=not quiet)


def _parse_window(window: str) -> tuple[int, int]:
    m = re.fullmatch(r"\s*(\d+)\s*[-,:]\s*(\d+)\s*", window)
    if not m:
        raise ConfigError(f"--window must look like 20-100, got {window!r}")
    return int(m.group(1)), int(m.group(2))


def _import_object(spec: str, what: str):
    """``package.module:attr`` -> the object (a class is instantiated without arguments)."""
    module_name, _, attr = spec.partition(":")
    if not module_name or not attr:
        raise ConfigError(f"{what} {spec!r} must be 'openai:MODEL@BASE_URL' or 'package.module:object'")
    try:
        obj = getattr(importlib.import_module(module_name), attr)
    except (ImportError, AttributeError) as exc:
        raise ConfigError(f"cannot import {what} {spec!r}: {exc}") from None
    if isinstance(obj, type):
        obj = obj()
    return obj


def _llm(spec: str, what: str, over_chat, api_key_env: str, allow_insecure_http: bool):
    """A ``judge`` / ``generator``: ``openai:MODEL[@BASE_URL]`` (``over_chat`` of an OpenAI-compatible chat
    endpoint) or ``package.module:object``, which must be callable."""
    if spec.startswith("openai:"):
        model, _, base_url = spec[len("openai:"):].partition("@")
        if not model:
            raise ConfigError(f"{spec!r}: expected openai:MODEL or openai:MODEL@BASE_URL")
        return over_chat(OpenAIChat(model, base_url or "https://api.openai.com/v1", api_key_env=api_key_env,
                                    allow_insecure_http=allow_insecure_http))
    obj = _import_object(spec, what)
    if not callable(obj):
        raise ConfigError(f"{what} {spec!r} is not callable")
    return obj


def _texts_from_jsonl(path: Path, field: str, join_title: bool) -> tuple[list[dict], list[str]]:
    rows, texts = [], []
    for lineno, obj in iter_jsonl(path, "input file"):
        text = get_field(obj, field, str, path, lineno)
        title = obj.get("title") if join_title else None
        texts.append(f"{title} {text}".strip() if isinstance(title, str) and title else text)
        rows.append(obj)
    if not rows:
        raise DataError(f"{path}: no lines")
    return rows, texts


# --------------------------------------------------------------------------------------------- mine
@_guarded
def run_mine(output, data, split, retriever, model, language, preset, window, num_negatives, margin,
             absolute_margin, text_dup_threshold, seed, no_scores, keep_empty, batch_size, device, cache_dir,
             quiet, verbose) -> None:
    """``medadapt data mine``."""
    check_output(output, what="--output")
    overrides: dict = {"margin": margin, "absolute_margin": absolute_margin, "seed": seed,
                       "with_scores": not no_scores, "drop_empty": not keep_empty,
                       "text_dup_threshold": text_dup_threshold or None}
    if window is not None:
        overrides["window"] = _parse_window(window)
    if num_negatives is not None:
        overrides["num_negatives"] = num_negatives
    config = MiningConfig.preset(preset, **overrides) if preset else MiningConfig(**overrides)
    dataset = load_beir(data, [split])
    searcher = _searcher(retriever, dataset.doc_ids, dataset.doc_texts(), model, device, cache_dir,
                         language, quiet)
    report = MiningReport()
    groups = mine_hard_negatives(dataset, split, searcher, config, batch_size=batch_size,
                                 show_progress=not quiet, report=report)
    n = write_training_groups(output, groups)
    console.print(_report_line(report.to_dict()))
    console.print(f"wrote {n} training groups to {output}")


def _report_line(d: dict) -> str:
    return ", ".join(f"{k.replace('_', ' ')}: {v}" for k, v in d.items())


# --------------------------------------------------------------------------------------------- filter
@_guarded
def run_filter(input, output, corpus, retriever, model, language, top_k, mode, batch_size, device, cache_dir,
               quiet, verbose) -> None:
    """``medadapt data filter``."""
    check_output(output, what="--output")
    groups = load_training_groups(input)
    texts: dict[str, str] = {}  # text -> id
    if corpus:
        path = Path(corpus)
        docs = load_corpus(path if path.is_file() else resolve_data_dir(corpus) / "corpus.jsonl")
        for did, doc in docs.items():
            text = f"{doc['title']} {doc['text']}".strip() if doc["title"] else doc["text"]
            texts.setdefault(text, did)
    for g in groups:
        for p in g.pos:
            texts.setdefault(p, f"synthetic-{len(texts)}")
    ids, doc_texts = list(texts.values()), list(texts)
    searcher = _searcher(retriever, ids, doc_texts, model, device, cache_dir, language, quiet)
    kept = filter_consistent_groups(groups, searcher, texts, top_k, mode.value, batch_size=batch_size,
                                    show_progress=not quiet)
    n = write_training_groups(output, kept)
    console.print(f"kept {n} of {len(groups)} groups (top-{top_k}, {retriever.value}); wrote {output}")


# --------------------------------------------------------------------------------------------- dedup
@_guarded
def run_dedup(input, output, kind, field, model, k, threshold, max_neighbors, seed_size, batch_size, index,
              discarded, report, device, cache_dir, quiet, verbose) -> None:
    """``medadapt data dedup``."""
    check_outputs({"--output": output, "--discarded": discarded, "--report": report})
    make = DedupConfig.for_queries if kind.value == "query" else DedupConfig.for_documents
    overrides = {"k": k, "max_neighbors": max_neighbors, "seed_size": seed_size, "batch_size": batch_size,
                 "index": index}
    if threshold is not None:
        overrides["threshold"] = threshold
    config = make(**overrides)
    rows, texts = _texts_from_jsonl(input, field, join_title=kind.value == "document")
    st = load(model, device=device)
    emb = EmbeddingCache(cache_dir).encode(st, texts, role=kind.value, show_progress=not quiet,
                                           desc=f"encoding {kind.value}s")
    res = diversity_dedup(emb, config, show_progress=not quiet)
    write_jsonl(output, (r for r, keep in zip(rows, res.kept) if keep))
    if discarded:
        write_jsonl(discarded, (r for r, keep in zip(rows, res.kept) if not keep))
    summary = {**res.summary(), "k": config.k, "threshold": config.threshold,
               "max_neighbors": config.max_neighbors}
    if report:
        atomic_write_json(report, summary)
    console.print(f"kept {res.n_kept} of {len(rows)} ({res.n_discarded} discarded; seed {res.seed_size}, "
                  f"k={config.k}, τ={config.threshold}, m={config.max_neighbors}); wrote {output}")


# --------------------------------------------------------------------------------------------- label
def _load_label_items(path: Path) -> list[tuple[str, list[str]]]:
    items = []
    for lineno, obj in iter_jsonl(path, "input file"):
        query = get_field(obj, "query", str, path, lineno)
        if "passages" in obj:
            passages = get_field(obj, "passages", list, path, lineno)
        elif "pos" in obj or "neg" in obj:
            passages = (get_field(obj, "pos", list, path, lineno, required=False) or []) + (
                get_field(obj, "neg", list, path, lineno, required=False) or [])
        else:
            raise DataError(f"{path}:{lineno}: expected 'passages' or FlagEmbedding 'pos'/'neg' fields")
        if not passages or any(not isinstance(p, str) for p in passages):
            raise DataError(f"{path}:{lineno}: passages must be a non-empty list of strings")
        items.append((query, passages))
    if not items:
        raise DataError(f"{path}: no items")
    return items


@_guarded
def run_label(input, output, judge, rubric, policy, agreement_on, positive_grades, fmt, api_key_env,
              allow_insecure_http, report, quiet, verbose) -> None:
    """``medadapt data label``."""
    check_outputs({"--output": output, "--report": report})
    rub = get_rubric(rubric)
    if positive_grades:
        rub = rub.with_positive(g.strip().upper() for g in positive_grades.split(",") if g.strip())
    if len(judge) < 2:
        raise ConfigError("give at least two --judge options")
    items = _load_label_items(input)
    judges = [_llm(spec, "judge", lambda chat: PromptJudge(chat, rub), api_key_env, allow_insecure_http)
              for spec in judge]
    result = label_pairs(items, judges, rub, policy.value, agreement_on.value, show_progress=not quiet)
    if fmt.value == "pairs":
        n = write_jsonl(output, (p.to_dict() for p in result.kept))
    else:
        n = write_training_groups(output, result.to_training_groups())
    summary = result.summary()
    if report:
        atomic_write_json(report, summary)
    console.print(f"kept {summary['kept']} of {summary['pairs']} pairs ({summary['positives']} positive, "
                  f"{summary['negatives']} negative; {policy.value} on {agreement_on.value}s); "
                  f"Fleiss' kappa labels {summary['fleiss_kappa_labels']:.3f}, "
                  f"grades {summary['fleiss_kappa_grades']:.3f}")
    console.print(f"wrote {n} lines to {output}")


# --------------------------------------------------------------------------------------------- sts
def _load_sentences(path: Path) -> list[str]:
    if path.suffix == ".jsonl":
        _, texts = _texts_from_jsonl(path, "text", join_title=False)
        return texts
    if not path.is_file():
        raise DataError(f"sentences file not found: {path}")

    lines = [ln.strip() for _, ln in iter_lines(path, "sentences file") if ln.strip()]
    if not lines:
        raise DataError(f"{path}: no sentences")
    return lines


@_guarded
def run_sts(synonyms, sentences, generator, output, per_pair, symmetric, fmt, seed, api_key_env,
            allow_insecure_http, quiet, verbose) -> None:
    """``medadapt data sts-triplets``."""
    check_output(output, what="--output")
    syn = load_synonyms(synonyms)
    sents = _load_sentences(sentences)
    gen = _llm(generator, "generator", PromptGenerator, api_key_env, allow_insecure_http)
    rep = StsReport()
    triplets = build_sts_triplets(syn, sents, gen, per_pair=per_pair, symmetric=symmetric, seed=seed,
                                  show_progress=not quiet, report=rep)
    rows = [t.to_dict() for t in triplets] if fmt.value == "triplets" else to_sts_pairs(triplets)
    n = write_jsonl(output, rows)
    console.print(_report_line(rep.to_dict()))
    console.print(f"wrote {n} lines to {output}")
