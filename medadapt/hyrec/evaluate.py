"""Evaluate a HyReC model lexical-only, dense-only or hybrid on a BEIR split, every mode from one encoding
pass (the system's scorer behind ``evaluate(model, task)``), and a ``kind: hyrec`` recipe's evaluation
(:func:`evaluate`: metrics named ``<mode>/<metric>``, e.g. ``hybrid/ndcg@10``, as ``eval.expected`` names them).

* **lexical**: exact top-k over a :class:`~medadapt.retrieval.LexicalIndex` of the documents' sparse vectors.
* **dense**: exact search; ``dense_source``: ``model`` (same pass as the lexical side), ``cache`` (the saved
  sentence-transformers side through the EmbeddingCache) or ``states`` (pooled inputs from ``state_cache``,
  frozen dense encoder only).
* **hybrid**: the NM sum ``S_lex + dense_weight * S_den`` (eq. 9, the Retriever's ``sum`` fusion) computed
  exactly for the union of both top-``depth`` lists, or ``fusion="minmax"`` over the two runs.

Also reports sparsity (mean active terms per query / document) as ``q_terms`` / ``d_terms``.
"""

from __future__ import annotations

import weakref
from collections.abc import Iterable
from typing import Literal

import numpy as np

from medadapt.cache import EmbeddingCache
from medadapt.data import load_beir
from medadapt.data.beir import BeirDataset
from medadapt.errors import ConfigError
from medadapt.eval.metrics import evaluate_run, parse_metric
from medadapt.eval.search import exact_search
from medadapt.hyrec.model import HyReCModel, find_branch
from medadapt.hyrec.sections import HyReCEvalSection, HyReCRecipe
from medadapt.models import check_device
from medadapt.retrieval.fusion import fuse_runs, hybrid_topk
from medadapt.retrieval.inverted import to_csr
from medadapt.retrieval.lexical import LexicalIndex

__all__ = ["MODES", "evaluate", "evaluate_hyrec", "evaluate_modes", "tune_dense_weight"]

MODES = ("lexical", "dense", "hybrid")

# the SharedStateCache a model was trained with, for its evaluation (weak keys: it goes with the model)
_STATE_CACHES: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def _load(model_or_dir, device: str | None = None):
    if isinstance(model_or_dir, HyReCModel):
        return model_or_dir
    if find_branch(model_or_dir) is not None:  # a loaded model with a lexical branch
        return HyReCModel(model_or_dir)
    check_device(device)
    if device is None:  # sentence-transformers' choice, as medadapt.load makes it
        import torch

        device = "cuda" if torch.cuda.is_available() else "cpu"
    return HyReCModel.load(model_or_dir, device=device)


def _data(dataset, split):
    return dataset if isinstance(dataset, BeirDataset) else load_beir(dataset, [split])


def _run(qids, doc_ids, scores, idx) -> dict[str, dict[str, float]]:
    return {q: {doc_ids[j]: float(v) for v, j in zip(scores[r], idx[r]) if j >= 0}
            for r, q in enumerate(qids)}


def evaluate_hyrec(model_or_dir, dataset, split: str = "test",
                   mode: Literal["lexical", "dense", "hybrid"] = "hybrid",
                   metrics: Iterable[str] = ("ndcg@10", "recall@100", "mrr@10"), *, cache=None,
                   state_cache=None, dense_source: Literal["model", "cache", "states"] = "model",
                   fusion: Literal["nm", "minmax"] = "nm", depth: int = 100, batch_size: int = 32,
                   show_progress: bool = True, return_runs: bool = False,
                   cached_lexicon: bool = False, dense_weights: Iterable[float] | None = None,
                   device: str | None = None):
    """Metrics of ``mode`` on ``split`` (plus ``q_terms`` / ``d_terms`` when the lexical side is used).

    Args:
        model_or_dir: a :class:`~medadapt.hyrec.model.HyReCModel`, a model with a lexical branch, or a folder.
        dataset: a loaded :class:`~medadapt.data.beir.BeirDataset`, a BEIR folder or a builtin name.
        state_cache: a :class:`~medadapt.hyrec.data.SharedStateCache` (frozen variant) to reuse token states.
        return_runs: also return ``{mode: run}`` for every mode computed.
        cached_lexicon: take the lexicon encoder's states from ``state_cache`` (frozen lexicon encoder only).
        dense_weights: hybrid (``nm``) only: also fuse with each of these ``dense_weight`` values, from the
            same encoding pass, as runs ``hybrid@<w>`` (see :func:`tune_dense_weight`).
        device: where a saved folder is loaded (default: a GPU when there is one, else the CPU); a model
            passed in stays where it is.
    """
    if mode not in MODES:
        raise ConfigError(f"unknown HyReC evaluation mode {mode!r}; valid: {', '.join(MODES)}")
    if fusion not in ("nm", "minmax"):
        raise ConfigError(f"unknown fusion {fusion!r}; valid: nm, minmax")
    model = _load(model_or_dir, device)
    data = _data(dataset, split)
    metrics = list(metrics)
    depth = max([parse_metric(m)[1] for m in metrics] + [depth])
    queries = data.split_queries(split)
    qids, qtexts = list(queries), list(queries.values())
    doc_ids, dtexts = data.doc_ids, data.doc_texts()
    want_lex, want_dense = mode in ("lexical", "hybrid"), mode in ("dense", "hybrid")
    if dense_source not in ("model", "cache", "states"):
        raise ConfigError(f"unknown dense_source {dense_source!r}; valid: model, cache, states")
    if dense_source == "states" and state_cache is None:
        raise ConfigError("dense_source='states' needs a state_cache")
    from_model_dense = want_dense and dense_source in ("model", "states")
    kw = {"batch_size": batch_size, "state_cache": state_cache, "show_progress": show_progress,
          "cached_pooled": dense_source == "states", "cached_lexicon": cached_lexicon}
    d_dense, d_lex = (None, None)
    q_dense, q_lex = (None, None)
    if state_cache is not None:
        for texts, role in ((dtexts, "document"), (qtexts, "query")):
            state_cache.warm(model, texts, role, lexicon=want_lex and cached_lexicon,
                             pooled=from_model_dense and dense_source == "states",
                             show_progress=show_progress)
    if want_lex or from_model_dense:
        d_dense, d_lex = model.encode(dtexts, "document", lexical=want_lex, dense=from_model_dense, **kw)
        q_dense, q_lex = model.encode(qtexts, "query", lexical=want_lex, dense=from_model_dense, **kw)
    if want_dense and dense_source == "cache":
        cache = cache if cache is not None else EmbeddingCache()
        q_dense = cache.encode(model.st, qtexts, role="query", batch_size=batch_size,
                               show_progress=show_progress)
        d_dense = cache.encode(model.st, dtexts, role="document", batch_size=batch_size,
                               show_progress=show_progress)
    runs: dict[str, dict[str, dict[str, float]]] = {}
    extra: dict[str, float] = {}
    if want_lex:
        index = LexicalIndex.from_sparse(d_lex, n_terms=model.n_terms)
        qm = to_csr(q_lex, model.n_terms)
        s, i = index.search(qm, depth)
        runs["lexical"] = _run(qids, doc_ids, s, i)
        extra["q_terms"] = float(np.mean([len(v) for v in q_lex])) if q_lex else 0.0
        extra["d_terms"] = float(np.mean([len(v) for v in d_lex])) if d_lex else 0.0
    if want_dense:
        s, i = exact_search(np.asarray(q_dense, np.float32), np.asarray(d_dense, np.float32), depth)
        runs["dense"] = _run(qids, doc_ids, s, i)
    if mode == "hybrid":
        if fusion == "minmax":
            runs["hybrid"] = fuse_runs([runs["lexical"], runs["dense"]], "minmax", k=depth)
        else:
            pos = {d: k for k, d in enumerate(doc_ids)}
            dm = to_csr(d_lex, model.n_terms).tocsr()
            scored = []  # per query: candidate rows and both exact scores, computed once for every weight
            for r, q in enumerate(qids):
                cand = sorted(set(runs["lexical"][q]) | set(runs["dense"][q]))
                rows = np.fromiter((pos[d] for d in cand), dtype=np.int64, count=len(cand))
                lex = np.asarray((dm[rows] @ qm[r].T).todense()).ravel() if cand else np.zeros(0)
                den = d_dense[rows] @ q_dense[r] if cand else np.zeros(0)
                scored.append((q, rows, lex, den))

            def fused(weight: float) -> dict[str, dict[str, float]]:
                hybrid = {}
                for q, rows, lex, den in scored:
                    if not len(rows):
                        hybrid[q] = {}
                        continue
                    top, total = hybrid_topk(rows, lex, den, weight, depth)
                    hybrid[q] = {doc_ids[t]: float(v) for t, v in zip(top, total)}
                return hybrid

            runs["hybrid"] = fused(model.config.dense_weight)
            for w in dense_weights or ():
                runs[f"hybrid@{float(w):g}"] = fused(float(w))
    result = evaluate_run(data.qrels[split], runs[mode], metrics)
    result.update(extra)
    return (result, runs) if return_runs else result


def tune_dense_weight(model_or_dir, dataset, split: str, weights: Iterable[float], metric: str = "ndcg@10",
                      **kwargs) -> tuple[float, dict[float, float]]:
    """The ``dense_weight`` of ``weights`` with the best hybrid ``metric`` on ``split`` (a held-out split,
    never the test split you report), from one encoding pass; ties go to the weight listed first.
    Returns ``(best, {weight: metric})``. ``kwargs`` go to :func:`evaluate_hyrec`."""
    if kwargs.get("fusion", "nm") != "nm":
        raise ConfigError("dense_weight applies to the nm fusion only")
    weights = [float(w) for w in weights]
    if not weights or any(not np.isfinite(w) or w < 0 for w in weights):
        raise ConfigError(f"dense weights to try must be finite and >= 0, got {weights}")
    data = _data(dataset, split)
    _, runs = evaluate_hyrec(model_or_dir, data, split, "hybrid", [metric], return_runs=True,
                             dense_weights=weights, **kwargs)
    scores = {w: evaluate_run(data.qrels[split], runs[f"hybrid@{w:g}"], [metric])[metric] for w in weights}
    best = max(weights, key=lambda w: (scores[w], -weights.index(w)))
    return best, scores



def evaluate(recipe: HyReCRecipe, model, ctx) -> dict[str, float]:
    """``<mode>/<metric>`` for every mode of ``eval.modes`` on ``eval.data`` (default ``data.path``), split
    ``eval.split``; the per-mode dicts also go to ``ctx.result.details["mode_metrics"]``."""
    ev = recipe.eval
    data = load_beir(ctx.resolve(ev.data or recipe.data.path), [ev.split])
    state_cache = _STATE_CACHES.get(model)
    cached_lexicon = state_cache is not None and not recipe.training.train_lexicon_encoder
    modes = evaluate_modes(model, data, ev, cache=ctx.cache, state_cache=state_cache,
                           show_progress=ctx.show_progress, cached_lexicon=cached_lexicon)
    ctx.result.details["mode_metrics"] = modes
    return {f"{m}/{k}": v for m, vals in modes.items() for k, v in vals.items()}


def evaluate_modes(model, data, ev: HyReCEvalSection, *, cache=None, state_cache=None, show_progress=True,
                   cached_lexicon: bool = False) -> dict[str, dict[str, float]]:
    """Every mode of ``ev.modes`` from one encoding pass (hybrid computes the lexical and dense runs too)."""
    modes = ev.modes
    mode = "hybrid" if "hybrid" in modes or {"lexical", "dense"} <= set(modes) else modes[0]
    res, runs = evaluate_hyrec(model, data, ev.split, mode, ev.metrics, cache=cache, state_cache=state_cache,
                               dense_source=ev.dense_source, fusion=ev.fusion, batch_size=ev.batch_size,
                               show_progress=show_progress, return_runs=True, cached_lexicon=cached_lexicon)
    out = {}
    for m in modes:
        vals = evaluate_run(data.qrels[ev.split], runs[m], ev.metrics)
        if m != "dense" and "q_terms" in res:
            vals.update({"q_terms": res["q_terms"], "d_terms": res["d_terms"]})
        out[m] = vals
    return out
