"""Late-interaction (ColBERT-style MaxSim) re-ranking over a model's own token embeddings, with no training.

A first stage (dense, lexical, hybrid, an index) ranks the corpus; :class:`MaxSimReranker` takes each query's top
``depth`` candidates, scores them with MaxSim over the *frozen* model's token vectors (``encode(...,
output_value="token_embeddings")`` of the model's backbone; a ``Router`` model's query route for queries and its
document route for documents) and fuses both scores per query::

    maxsim(q, d) = mean over query tokens i of  max over document tokens j of  cos(q_i, d_j)
    fused        = (1 - weight) * norm(first-stage scores) + weight * norm(maxsim scores)

``norm`` is a z-score over the query's candidates, ``(x - mean) / (std + 1e-9)``, or min-max, ``(x - min) / (max -
min + 1e-9)``. ``weight`` 0 keeps the first-stage order (nothing is encoded); 1 orders by MaxSim alone (ties by the
first stage). With ``domain_weights`` (a weight per domain of a model trained with domain routing) each query
gets its own weight ``w_q = sum_k p_k(q) * domain_weights[k]``, ``p`` from the model's own domain classifier
(:class:`DomainClassifier`) on the query's frozen pooled embedding; a query with ``w_q = 0`` keeps its
first-stage order and encodes nothing. The maths is that of ``benchmarks/late_interaction.py`` (numbers: docs/benchmarks.md, "Late
interaction over the frozen model's token vectors"): token vectors stored as float16, each token L2-normalised
before scoring, ``special_tokens=False`` drops the first and last token ([CLS] / [SEP]) of texts longer than two.

Token vectors live in the one :class:`~medadapt.cache.EmbeddingCache`, in a namespace of
:meth:`~medadapt.cache.EmbeddingCache.token_states_folder` keyed by the backbone's weights fingerprint, the role,
the prompt, the token limit and the stored dtype; entries are keyed by the text's hash. Shards are written
atomically with the SHA-256 of their tensors, verified when read; a shard that fails (unreadable, checksum,
shape, non-finite values) is moved aside as ``corrupt-<name>`` with a
:class:`~medadapt.cache.CacheCorruptionWarning` and its texts are encoded again. Only the texts asked for (the
candidates) are encoded, once.

Written here by hand rather than through PyLate (the sentence-transformers ColBERT library): its releases pin
``sentence-transformers==5.3.0`` and ``transformers<=5.3``, while medadapt needs sentence-transformers 6.
"""

from __future__ import annotations

import hashlib
import os
import threading
import uuid
import warnings
import weakref
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Annotated, Any, Literal, Protocol

import numpy as np
from pydantic import Field, ValidationError, model_validator

from medadapt.cache import (
    CacheCorruptionWarning,
    EmbeddingCache,
    Role,
    backbone_view,
    clip_text,
    effective_prompt,
    namespace_lock,
    split_backbone,
    text_hash,
)
from medadapt.config import Section
from medadapt.errors import ConfigError, MedAdaptError
from medadapt.identity import weights_version
from medadapt.io import atomic_open
from medadapt.locks import model_lock
from medadapt.progress import progress

__all__ = ["DomainClassifier", "MaxSimConfig", "MaxSimReranker", "TokenVectorCache", "domain_classifier",
           "fuse_candidates", "maxsim", "maxsim_scores", "normalize_scores", "trim_special"]

Normalization = Literal["zscore", "minmax"]
TOKEN_FORMAT = 1
STORED_DTYPE = "float16"
_EPS = 1e-9


class MaxSimConfig(Section):
    """How :class:`MaxSimReranker` re-ranks.

    Attributes:
        weight: MaxSim's share of the fused score, in [0, 1] (0: the first-stage order; 1: MaxSim alone).
        depth: the first stage's top documents re-ranked per query (the rest keep their order below them).
        normalization: ``zscore`` or ``minmax``, per query over its candidates.
        special_tokens: keep [CLS] / [SEP] (the first and last token); ``False`` drops them from texts of more
            than two tokens.
        batch_size: texts per encode batch.
        domain_weights: a weight per domain (each in [0, 1]) instead of the one ``weight``: each query's weight
            is ``sum_k p_k * domain_weights[k]``, ``p`` from the model's domain classifier
            (:func:`domain_classifier`); the names must be exactly the model's domains. Not with ``weight``.
    """

    weight: float = Field(0.7, ge=0, le=1)
    depth: int = Field(100, ge=1)
    normalization: Normalization = "zscore"
    special_tokens: bool = True
    batch_size: int = Field(32, ge=1)
    domain_weights: dict[str, Annotated[float, Field(ge=0, le=1)]] | None = None

    @model_validator(mode="after")
    def _one_weight(self) -> MaxSimConfig:
        if self.domain_weights is not None:
            if not self.domain_weights:
                raise ValueError("domain_weights names no domain")
            if "weight" in self.model_fields_set:
                raise ValueError("give weight or domain_weights, not both")
        return self

    @classmethod
    def of(cls, **options: Any) -> MaxSimConfig:
        """The config of ``options``; a bad value is one :class:`ConfigError` naming it."""
        try:
            return cls(**options)
        except ValidationError as exc:
            parts = [f"{'.'.join(map(str, e['loc'])) or 'config'}: {e['msg']}" for e in exc.errors()]
            raise ConfigError(f"maxsim re-ranking: {'; '.join(parts)}") from None

    def build(self, model, *, cache: EmbeddingCache | None = None, show_progress: bool = False) -> MaxSimReranker:
        """A :class:`MaxSimReranker` of ``model`` with this config (what evaluation calls)."""
        return MaxSimReranker(model, self, cache=cache, show_progress=show_progress)


# ------------------------------------------------------------------------------------------ domain classifier
class DomainClassifier(Protocol):
    """What a module of a model trained with domain routing exposes (found by :func:`domain_classifier`):
    its domains' names, and the probabilities (rows, domains; rows sum to 1) of raw frozen pooled embeddings
    (rows, dim) -- the backbone's pooled sentence embedding, before any head and ``Normalize``."""

    domain_names: Sequence[str]

    def domain_probabilities(self, pooled): ...


def domain_classifier(model) -> DomainClassifier | None:
    """The first module of ``model`` (in module order, submodules included) with a non-empty ``domain_names``
    and a callable ``domain_probabilities``; ``None`` when it has none."""
    modules = model.modules() if callable(getattr(model, "modules", None)) else ()
    for module in modules:
        names = getattr(module, "domain_names", None)
        if (names and not isinstance(names, str) and all(isinstance(n, str) for n in names)
                and callable(getattr(module, "domain_probabilities", None))):
            return module
    return None


# --------------------------------------------------------------------------------------------------- the maths
def trim_special(tokens: np.ndarray, special_tokens: bool) -> np.ndarray:
    """``tokens`` without its first and last row when ``special_tokens`` is false and it has more than two."""
    if not special_tokens and len(tokens) > 2:
        return tokens[1:-1]
    return tokens


def _unit(x):
    import torch

    return torch.nn.functional.normalize(x, dim=-1)


def maxsim_scores(query: np.ndarray, docs: Sequence[np.ndarray]) -> np.ndarray:
    """MaxSim of one query's token vectors ``[m, dim]`` against each document's ``[n_i, dim]``: the mean over
    query tokens of the max cosine over the document's tokens (every token L2-normalised first)."""
    import torch

    if not len(docs):
        return np.zeros(0, np.float32)
    if len(query) == 0 or any(len(d) == 0 for d in docs):
        raise MedAdaptError("MaxSim needs at least one token per text")
    with torch.no_grad():
        q = _unit(torch.from_numpy(np.asarray(query, np.float32)))
        lengths = [len(d) for d in docs]
        d = _unit(torch.from_numpy(np.concatenate([np.asarray(x, np.float32) for x in docs])))
        total, width = sum(lengths), max(lengths)
        index = torch.full((len(docs), width), total, dtype=torch.long)  # padding points at a -inf column
        start = 0
        for i, n in enumerate(lengths):
            index[i, :n] = torch.arange(start, start + n)
            start += n
        sims = torch.cat([q @ d.T, torch.full((len(q), 1), float("-inf"))], 1)
        return sims[:, index].amax(-1).mean(0).numpy().astype(np.float32)


def maxsim(query: np.ndarray, doc: np.ndarray) -> float:
    """MaxSim of one query against one document (:func:`maxsim_scores`)."""
    return float(maxsim_scores(query, [doc])[0])


def normalize_scores(x: np.ndarray, method: str) -> np.ndarray:
    """``zscore``: ``(x - mean) / (std + 1e-9)`` (population std); ``minmax``: ``(x - min) / (max - min + 1e-9)``."""
    x = np.asarray(x, np.float64)
    if method == "zscore":
        return (x - x.mean()) / (x.std() + _EPS)
    if method == "minmax":
        return (x - x.min()) / (x.max() - x.min() + _EPS)
    raise ConfigError(f"unknown normalization {method!r} (valid: zscore, minmax)")


def fuse_candidates(first: np.ndarray, late: np.ndarray, weight: float, method: str) -> tuple[np.ndarray, np.ndarray]:
    """``(order, fused)``: the candidates (given in first-stage order) sorted by ``(1 - weight) * norm(first) +
    weight * norm(late)``, best first, ties kept in first-stage order; ``fused`` in that order."""
    fused = (1 - weight) * normalize_scores(first, method)
    if weight:
        fused = fused + weight * normalize_scores(late, method)
    order = np.argsort(-fused, kind="stable")
    return order, fused[order]


# ----------------------------------------------------------------------------------------- token vector cache
def _digest(hashes: np.ndarray, offsets: np.ndarray, tokens: np.ndarray) -> str:
    h = hashlib.sha256()
    for a in (hashes, offsets, tokens):
        a = np.ascontiguousarray(a)
        h.update(f"{a.dtype}{list(a.shape)}".encode())
        h.update(memoryview(a).cast("B"))
    return h.hexdigest()


def _read_shard(path: Path) -> dict[bytes, np.ndarray]:
    """``{text hash: float16 tokens}`` of a shard, verified; a ``ValueError`` says why it cannot be used."""
    from safetensors import safe_open

    try:
        with safe_open(str(path), framework="numpy") as f:
            meta = f.metadata() or {}
            hashes, offsets, tokens = (f.get_tensor(k) for k in ("hashes", "offsets", "tokens"))
    except Exception as exc:  # noqa: BLE001 - truncated / not safetensors / missing tensors
        raise ValueError(f"unreadable ({type(exc).__name__}: {exc})") from None
    if meta.get("format") != str(TOKEN_FORMAT) or "sha256" not in meta:
        raise ValueError("no checksum metadata")
    if meta["sha256"] != _digest(hashes, offsets, tokens):
        raise ValueError("checksum differs")
    n = len(hashes)
    if (hashes.dtype != np.uint8 or hashes.shape[1:] != (16,) or tokens.dtype != np.float16 or tokens.ndim != 2
            or offsets.shape != (n + 1,) or offsets[0] != 0 or offsets[-1] != len(tokens)
            or (np.diff(offsets) < 1).any()):
        raise ValueError("inconsistent shapes")
    if not np.isfinite(tokens).all():
        raise ValueError("non-finite values")
    return {bytes(hashes[i]): tokens[offsets[i]:offsets[i + 1]] for i in range(n)}


class TokenVectorCache:
    """Per-token float16 vectors of texts for one model role, on disk in the :class:`EmbeddingCache` and in memory.

    ``vectors(model, texts, role)`` returns one ``[n_tokens, dim]`` float16 array per text, encoding (in chunks,
    longest first, with a progress bar) only the texts not stored yet. ``encode_calls`` counts the model's encode
    calls (a warm cache makes none)."""

    def __init__(self, cache: EmbeddingCache | None = None, *, batch_size: int = 32, show_progress: bool = False):
        self.cache = cache if cache is not None else EmbeddingCache()
        self.batch_size = batch_size
        self.show_progress = show_progress
        self.encode_calls = 0
        self._mem: dict[Path, dict[bytes, np.ndarray]] = {}
        self._read: dict[Path, set[str]] = {}  # shard names read (or set aside) per namespace
        self._fp: dict[tuple[int, str], tuple[Any, tuple | None, str]] = {}
        self._lock = threading.RLock()

    # -- keys
    def _encoder(self, model, role: Role):
        """(encoder whose backbone gives the token vectors, its fingerprint), memoised while weights are unchanged."""
        encoder = EmbeddingCache.encoder_for(model, role)
        key, versions = (id(model), role), weights_version([encoder], norms=False)
        hit = self._fp.get(key)
        if hit is not None and versions is not None and hit[0]() is model and hit[1] == versions:
            return encoder, hit[2]
        try:
            fingerprint = self.cache.fingerprint(encoder)
        except (AttributeError, TypeError, ValueError) as exc:
            raise MedAdaptError(f"MaxSim re-ranking needs a sentence-transformers model with token embeddings; "
                                f"{type(model).__name__} has none ({exc})") from None
        try:
            self._fp[key] = (weakref.ref(model), versions, fingerprint)
        except TypeError:  # no weak references: hash every time
            pass
        return encoder, fingerprint

    def namespace(self, model, role: Role) -> Path:
        """The namespace folder of ``model``'s token vectors for ``role``."""
        encoder, fingerprint = self._encoder(model, role)
        limit = getattr(encoder, "max_seq_length", None)
        key = {"states": "late-interaction-tokens", "state_format": TOKEN_FORMAT, "model": fingerprint,
               "role": role, "prompt": effective_prompt(model, role),
               "max_seq_length": limit if isinstance(limit, int) else None, "dtype": STORED_DTYPE}
        return self.cache.token_states_folder(key)

    # -- disk
    def _load_new_shards(self, ns: Path) -> None:
        mem, read = self._mem.setdefault(ns, {}), self._read.setdefault(ns, set())
        for shard in sorted(ns.glob("shard-*.safetensors")):
            if shard.name in read:
                continue
            read.add(shard.name)
            try:
                mem.update(_read_shard(shard))
            except ValueError as exc:
                target = shard.with_name(f"corrupt-{shard.name}")
                try:
                    os.replace(shard, target)
                    where = f"moved it to {target.name}"
                except OSError:
                    where = "could not move it aside"
                warnings.warn(f"token vector cache shard {shard} is corrupt ({exc}); {where} and re-encoding its "
                              "texts", CacheCorruptionWarning, stacklevel=4)

    def _write_shard(self, ns: Path, items: list[tuple[bytes, np.ndarray]]) -> None:
        from safetensors.numpy import save

        hashes = np.frombuffer(b"".join(h for h, _ in items), np.uint8).reshape(len(items), 16)
        tokens = np.ascontiguousarray(np.concatenate([t for _, t in items]))
        offsets = np.concatenate([[0], np.cumsum([len(t) for _, t in items])]).astype(np.int64)
        payload = save({"hashes": hashes, "offsets": offsets, "tokens": tokens},
                       metadata={"format": str(TOKEN_FORMAT), "sha256": _digest(hashes, offsets, tokens)})
        name = f"shard-{uuid.uuid4().hex}.safetensors"
        with atomic_open(ns / name, "wb") as f:
            f.write(payload)
        self._read[ns].add(name)

    # -- encoding
    def _encode(self, model, role: Role, texts: list[str]) -> list[np.ndarray]:
        encoder, _ = self._encoder(model, role)
        _, tail = split_backbone(encoder)
        runner = backbone_view(encoder) if tail else encoder  # heads act on pooled vectors only
        fn = {"query": runner.encode_query, "document": runner.encode_document, "plain": runner.encode}[role]
        self.encode_calls += 1
        out = fn([clip_text(runner, t) for t in texts], prompt=effective_prompt(model, role),
                 output_value="token_embeddings", batch_size=self.batch_size, show_progress_bar=False,
                 convert_to_numpy=False)
        arrays = []
        for t in out:
            a = (t.detach().float().cpu().numpy() if hasattr(t, "detach") else np.asarray(t, np.float32))
            if a.ndim != 2 or not len(a):
                raise MedAdaptError(f"the model gave token embeddings of shape {list(a.shape)}; MaxSim needs "
                                    "[tokens, dim] per text")
            with np.errstate(over="ignore"):
                half = a.astype(np.float16)
            if not np.isfinite(half).all():
                raise MedAdaptError("the model produced non-finite token embeddings (NaN, inf or beyond float16's "
                                    "range); nothing was cached for them")
            arrays.append(half)
        return arrays

    def vectors(self, model, texts: Sequence[str], role: Role, *, desc: str | None = None) -> list[np.ndarray]:
        """One float16 ``[n_tokens, dim]`` array per text (a text given twice is encoded once)."""
        texts = list(texts)
        if not texts:
            return []
        hashes = [text_hash(t) for t in texts]
        with self._lock, model_lock(model):
            ns = self.namespace(model, role)
            mem = self._mem.setdefault(ns, {})
            if ns not in self._read:  # first use in this object: read (and verify) what is on disk
                self._load_new_shards(ns)
            missing = {h: t for h, t in zip(hashes, texts) if h not in mem}
            if missing:
                with namespace_lock(ns):
                    self._load_new_shards(ns)  # another process may have written them meanwhile
                    todo = sorted(((h, t) for h, t in missing.items() if h not in mem), key=lambda kv: -len(kv[1]))
                    self._fill(model, role, ns, todo, desc)
            return [mem[h] for h in hashes]

    def _fill(self, model, role: Role, ns: Path, todo: list[tuple[bytes, str]], desc: str | None) -> None:
        mem = self._mem[ns]
        chunk_size = self.cache.chunk_size
        bar = progress(total=len(todo), desc=desc or f"token vectors ({role})", unit="text",
                       disable=not self.show_progress or not todo)
        try:
            for start in range(0, len(todo), chunk_size):
                chunk = todo[start:start + chunk_size]
                arrays = self._encode(model, role, [t for _, t in chunk])
                items = [(h, a) for (h, _), a in zip(chunk, arrays)]
                self._write_shard(ns, items)
                mem.update(items)
                bar.update(len(chunk))
        finally:
            bar.close()


# ------------------------------------------------------------------------------------------------ the reranker
class MaxSimReranker:
    """Re-rank a first stage's run with MaxSim over ``model``'s token vectors, fused with its scores.

    Args:
        model: the token model (a SentenceTransformer; queries through ``encode_query``, documents through
            ``encode_document``).
        config: a :class:`MaxSimConfig`; ``options`` (``weight=``, ``depth=`` ...) override its fields.
        cache: the :class:`~medadapt.cache.EmbeddingCache` holding the token vectors (default: the default one).

    ``rerank(query_texts, run, doc_texts)`` returns the run re-ordered (``{qid: {doc_id: fused score}}``, best
    first); documents of a query's run beyond ``depth`` follow below the re-ranked ones in their first-stage
    order. Queries absent from ``query_texts`` are a :class:`MedAdaptError`, as are candidates absent from
    ``doc_texts``. With ``config.domain_weights`` the model must carry a domain classifier
    (:func:`domain_classifier`) over exactly those domains, else a :class:`ConfigError` (at construction).
    """

    def __init__(self, model, config: MaxSimConfig | None = None, *, cache: EmbeddingCache | None = None,
                 show_progress: bool = False, **options: Any):
        base = config.model_dump(exclude_unset=True) if config is not None else {}
        self.config = MaxSimConfig.of(**{**base, **options})
        self.model = model
        self.tokens = TokenVectorCache(cache, batch_size=self.config.batch_size, show_progress=show_progress)
        self.classifier: DomainClassifier | None = None
        self._domain_weights: np.ndarray | None = None  # in the classifier's domain order
        self._pooled_view = None
        if self.config.domain_weights is not None:
            self._check_domains()

    def _check_domains(self) -> None:
        given = self.config.domain_weights
        classifier = domain_classifier(self.model)
        if classifier is None:
            raise ConfigError(f"maxsim re-ranking: domain_weights needs a model with a domain classifier (trained "
                              f"with domain routing, e.g. recipes/medical-multidomain.yaml); "
                              f"{type(self.model).__name__} has none (use one weight)")
        names = [str(n) for n in classifier.domain_names]
        missing, extra = [n for n in names if n not in given], [n for n in given if n not in names]
        if missing or extra:
            why = "; ".join(part for part in (missing and f"missing: {', '.join(missing)}",
                                              extra and f"not the model's: {', '.join(extra)}") if part)
            raise ConfigError(f"maxsim re-ranking: domain_weights must name exactly the model's domains "
                              f"({', '.join(names)}); {why}")
        self.classifier = classifier
        self._domain_weights = np.array([given[n] for n in names], np.float64)

    def query_weights(self, query_texts: Sequence[str]) -> np.ndarray:
        """MaxSim's share of each query's fused score: ``config.weight``, or with ``domain_weights``
        ``sum_k p_k * domain_weights[k]`` (``p``: the model's domain classifier on the query's frozen pooled
        embedding, read through the embedding cache)."""
        import torch

        texts = list(query_texts)
        c = self.config
        if c.domain_weights is None:
            return np.full(len(texts), c.weight, np.float64)
        if not texts or not self._domain_weights.any():  # every domain weighs 0: the first stage, nothing encoded
            return np.zeros(len(texts), np.float64)
        if self._pooled_view is None:  # the backbone alone: its encode gives the frozen pooled embedding
            self._pooled_view = backbone_view(self.model)
        _, fingerprint = self.tokens._encoder(self.model, "query")  # memoised: the weights are not hashed each call
        pooled = self.tokens.cache.encode(self._pooled_view, texts, role="query", normalize=False,
                                          batch_size=c.batch_size, show_progress=False, fingerprint=fingerprint)
        with torch.no_grad():
            probs = self.classifier.domain_probabilities(torch.from_numpy(np.ascontiguousarray(pooled)))
        probs = np.asarray(probs.detach().double().cpu().numpy() if hasattr(probs, "detach") else probs, np.float64)
        k = len(self._domain_weights)
        if probs.shape != (len(texts), k) or not np.isfinite(probs).all() or (probs < 0).any():
            raise MedAdaptError(f"the model's domain classifier gave probabilities of shape {list(probs.shape)} "
                                f"(or non-finite / negative values); expected [{len(texts)}, {k}]")
        probs = probs / np.maximum(probs.sum(1, keepdims=True), _EPS)
        w, low = self._domain_weights, float(self._domain_weights.min())
        # low + sum_k p_k (w_k - low) == sum_k p_k w_k, and exactly w when every domain weighs the same
        return np.clip(low + probs @ (w - low), 0.0, 1.0)

    @property
    def depth(self) -> int:
        return self.config.depth

    def scores(self, query_text: str, doc_texts: Sequence[str]) -> np.ndarray:
        """MaxSim of one query against ``doc_texts`` (token vectors from the cache, encoded when missing)."""
        q = self.tokens.vectors(self.model, [query_text], "query", desc="token vectors (queries)")[0]
        docs = self.tokens.vectors(self.model, list(doc_texts), "document", desc="token vectors (documents)")
        return self._maxsim(q, docs)

    def rerank(self, query_texts: Mapping[str, str], run: Mapping[str, Mapping[str, float]],
               doc_texts: Mapping[str, str]) -> dict[str, dict[str, float]]:
        """``run`` re-ranked (see the class); each query fused with its :meth:`query_weights` weight."""
        c = self.config
        heads = {}
        for qid, hits in run.items():
            if qid not in query_texts:
                raise MedAdaptError(f"re-ranking: query {qid!r} of the run has no text")
            ranked = sorted(hits.items(), key=lambda kv: -kv[1])  # stable: ties keep the run's order
            heads[qid] = ranked
            for doc_id, _ in ranked[:c.depth]:
                if doc_id not in doc_texts:
                    raise MedAdaptError(f"re-ranking: document {doc_id!r} of query {qid!r}'s run has no text")
        weights = dict(zip(heads, self.query_weights([query_texts[q] for q in heads]).tolist()))
        late = [q for q in heads if weights[q] > 0]  # only these need token vectors
        qvec, dvec = {}, {}
        if late:  # every vector fetched (missing ones encoded) in two large calls, not one query at a time
            texts = list(dict.fromkeys(query_texts[q] for q in late))
            qvec = dict(zip(texts, self.tokens.vectors(self.model, texts, "query", desc="token vectors (queries)")))
            texts = list(dict.fromkeys(doc_texts[d] for q in late for d, _ in heads[q][:c.depth]))
            dvec = dict(zip(texts, self.tokens.vectors(self.model, texts, "document",
                                                       desc="token vectors (documents)")))
        return {qid: self._rerank_one(qvec.get(query_texts[qid]), ranked, doc_texts, dvec, weights[qid])
                for qid, ranked in heads.items()}

    def _maxsim(self, query: np.ndarray, docs: Sequence[np.ndarray]) -> np.ndarray:
        special = self.config.special_tokens
        return maxsim_scores(trim_special(query, special), [trim_special(d, special) for d in docs])

    def _rerank_one(self, query: np.ndarray | None, ranked: list[tuple[str, float]], doc_texts: Mapping[str, str],
                    dvec: Mapping[str, np.ndarray], weight: float) -> dict[str, float]:
        c = self.config
        head, tail = ranked[:c.depth], ranked[c.depth:]
        if not head:
            return {}
        first = np.array([s for _, s in head], np.float64)
        late = self._maxsim(query, [dvec[doc_texts[d]] for d, _ in head]) if weight else None
        order, fused = fuse_candidates(first, late, weight, c.normalization)
        out = {head[i][0]: float(s) for i, s in zip(order, fused)}
        if tail:  # below every re-ranked score, in first-stage order (ties stay ties)
            floor = float(fused.min()) - 1.0
            distinct = {s: r for r, s in enumerate(sorted({s for _, s in tail}, reverse=True))}
            out.update({d: floor - distinct[s] for d, s in tail})
        return out
