"""Qdrant as the serving backend (extra ``[qdrant]``): export dense and sparse vectors with document metadata,
and search them with the same :class:`~medadapt.retrieval.retriever.SearchResult` as the in-process Retriever.

Qdrant, because one client class runs embedded in pure Python (tests, laptops) and against a server or cluster,
and one collection holds dense and sparse vectors, a payload and the medadapt manifest. Models without a
learned-lexical branch get BM25 sparse vectors (``IDF`` modifier), so scores equal the in-process BM25. Hybrid
queries fuse in the client (``FusionConfig``) or in Qdrant (``server_fusion="rrf" | "dbsf"``, RRF sent as
``Rrf(k=rrf_k + 1)``). Collection layout, ties, the RRF constant and DBSF: docs/scaling.md.
"""

from __future__ import annotations

import threading
import warnings
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from medadapt import __version__
from medadapt.errors import MedAdaptError
from medadapt.progress import progress
from medadapt.retrieval.bm25 import BM25Weighting
from medadapt.retrieval.config import LexicalConfig, RetrieverConfig
from medadapt.retrieval.dense import embedding_dim, uses_cosine
from medadapt.retrieval.encoders import DenseEncoder, SparseEncoder
from medadapt.retrieval.errors import IndexMismatchError
from medadapt.retrieval.exact import normalize_rows
from medadapt.retrieval.fusion import fuse, hybrid_topk, hybrid_weights
from medadapt.retrieval.retriever import (SearchResult, _build_encoder, _check_model, describe_model,
                                          model_reference, search_queries)
from medadapt.retrieval.scale import iter_batches
from medadapt.retrieval.storage import Manifest, manifest_data
from medadapt.retrieval.tokenize import Tokenizer, detect_language

__all__ = ["QdrantBM25", "QdrantRetriever", "collection_manifest", "export_to_qdrant", "open_qdrant", "DENSE",
           "SPARSE", "SERVER_FUSIONS"]

DENSE = "dense"
SPARSE = "sparse"
META = "medadapt"
COMPLETE = "medadapt_complete"
BM25_META = "medadapt_bm25"
#: fusions Qdrant performs itself (``QdrantRetriever(server_fusion=...)``)
SERVER_FUSIONS = ("rrf", "dbsf")


class QdrantBM25:
    """BM25 as Qdrant sparse vectors for the ``IDF`` modifier: document values are saturated term
    frequencies, query values term counts; Qdrant supplies the IDF.

    Args:
        terms: the corpus vocabulary (term id = position).
        language / stopwords / stem: medadapt's :class:`~medadapt.retrieval.tokenize.Tokenizer` settings.
        k1 / b / avgdl: BM25 parameters and the corpus' mean document length (tokens).
    """

    def __init__(self, terms: Sequence[str], language: str, stopwords: bool, stem: bool, k1: float, b: float,
                 avgdl: float):
        self.terms = list(terms)
        self.vocab = {t: i for i, t in enumerate(self.terms)}
        self.language, self.stopwords, self.stem = language, bool(stopwords), bool(stem)
        self.k1, self.b, self.avgdl = float(k1), float(b), float(avgdl)
        self.tokenizer = Tokenizer(language, stopwords, stem)
        self.weighting = BM25Weighting(self.vocab, np.zeros(len(self.terms)), 0, self.avgdl, self.k1, self.b)

    @classmethod
    def fit(cls, texts: Sequence[str], config: LexicalConfig) -> tuple[QdrantBM25, list[dict[int, float]]]:
        """Tokenise the corpus (medadapt's BM25 tokenizer) and return ``(bm25, document vectors)``."""
        language = detect_language(texts) if config.language == "auto" else config.language
        tokenizer = Tokenizer(language, config.stopwords, config.stem)
        tokens = [tokenizer(t) for t in texts]
        weighting, _ = BM25Weighting.fit(tokens, config.k1, config.b)
        terms = [""] * len(weighting.vocab)
        for t, i in weighting.vocab.items():
            terms[i] = t
        bm25 = cls(terms, language, config.stopwords, config.stem, config.k1, config.b, weighting.avgdl)
        return bm25, [bm25._document(tok) for tok in tokens]

    def _document(self, tokens: Sequence[str]) -> dict[int, float]:
        norm = self.k1 * (1 - self.b + self.b * len(tokens) / max(self.avgdl, 1e-9))
        return {self.vocab[t]: tf / (tf + norm) for t, tf in Counter(tokens).items()}

    def query(self, text: str) -> dict[int, float]:
        """``{term_id: count}`` over the query's terms known to the corpus (medadapt's BM25 query vector)."""
        return self.weighting.query_vector(self.tokenizer(text))

    def to_json(self) -> dict:
        return {"terms": self.terms, "language": self.language, "stopwords": self.stopwords, "stem": self.stem,
                "k1": self.k1, "b": self.b, "avgdl": self.avgdl}

    @classmethod
    def from_json(cls, obj: dict) -> QdrantBM25:
        return cls(obj["terms"], obj["language"], obj["stopwords"], obj["stem"], obj["k1"], obj["b"], obj["avgdl"])


def _models():
    try:
        from qdrant_client import models
    except ImportError:
        raise MedAdaptError("the Qdrant backend needs qdrant-client: pip install 'medadapt[qdrant]'") from None
    return models


def _distance(normalized: bool):
    models = _models()
    return models.Distance.COSINE if normalized else models.Distance.DOT


def _label(collection: str) -> str:
    return f"Qdrant collection {collection!r}"


def _check_vector_params(collection: str, info, dim: int | None, normalized: bool | None, sparse: bool) -> None:
    """Refuse a collection whose dense vectors have another size or distance (or that lacks ours)."""
    vectors = info.config.params.vectors
    if dim is not None:
        params = vectors.get(DENSE) if isinstance(vectors, dict) else None
        if params is None:
            have = sorted(vectors) if isinstance(vectors, dict) else ["(one unnamed vector)"]
            raise IndexMismatchError(f"{_label(collection)} has no {DENSE!r} vector (it has {', '.join(have) or 'none'}); "
                                     "use another collection name, or recreate=True to replace it")
        want = _distance(bool(normalized))
        if int(params.size) != int(dim) or params.distance != want:
            raise IndexMismatchError(
                f"{_label(collection)} holds {params.size}-dim {params.distance.value} vectors but this model gives "
                f"{dim}-dim {want.value} vectors; use another collection, or recreate=True to replace it")
    if sparse and SPARSE not in (info.config.params.sparse_vectors or {}):
        raise IndexMismatchError(f"{_label(collection)} has no {SPARSE!r} sparse vectors; use another collection, "
                                 "or recreate=True to replace it")


class QdrantRetriever:
    """Dense, learned-sparse or hybrid search over a Qdrant collection written by :func:`export_to_qdrant`.

    Args:
        client: a ``qdrant_client.QdrantClient`` (embedded ``path=`` / ``":memory:"``, or ``url=`` of a server).
        collection: the collection name.
        model: ``None`` reloads the model recorded in the collection's manifest; a name or model is checked
            against it (fingerprint, dimension, similarity, prompts).
        exact: ask a server for exact search (``SearchParams(exact=True)``); the embedded mode is always exact.
        fusion: override the recorded :class:`~medadapt.retrieval.config.FusionConfig` (hybrid only).
        server_fusion: ``None`` (default) fuses the dense and sparse lists in the client with ``fusion``;
            ``"rrf"`` / ``"dbsf"`` has Qdrant fuse them (one Query API call with two prefetches of ``depth``;
            RRF with ``k = rrf_k + 1``, which is medadapt's ``rrf_k``: see docs/scaling.md).

    Raises:
        MedAdaptError: the collection does not exist, is not a medadapt collection, or its export did not
            finish; ``server_fusion`` is not one of ``"rrf"`` / ``"dbsf"``, or is given for a collection
            that is not hybrid.
        IndexMismatchError: the model is not the one the collection was built with, or the collection's
            vectors have another dimension or distance than its manifest says.
    """

    def __init__(self, client, collection: str, model: Any = None, *, exact: bool = True, fusion=None,
                 server_fusion: str | None = None, device: str | None = None, _encoder=None):
        manifest, info = collection_manifest(client, collection)
        config = RetrieverConfig.model_validate(manifest.config)
        if fusion is not None:
            config = config.model_copy(update={"fusion": fusion})
        self.client, self.collection, self.exact = client, collection, exact
        self.config, self.manifest = config, manifest
        if server_fusion is not None and server_fusion not in SERVER_FUSIONS:
            raise MedAdaptError(f"server_fusion must be one of {', '.join(SERVER_FUSIONS)}, got {server_fusion!r}")
        if server_fusion is not None and config.kind != "hybrid":
            raise MedAdaptError(f"server_fusion needs a hybrid collection; {_label(collection)} is {config.kind}")
        self.server_fusion = server_fusion
        bm25 = (info.config.metadata or {}).get(BM25_META)
        #: BM25 term vocabulary and settings when the sparse vectors are BM25 (``None``: learned or none)
        self.bm25 = QdrantBM25.from_json(bm25) if bm25 and config.uses_lexical else None
        self.learned_sparse = config.uses_lexical and self.bm25 is None
        _check_vector_params(collection, info, manifest.embedding_dim if config.uses_dense else None,
                             manifest.normalized, self.learned_sparse)
        self.encoder = _encoder if _encoder is not None else _check_model(
            Path(_label(collection)), manifest, model, device, config.uses_dense)
        self.normalized = bool(manifest.normalized)
        self._lock = threading.Lock()

    @property
    def kind(self) -> str:
        return self.config.kind

    def __len__(self) -> int:
        return int(self.manifest.n_docs)

    # ------------------------------------------------------------------ queries
    def _dense_queries(self, queries: list[str]) -> np.ndarray:
        with self._lock:
            q = np.asarray(self.encoder.encode_query(queries, batch_size=self.config.batch_size), dtype=np.float32)
        return normalize_rows(q) if self.normalized else q

    def _sparse_queries(self, queries: list[str]) -> list:
        models = _models()
        if self.bm25 is not None:
            return [_sparse(models, self.bm25.query(q)) for q in queries]
        with self._lock:
            vecs = self.encoder.encode_lexical(queries, "query", batch_size=self.config.batch_size)
        return [_sparse(models, v) for v in vecs]

    def _query(self, using: str, vectors: Sequence, limit: int) -> list[list]:
        """Top-``limit`` points per query vector, ties broken by document position (as FAISS and the inverted
        index break them), also at the cut: a query whose next point ties the last one kept is asked again
        for twice as many until the tie is passed (Qdrant picks among equal scores its own way)."""
        models = _models()
        params = models.SearchParams(exact=True) if self.exact and using == DENSE else None

        def ask(batch: list, n: int) -> list[list]:
            requests = [models.QueryRequest(query=v, using=using, limit=n, with_payload=True, params=params)
                        for v in batch]
            with warnings.catch_warnings():  # the embedded mode is always exact and says search_params are ignored
                warnings.filterwarnings("ignore", message="Local mode performs exact")
                responses = self.client.query_batch_points(self.collection, requests=requests)
            return [sorted(r.points, key=lambda p: (-p.score, int(p.id))) for r in responses]

        out, n = ask(list(vectors), limit + 1), limit + 1
        while True:
            tied = [i for i, pts in enumerate(out) if len(pts) == n and pts[limit - 1].score == pts[-1].score]
            if not tied or n >= len(self):
                break
            n = min(2 * n, len(self))
            for i, pts in zip(tied, ask([vectors[i] for i in tied], n)):
                out[i] = pts
        return [pts[:limit] for pts in out]

    def search(self, query: str, k: int = 10) -> SearchResult:
        """Top-``k`` documents for one query."""
        return self.batch_search([query], k)[0]

    def batch_search(self, queries: Sequence[str], k: int = 10, *, query_embeddings: np.ndarray | None = None
                     ) -> list[SearchResult]:
        """Top-``k`` documents per query (ids, scores, texts, titles), like :meth:`Retriever.batch_search`."""
        queries = search_queries(queries, k)
        if not queries:
            return []
        kind = self.config.kind
        dense_q = None
        if kind != "lexical":
            dense_q = (self._dense_queries(queries) if query_embeddings is None
                       else np.asarray(query_embeddings, dtype=np.float32))
            if self.normalized and query_embeddings is not None:
                dense_q = normalize_rows(dense_q)
        if kind == "dense":
            return [_result(pts[:k]) for pts in self._query(DENSE, [v.tolist() for v in dense_q], k)]
        sparse_q = self._sparse_queries(queries)
        if kind == "lexical":
            return [_result(pts[:k]) for pts in self._query(SPARSE, sparse_q, k)]
        return self._hybrid(dense_q, sparse_q, k)

    def _server_fused(self, dense_q: np.ndarray, sparse_q: list, k: int) -> list[SearchResult]:
        """Hybrid fused by Qdrant: per query one Query API request, a dense and a sparse ``prefetch`` of
        ``depth`` each and an RRF (``k = rrf_k + 1``) or DBSF fusion query. Every fused candidate comes back
        (at most ``2 * depth``) so that ties break by document position, as in medadapt's fusion."""
        models = _models()
        fc = self.config.fusion
        depth = max(k, fc.depth)
        if self.server_fusion == "rrf":
            weights = None if fc.dense_weight == 1 else hybrid_weights(fc.dense_weight)
            fusion = models.RrfQuery(rrf=models.Rrf(k=fc.rrf_k + 1, weights=weights))
        else:
            fusion = models.FusionQuery(fusion=models.Fusion.DBSF)
        params = models.SearchParams(exact=True) if self.exact else None
        requests = [models.QueryRequest(
            prefetch=[models.Prefetch(query=d.tolist(), using=DENSE, limit=depth, params=params),
                      models.Prefetch(query=s, using=SPARSE, limit=depth)],
            query=fusion, limit=2 * depth, with_payload=False) for d, s in zip(dense_q, sparse_q)]
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message="Local mode performs exact")
            responses = self.client.query_batch_points(self.collection, requests=requests)
        tops = [sorted(r.points, key=lambda p: (-p.score, int(p.id)))[:k] for r in responses]
        ids = sorted({int(p.id) for top in tops for p in top})
        payloads = {int(rec.id): rec.payload for rec in self.client.retrieve(self.collection, ids, with_payload=True)}
        for top in tops:
            for p in top:
                p.payload = payloads[int(p.id)]
        return [_result(top) for top in tops]

    def _exact_sparse(self, sparse_q, cand: np.ndarray) -> np.ndarray:
        """True sparse scores of the candidates, scored by Qdrant (BM25: its IDF); 0 for no shared term."""
        models = _models()
        scores = dict.fromkeys(cand.tolist(), 0.0)
        if len(sparse_q.indices):
            res = self.client.query_points(
                self.collection, query=sparse_q, using=SPARSE, limit=len(cand), with_payload=False,
                query_filter=models.Filter(must=[models.HasIdCondition(has_id=cand.tolist())]))
            scores.update({int(p.id): float(p.score) for p in res.points})
        return np.array([scores[int(c)] for c in cand], dtype=np.float32)

    def _hybrid(self, dense_q: np.ndarray, sparse_q: list, k: int) -> list[SearchResult]:
        if self.server_fusion is not None:
            return self._server_fused(dense_q, sparse_q, k)
        fc = self.config.fusion
        depth = max(k, fc.depth)
        dense_lists = self._query(DENSE, [v.tolist() for v in dense_q], depth)
        sparse_lists = self._query(SPARSE, sparse_q, depth)
        out = []
        for r, (dl, sl) in enumerate(zip(dense_lists, sparse_lists)):
            points = {int(p.id): p for p in dl + sl}
            if fc.method == "sum":  # every candidate scored exactly from its stored vectors
                cand = np.array(sorted(points), dtype=np.int64)
                records = {int(rec.id): rec for rec in self.client.retrieve(
                    self.collection, cand.tolist(), with_vectors=True, with_payload=False)}
                dense = np.array([np.dot(records[int(c)].vector[DENSE], dense_q[r]) for c in cand], dtype=np.float32)
                lex = (self._exact_sparse(sparse_q[r], cand) if self.bm25 is not None else  # IDF is Qdrant's
                       np.array([_sparse_dot(records[int(c)].vector.get(SPARSE), sparse_q[r]) for c in cand],
                                dtype=np.float32))
                positions, scores = hybrid_topk(cand, lex, dense, fc.dense_weight, k)
                out.append(_result([points[int(p)] for p in positions], scores.tolist()))
                continue
            d = {f"{int(p.id):012d}": float(p.score) for p in dl}
            s = {f"{int(p.id):012d}": float(p.score) for p in sl}
            fused = fuse([d, s], fc.method, hybrid_weights(fc.dense_weight), k, fc.rrf_k)
            out.append(_result([points[int(key)] for key in fused], list(fused.values())))
        return out


def collection_manifest(client, collection: str):
    """``(manifest, collection info)`` of a collection written by :func:`export_to_qdrant`: the medadapt
    manifest its metadata holds, and Qdrant's ``get_collection`` answer.

    Raises:
        MedAdaptError: the collection does not exist, was not written by medadapt, its export did not finish,
            or its manifest is invalid.
    """
    _models()
    if not client.collection_exists(collection):
        raise MedAdaptError(f"{_label(collection)} does not exist; create it with export_to_qdrant(...)")
    info = client.get_collection(collection)
    meta = dict(info.config.metadata or {})
    if META not in meta:
        raise MedAdaptError(f"{_label(collection)} was not written by medadapt (no {META!r} manifest in its "
                            "metadata); export it with export_to_qdrant(...)")
    if not meta.get(COMPLETE):
        raise MedAdaptError(f"{_label(collection)}: its export did not finish; run export_to_qdrant(...) again "
                            "(it resumes)")
    try:
        manifest = Manifest.model_validate(meta[META])
        RetrieverConfig.model_validate(manifest.config)
    except ValueError as exc:
        raise MedAdaptError(f"{_label(collection)}: invalid medadapt manifest ({str(exc).splitlines()[0]})") from None
    return manifest, info


def open_qdrant(location: str):
    """A ``QdrantClient`` for a server URL (``http://`` / ``https://``) or an embedded database folder, which
    must exist (``QdrantClient(path=...)`` would create an empty one).

    Raises:
        MedAdaptError: qdrant-client is not installed, or the folder does not exist.
    """
    _models()
    from qdrant_client import QdrantClient

    if location.startswith(("http://", "https://")):
        return QdrantClient(url=location)
    if not Path(location).expanduser().is_dir():
        raise MedAdaptError(f"Qdrant database folder not found: {location} (give an embedded database folder or "
                            "a server URL)")
    return QdrantClient(path=str(Path(location).expanduser()))


def _sparse(models, vector: dict) -> Any:
    items = sorted((int(t), float(w)) for t, w in dict(vector).items() if w != 0)
    return models.SparseVector(indices=[t for t, _ in items], values=[w for _, w in items])


def _sparse_dot(stored, query) -> float:
    if stored is None or not len(query.indices):
        return 0.0
    weights = dict(zip(stored.indices, stored.values))
    return float(sum(weights.get(i, 0.0) * w for i, w in zip(query.indices, query.values)))


def _result(points: list, scores: list[float] | None = None) -> SearchResult:
    res = SearchResult()
    for i, p in enumerate(points):
        payload = p.payload or {}
        res.ids.append(str(payload.get("doc_id", p.id)))
        res.scores.append(float(p.score if scores is None else scores[i]))
        res.texts.append(payload.get("text", ""))
        res.titles.append(payload.get("title", ""))
    return res


def export_to_qdrant(client, collection: str, docs, model: Any, *, kind: str | None = None,
                     config: RetrieverConfig | None = None, vectors=None, cache=None, model_name: str | None = None,
                     recreate: bool = False, batch_size: int = 256, show_progress: bool = False) -> QdrantRetriever:
    """Write ``docs`` (ids, titles, texts) with their dense and/or learned sparse vectors to a Qdrant
    collection and return a :class:`QdrantRetriever` over it.

    Args:
        client: a ``QdrantClient`` (embedded or server).
        docs: a :class:`~medadapt.retrieval.docstore.Documents` (see :func:`~medadapt.retrieval.load_documents`).
        model: a name for :func:`medadapt.load`, a SentenceTransformer or an encoder. For ``kind="lexical"`` /
            ``"hybrid"`` a learned sparse encoder (e.g. a HyReC model or folder) stores its term weights; any
            other model gets BM25 sparse vectors (``config.lexical`` settings, Qdrant's ``IDF`` modifier).
        kind: ``"dense"`` (default), ``"lexical"`` or ``"hybrid"`` (overrides ``config.kind``).
        vectors: precomputed document embeddings as a vector source (:mod:`medadapt.retrieval.scale`: an
            array / memmap or re-iterable ``(ids, vectors)`` batches in ``docs`` order), e.g. from the
            embedding cache; otherwise documents are encoded (a SentenceTransformer through the cache).
        recreate: drop an existing collection first. Without it an existing collection must hold vectors of
            the same dimension and distance and the same model (then points are upserted: a killed export
            resumes).

    Raises:
        IndexMismatchError: an existing collection with another dimension / distance, or built with another
            model or corpus.
        MedAdaptError: vectors that do not match the documents or the model.
    """
    models = _models()
    config = (config or RetrieverConfig()).model_copy()
    if kind is not None:
        config = RetrieverConfig(**{**config.model_dump(), "kind": kind})
    if len(docs) == 0:
        raise MedAdaptError("cannot export an empty corpus")
    encoder, name = _build_encoder(model, config.model_copy(update={"kind": "dense"}), cache)
    if encoder is None:
        raise MedAdaptError("export_to_qdrant needs a model")
    sparse = config.uses_lexical
    texts = docs.indexed_texts()
    bm25 = bm25_docs = None
    if sparse and not isinstance(encoder, SparseEncoder):  # BM25, as Retriever.build for such a model
        bm25, bm25_docs = QdrantBM25.fit(texts, config.lexical)
    if config.uses_dense and not isinstance(encoder, DenseEncoder):
        raise MedAdaptError(f"a {config.kind} Qdrant collection needs a dense model")
    model_name = model_name or name
    source = None
    if model_name:
        model_name, source = model_reference(model_name)
    normalized = uses_cosine(encoder) if config.uses_dense else None
    dim = embedding_dim(encoder) if config.uses_dense else None
    if config.uses_dense and dim is None:
        dim = int(np.asarray(encoder.encode_document(docs.indexed_texts()[:1], batch_size=1, show_progress=False)
                             ).shape[1])
    manifest = Manifest(
        medadapt_version=__version__, kind=config.kind, encoder=encoder.encoder_tag,
        model=describe_model(encoder, model_name or "", source), embedding_dim=dim, normalized=normalized,
        corpus_hash=docs.content_hash(), n_docs=len(docs), config=config.model_dump(mode="json"),
        build={"backend": "qdrant", "dense_vector": DENSE if config.uses_dense else None,
               "sparse_vector": SPARSE if sparse else None,
               "sparse_weights": None if not sparse else "bm25" if bm25 is not None else "learned"},
    )
    meta = {META: manifest_data(manifest), COMPLETE: False}
    if bm25 is not None:
        meta[BM25_META] = bm25.to_json()
    if recreate and client.collection_exists(collection):
        client.delete_collection(collection)
    if client.collection_exists(collection):
        info = client.get_collection(collection)
        _check_vector_params(collection, info, dim, normalized, sparse)
        have_idf = sparse and info.config.params.sparse_vectors[SPARSE].modifier == models.Modifier.IDF
        if sparse and have_idf != (bm25 is not None):
            raise IndexMismatchError(f"{_label(collection)} holds {'BM25' if have_idf else 'learned'} sparse vectors "
                                     f"but this model gives {'BM25' if bm25 is not None else 'learned'} ones; use "
                                     "another collection, or recreate=True to replace it")
        old = (info.config.metadata or {}).get(META)
        if old is not None:
            fields = ("kind", "encoder", "corpus_hash", "n_docs")
            recorded = {f: old.get(f) for f in fields} | {"fingerprint": (old.get("model") or {}).get("fingerprint")}
            wanted = {f: meta[META][f] for f in fields} | {"fingerprint": manifest.model.fingerprint}
            if recorded != wanted:
                diff = ", ".join(f"{f} {recorded[f]!r} != {wanted[f]!r}" for f in recorded if recorded[f] != wanted[f])
                raise IndexMismatchError(f"{_label(collection)} holds another export ({diff}); use another "
                                         "collection, or recreate=True to replace it")
        client.update_collection(collection, metadata=meta)
    else:
        client.create_collection(
            collection,
            vectors_config={DENSE: models.VectorParams(size=int(dim), distance=_distance(bool(normalized)))}
            if config.uses_dense else {},
            sparse_vectors_config={SPARSE: models.SparseVectorParams(
                modifier=models.Modifier.IDF if bm25 is not None else None)} if sparse else None,
            metadata=meta,
        )
    def chunks():
        if vectors is not None and config.uses_dense:
            start = 0
            for ids, batch in iter_batches(vectors, config.dense.chunk_size):
                if batch.shape[1] != dim:
                    raise MedAdaptError(f"the vectors have dimension {batch.shape[1]} but the model gives {dim}: "
                                        "they were not computed by this model")
                yield start, np.asarray(batch, dtype=np.float32)
                start += len(batch)
            if start != len(docs):
                raise MedAdaptError(f"the vector source gave {start} vectors for {len(docs)} documents")
            return
        for start in range(0, len(docs), config.dense.chunk_size):
            stop = min(len(docs), start + config.dense.chunk_size)
            emb = None
            if config.uses_dense:
                emb = np.asarray(encoder.encode_document(texts[start:stop], batch_size=config.batch_size,
                                                         show_progress=False), dtype=np.float32)
            yield start, emb

    bar = progress(total=len(docs), desc=f"exporting to Qdrant ({collection})", unit="doc", disable=not show_progress)
    try:
        for start, emb in chunks():
            n = len(emb) if emb is not None else min(config.dense.chunk_size, len(docs) - start)
            sp = (bm25_docs[start:start + n] if bm25_docs is not None else
                  encoder.encode_lexical(texts[start:start + n], "document", batch_size=config.batch_size)
                  if sparse else None)
            if emb is not None and normalized:
                emb = normalize_rows(emb)
            for b in range(0, n, batch_size):
                e = min(n, b + batch_size)
                named: dict[str, Any] = {}
                if emb is not None:
                    named[DENSE] = emb[b:e].tolist()
                if sp is not None:
                    named[SPARSE] = [_sparse(models, v) for v in sp[b:e]]
                payloads = [{"doc_id": docs.ids[i], "title": docs.titles[i], "text": docs.texts[i]}
                            for i in range(start + b, start + e)]
                client.upsert(collection, points=models.Batch(ids=list(range(start + b, start + e)), vectors=named,
                                                              payloads=payloads), wait=True)
            bar.update(n)
    finally:
        bar.close()
    client.update_collection(collection, metadata={META: meta[META], COMPLETE: True})
    return QdrantRetriever(client, collection, exact=True, _encoder=encoder)
