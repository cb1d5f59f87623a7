"""Qdrant as the serving backend (extra ``[qdrant]``): export dense and sparse vectors with document metadata,
and search them with the same :class:`~medadapt.retrieval.retriever.SearchResult` as the in-process Retriever.

One client class runs embedded (tests, laptops) and against a server, and one collection holds dense and sparse
vectors, a payload and the medadapt manifest. Models without a learned-lexical branch get BM25 sparse vectors
(``IDF`` modifier), scoring as the in-process BM25. Hybrid queries fuse in the client (``FusionConfig``) or in
Qdrant (``server_fusion="rrf" | "dbsf"``, RRF sent as ``Rrf(k=rrf_k + 1)``). Layout and ties: docs/scaling.md.
"""

from __future__ import annotations

import threading
import warnings
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from medadapt.errors import MedAdaptError
from medadapt.progress import progress
from medadapt.retrieval.bm25 import BM25Weighting
from medadapt.retrieval.config import LexicalConfig, RetrieverConfig
from medadapt.retrieval.dense import embedding_dim, uses_cosine
from medadapt.retrieval.encoders import DenseEncoder, SparseEncoder
from medadapt.retrieval.errors import IndexMismatchError
from medadapt.retrieval.exact import normalize_rows
from medadapt.retrieval.fusion import fuse_positions, hybrid_topk, hybrid_weights
from medadapt.retrieval.retriever import (Searcher, SearchResult, _build_encoder, _check_model, build_config,
                                          new_manifest, search_queries)
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
    """BM25 as Qdrant sparse vectors for the ``IDF`` modifier: document values are saturated term frequencies,
    query values term counts (medadapt's tokenizer and BM25 query vector); Qdrant supplies the IDF."""

    FIELDS = ("terms", "language", "stopwords", "stem", "k1", "b", "avgdl")

    def __init__(self, terms: Sequence[str], language: str, stopwords: bool, stem: bool, k1: float, b: float,
                 avgdl: float):
        self.terms = list(terms)
        self.language, self.stopwords, self.stem = language, bool(stopwords), bool(stem)
        self.k1, self.b, self.avgdl = float(k1), float(b), float(avgdl)
        self.tokenizer = Tokenizer(language, stopwords, stem)
        vocab = {t: i for i, t in enumerate(self.terms)}
        self.weighting = BM25Weighting(vocab, np.zeros(len(self.terms)), 0, self.avgdl, self.k1, self.b)

    @classmethod
    def fit(cls, texts: Sequence[str], config: LexicalConfig) -> tuple[QdrantBM25, list[dict[int, float]]]:
        """Tokenise the corpus and return ``(bm25, document vectors)``."""
        language = detect_language(texts) if config.language == "auto" else config.language
        tokenizer = Tokenizer(language, config.stopwords, config.stem)
        tokens = [tokenizer(t) for t in texts]
        weighting, _ = BM25Weighting.fit(tokens, config.k1, config.b)
        bm25 = cls(weighting.to_json()["terms"], language, config.stopwords, config.stem, config.k1, config.b,
                   weighting.avgdl)
        vocab, k1, b = weighting.vocab, bm25.k1, bm25.b
        norms = [k1 * (1 - b + b * len(tok) / max(bm25.avgdl, 1e-9)) for tok in tokens]
        return bm25, [{vocab[t]: tf / (tf + n) for t, tf in Counter(tok).items()} for tok, n in zip(tokens, norms)]

    def query(self, text: str) -> dict[int, float]:
        """``{term_id: count}`` over the query's terms known to the corpus."""
        return self.weighting.query_vector(self.tokenizer(text))

    def to_json(self) -> dict:
        return {f: getattr(self, f) for f in self.FIELDS}

    @classmethod
    def from_json(cls, obj: dict) -> QdrantBM25:
        return cls(*(obj[f] for f in cls.FIELDS))


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


def _mismatch(collection: str, problem: str) -> IndexMismatchError:
    return IndexMismatchError(f"{_label(collection)} {problem}; use another collection, or recreate=True to "
                              "replace it")


def _check_vector_params(collection: str, info, dim: int | None, normalized: bool | None, sparse: bool,
                         export: dict | None = None) -> None:
    """Refuse a collection whose vectors have another size or distance (or that lacks ours); with ``export``
    (the metadata of an export to resume), also other sparse weights or another export."""
    vectors = info.config.params.vectors
    if dim is not None:
        params = vectors.get(DENSE) if isinstance(vectors, dict) else None
        if params is None:
            have = sorted(vectors) if isinstance(vectors, dict) else ["(one unnamed vector)"]
            raise _mismatch(collection, f"has no {DENSE!r} vector (it has {', '.join(have) or 'none'})")
        want = _distance(bool(normalized))
        if int(params.size) != int(dim) or params.distance != want:
            raise _mismatch(collection, f"holds {params.size}-dim {params.distance.value} vectors but this model "
                                        f"gives {dim}-dim {want.value} vectors")
    if sparse and SPARSE not in (info.config.params.sparse_vectors or {}):
        raise _mismatch(collection, f"has no {SPARSE!r} sparse vectors")
    if export is None:
        return
    have_idf = sparse and info.config.params.sparse_vectors[SPARSE].modifier == _models().Modifier.IDF
    if sparse and have_idf != (BM25_META in export):
        raise _mismatch(collection, f"holds {'BM25' if have_idf else 'learned'} sparse vectors but this model "
                                    f"gives {'BM25' if BM25_META in export else 'learned'} ones")
    old = (info.config.metadata or {}).get(META)
    if old is not None:
        fields = ("kind", "encoder", "corpus_hash", "n_docs")
        recorded = {f: old.get(f) for f in fields} | {"fingerprint": (old.get("model") or {}).get("fingerprint")}
        wanted = {f: export[META][f] for f in fields} | {"fingerprint": export[META]["model"]["fingerprint"]}
        if recorded != wanted:
            diff = ", ".join(f"{f} {recorded[f]!r} != {wanted[f]!r}" for f in recorded if recorded[f] != wanted[f])
            raise _mismatch(collection, f"holds another export ({diff})")


class QdrantRetriever(Searcher):
    """Dense, learned-sparse or hybrid search over a Qdrant collection written by :func:`export_to_qdrant`.

    Args:
        client: a ``qdrant_client.QdrantClient`` (embedded ``path=`` / ``":memory:"``, or ``url=`` of a server).
        model: ``None`` reloads the model the collection's manifest records; a name or model is checked
            against it (fingerprint, dimension, similarity, prompts).
        exact: ask a server for exact search (``SearchParams(exact=True)``); the embedded mode is always exact.
        fusion: override the recorded :class:`~medadapt.retrieval.config.FusionConfig` (hybrid only).
        server_fusion: ``None`` fuses the dense and sparse lists in the client with ``fusion``; ``"rrf"`` /
            ``"dbsf"`` has Qdrant fuse two prefetches of ``depth`` (RRF with ``k = rrf_k + 1``, docs/scaling.md).

    Raises:
        MedAdaptError: no such collection, not a medadapt collection, an unfinished export, or a
            ``server_fusion`` that is unknown or given for a collection that is not hybrid.
        IndexMismatchError: another model, or vectors of another dimension or distance than the manifest says.
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

    def __len__(self) -> int:
        return int(self.manifest.n_docs)

    # ------------------------------------------------------------------ queries
    def _dense_queries(self, queries: list[str], embeddings: np.ndarray | None = None) -> np.ndarray:
        """Query vectors as the collection stores them (``embeddings``: already encoded)."""
        if embeddings is None:
            with self._lock:
                embeddings = self.encoder.encode_query(queries, batch_size=self.config.batch_size)
        q = np.asarray(embeddings, dtype=np.float32)
        return normalize_rows(q) if self.normalized else q

    def _sparse_queries(self, queries: list[str]) -> list:
        models = _models()
        if self.bm25 is not None:
            return [_sparse(models, self.bm25.query(q)) for q in queries]
        with self._lock:
            vecs = self.encoder.encode_lexical(queries, "query", batch_size=self.config.batch_size)
        return [_sparse(models, v) for v in vecs]

    def _ask(self, requests: list) -> list[list]:
        """``query_batch_points``, each answer sorted by score, ties by document position (as FAISS and the
        inverted index break them)."""
        with warnings.catch_warnings():  # the embedded mode is always exact and says search_params are ignored
            warnings.filterwarnings("ignore", message="Local mode performs exact")
            responses = self.client.query_batch_points(self.collection, requests=requests)
        return [sorted(r.points, key=lambda p: (-p.score, int(p.id))) for r in responses]

    def _query(self, using: str, vectors: Sequence, limit: int) -> list[list]:
        """Top-``limit`` points per query vector; a query whose next point ties the last one kept is asked again
        for twice as many until the tie is passed (Qdrant picks among equal scores its own way)."""
        models = _models()
        params = models.SearchParams(exact=True) if self.exact and using == DENSE else None

        def ask(batch: list, n: int) -> list[list]:
            return self._ask([models.QueryRequest(query=v, using=using, limit=n, with_payload=True, params=params)
                              for v in batch])

        out, n = ask(list(vectors), limit + 1), limit + 1
        while True:
            tied = [i for i, pts in enumerate(out) if len(pts) == n and pts[limit - 1].score == pts[-1].score]
            if not tied or n >= len(self):
                break
            n = min(2 * n, len(self))
            for i, pts in zip(tied, ask([vectors[i] for i in tied], n)):
                out[i] = pts
        return [pts[:limit] for pts in out]

    def batch_search(self, queries: Sequence[str], k: int = 10, *, query_embeddings: np.ndarray | None = None
                     ) -> list[SearchResult]:
        """Top-``k`` documents per query (ids, scores, texts, titles), like :meth:`Retriever.batch_search`."""
        queries = search_queries(queries, k)
        if not queries:
            return []
        dense_q = self._dense_queries(queries, query_embeddings) if self.kind != "lexical" else None
        if self.kind == "dense":
            return [_result(pts) for pts in self._query(DENSE, [v.tolist() for v in dense_q], k)]
        sparse_q = self._sparse_queries(queries)
        if self.kind == "lexical":
            return [_result(pts) for pts in self._query(SPARSE, sparse_q, k)]
        if self.server_fusion is not None:
            return self._server_fused(dense_q, sparse_q, k)
        return self._hybrid(dense_q, sparse_q, k)

    def _server_fused(self, dense_q: np.ndarray, sparse_q: list, k: int) -> list[SearchResult]:
        """Hybrid fused by Qdrant: per query a dense and a sparse ``prefetch`` of ``depth`` and an RRF
        (``k = rrf_k + 1``) or DBSF query. Every fused candidate comes back (at most ``2 * depth``) so that ties
        break by document position, as in medadapt's fusion."""
        models = _models()
        fc = self.config.fusion
        depth = max(k, fc.depth)
        if self.server_fusion == "rrf":
            weights = None if fc.dense_weight == 1 else hybrid_weights(fc.dense_weight)
            fusion = models.RrfQuery(rrf=models.Rrf(k=fc.rrf_k + 1, weights=weights))
        else:
            fusion = models.FusionQuery(fusion=models.Fusion.DBSF)
        params = models.SearchParams(exact=True) if self.exact else None
        tops = [pts[:k] for pts in self._ask([models.QueryRequest(
            prefetch=[models.Prefetch(query=d.tolist(), using=DENSE, limit=depth, params=params),
                      models.Prefetch(query=s, using=SPARSE, limit=depth)],
            query=fusion, limit=2 * depth, with_payload=False) for d, s in zip(dense_q, sparse_q)])]
        ids = sorted({int(p.id) for top in tops for p in top})
        payloads = {int(rec.id): rec.payload for rec in self.client.retrieve(self.collection, ids, with_payload=True)}
        for top in tops:
            for p in top:
                p.payload = payloads[int(p.id)]
        return [_result(top) for top in tops]

    def _exact_sparse(self, sparse_q, cand: np.ndarray) -> np.ndarray:
        """True sparse scores of the candidates, scored by Qdrant (BM25 with its IDF); 0 for no shared term."""
        models = _models()
        scores = dict.fromkeys(cand.tolist(), 0.0)
        if len(sparse_q.indices):
            res = self.client.query_points(
                self.collection, query=sparse_q, using=SPARSE, limit=len(cand), with_payload=False,
                query_filter=models.Filter(must=[models.HasIdCondition(has_id=cand.tolist())]))
            scores.update({int(p.id): float(p.score) for p in res.points})
        return np.array([scores[int(c)] for c in cand], dtype=np.float32)

    def _hybrid(self, dense_q: np.ndarray, sparse_q: list, k: int) -> list[SearchResult]:
        """Client-side fusion of the two top-``depth`` lists; ``sum`` scores every candidate exactly from its
        stored vectors (:func:`~medadapt.retrieval.fusion.hybrid_topk`)."""
        fc = self.config.fusion
        depth = max(k, fc.depth)
        dense_lists = self._query(DENSE, [v.tolist() for v in dense_q], depth)
        sparse_lists = self._query(SPARSE, sparse_q, depth)
        out = []
        for r, (dl, sl) in enumerate(zip(dense_lists, sparse_lists)):
            points = {int(p.id): p for p in dl + sl}
            if fc.method != "sum":
                fused = fuse_positions({int(p.id): float(p.score) for p in dl},
                                       {int(p.id): float(p.score) for p in sl}, fc, k)
                out.append(_result([points[p] for p, _ in fused], [s for _, s in fused]))
                continue
            cand = np.array(sorted(points), dtype=np.int64)
            records = {int(rec.id): rec for rec in self.client.retrieve(
                self.collection, cand.tolist(), with_vectors=[DENSE], with_payload=False)}
            dense = np.array([np.dot(records[int(c)].vector[DENSE], dense_q[r]) for c in cand], dtype=np.float32)
            positions, scores = hybrid_topk(cand, self._exact_sparse(sparse_q[r], cand), dense, fc.dense_weight, k)
            out.append(_result([points[int(p)] for p in positions], scores.tolist()))
        return out


def collection_manifest(client, collection: str):
    """``(manifest, collection info)`` of a collection written by :func:`export_to_qdrant`.

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
    """A ``QdrantClient`` for a server URL (``http://`` / ``https://``) or an existing embedded database folder
    (``QdrantClient(path=...)`` would create an empty one)."""
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


def _result(points: list, scores: list[float] | None = None) -> SearchResult:
    res = SearchResult()
    for i, p in enumerate(points):
        payload = p.payload or {}
        res.append(str(payload.get("doc_id", p.id)), p.score if scores is None else scores[i],
                   payload.get("text", ""), payload.get("title", ""))
    return res


def export_to_qdrant(client, collection: str, docs, model: Any, *, kind: str | None = None,
                     config: RetrieverConfig | None = None, vectors=None, cache=None, model_name: str | None = None,
                     recreate: bool = False, batch_size: int = 256, show_progress: bool = False) -> QdrantRetriever:
    """Write ``docs`` (ids, titles, texts) with their dense and/or sparse vectors to a Qdrant collection and
    return a :class:`QdrantRetriever` over it.

    Args:
        docs: a :class:`~medadapt.retrieval.docstore.Documents`.
        model: a name for :func:`medadapt.load`, a SentenceTransformer or an encoder. For ``lexical`` /
            ``hybrid`` a learned sparse encoder (e.g. HyReC) stores its term weights; any other model gets BM25
            sparse vectors (``config.lexical``, Qdrant's ``IDF`` modifier).
        kind: ``"dense"`` (default), ``"lexical"`` or ``"hybrid"`` (overrides ``config.kind``).
        vectors: precomputed document embeddings as a vector source (:mod:`medadapt.retrieval.scale`, in
            ``docs`` order); otherwise documents are encoded (a SentenceTransformer through the cache).
        recreate: drop an existing collection first. Without it an existing collection must hold the same
            vectors and model (points are upserted: a killed export resumes).

    Raises:
        IndexMismatchError: an existing collection of another dimension / distance, model or corpus.
        MedAdaptError: vectors that do not match the documents or the model.
    """
    models = _models()
    config = build_config(docs, config, kind, "export")
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
    normalized = uses_cosine(encoder) if config.uses_dense else None
    dim = embedding_dim(encoder) if config.uses_dense else None
    if config.uses_dense and dim is None:
        dim = int(np.asarray(encoder.encode_document(texts[:1], batch_size=1, show_progress=False)).shape[1])
    manifest = new_manifest(
        docs, config, encoder, model_name or name, embedding_dim=dim, normalized=normalized,
        build={"backend": "qdrant", "dense_vector": DENSE if config.uses_dense else None,
               "sparse_vector": SPARSE if sparse else None,
               "sparse_weights": None if not sparse else "bm25" if bm25 is not None else "learned"})
    meta = {META: manifest_data(manifest), COMPLETE: False}
    if bm25 is not None:
        meta[BM25_META] = bm25.to_json()
    if recreate and client.collection_exists(collection):
        client.delete_collection(collection)
    if client.collection_exists(collection):  # a killed export resumes
        _check_vector_params(collection, client.get_collection(collection), dim, normalized, sparse, meta)
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
    chunk = config.dense.chunk_size

    def chunks():
        """``(start, embeddings or None)`` per chunk of documents: from ``vectors``, or encoded."""
        if vectors is None or not config.uses_dense:
            for start in range(0, len(docs), chunk):
                yield start, (np.asarray(encoder.encode_document(
                    texts[start:start + chunk], batch_size=config.batch_size, show_progress=False),
                    dtype=np.float32) if config.uses_dense else None)
            return
        start = 0
        for _, batch in iter_batches(vectors, chunk):
            if batch.shape[1] != dim:
                raise MedAdaptError(f"the vectors have dimension {batch.shape[1]} but the model gives {dim}: "
                                    "they were not computed by this model")
            yield start, np.asarray(batch, dtype=np.float32)
            start += len(batch)
        if start != len(docs):
            raise MedAdaptError(f"the vector source gave {start} vectors for {len(docs)} documents")

    bar = progress(total=len(docs), desc=f"exporting to Qdrant ({collection})", unit="doc", disable=not show_progress)
    try:
        for start, emb in chunks():
            n = len(emb) if emb is not None else min(chunk, len(docs) - start)
            sp = (bm25_docs[start:start + n] if bm25_docs is not None else
                  encoder.encode_lexical(texts[start:start + n], "document", batch_size=config.batch_size)
                  if sparse else None)
            if emb is not None and normalized:
                emb = normalize_rows(emb)
            vecs = [{**({DENSE: emb[i].tolist()} if emb is not None else {}),
                     **({SPARSE: _sparse(models, sp[i])} if sp is not None else {})} for i in range(n)]
            payloads = [{"doc_id": docs.ids[i], "title": docs.titles[i], "text": docs.texts[i]}
                        for i in range(start, start + n)]
            client.upload_collection(collection, vecs, payloads, ids=list(range(start, start + n)),
                                     batch_size=batch_size, wait=True)  # upserts: a killed export resumes
            bar.update(n)
    finally:
        bar.close()
    client.update_collection(collection, metadata={META: meta[META], COMPLETE: True})
    return QdrantRetriever(client, collection, exact=True, _encoder=encoder)
