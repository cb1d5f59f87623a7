"""The :class:`Retriever`: dense, lexical or hybrid search over a document store, saved as one checked folder.

Models are used through the protocols of :mod:`medadapt.retrieval.encoders`, never by class name. A model that
also gives learned sparse vectors (e.g. HyReC) fills the inverted index with them instead of BM25, so
``kind="hybrid"`` with ``FusionConfig(method="sum")`` is the exact ``lexical + dense_weight * dense``
(:func:`~medadapt.retrieval.fusion.hybrid_score`). ``search`` is thread-safe: only the model's tokenizer (HF
fast tokenizers are not thread-safe) is behind a lock. See docs/retrieval.md.
"""

from __future__ import annotations

import copy
import json
import shutil
import threading
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from medadapt import __version__
from medadapt.data.text import check_text
from medadapt.errors import DataError, MedAdaptError
from medadapt.io import atomic_save_npy, atomic_write_json
from medadapt.models import ALIASES
from medadapt.retrieval.config import RetrieverConfig
from medadapt.retrieval.dense import DenseIndex, embedding_dim, uses_cosine
from medadapt.retrieval.docstore import DocStore, Documents, doc_text
from medadapt.retrieval.encoders import (
    ST_TAG,
    DenseEncoder,
    HybridEncoder,
    SentenceTransformerEncoder,
    SparseEncoder,
    as_encoder,
    offers_sparse,
    open_encoder,
)
from medadapt.retrieval.errors import IndexCorruptError, IndexMismatchError
from medadapt.retrieval.fusion import fuse_positions, hybrid_topk
from medadapt.retrieval.inverted import to_csr, topk_rows
from medadapt.retrieval.late import MaxSimReranker
from medadapt.retrieval.lexical import LexicalIndex
from medadapt.retrieval.storage import (
    FORMAT,
    Manifest,
    ModelInfo,
    atomic_dir,
    file_infos,
    load_manifest,
    manifest_digest,
    write_manifest,
)

#: How often :meth:`Retriever.load` reads an index that is replaced while it reads it.
LOAD_ATTEMPTS = 3


@dataclass
class Hit:
    id: str
    score: float
    text: str
    title: str
    rank: int


@dataclass
class SearchResult:
    """Top-k documents for one query, best first."""

    ids: list[str] = field(default_factory=list)
    scores: list[float] = field(default_factory=list)
    texts: list[str] = field(default_factory=list)
    titles: list[str] = field(default_factory=list)

    def __len__(self) -> int:
        return len(self.ids)

    def __iter__(self) -> Iterator[Hit]:
        for r, (i, s, t, ti) in enumerate(zip(self.ids, self.scores, self.texts, self.titles), start=1):
            yield Hit(i, s, t, ti, r)

    def append(self, doc_id: str, score: float, text: str, title: str) -> None:
        self.ids.append(doc_id)
        self.scores.append(float(score))
        self.texts.append(text)
        self.titles.append(title)


def model_reference(name: str | Path) -> tuple[str, str]:
    """``(name, source)`` as a manifest records a model: a local folder as its absolute path (``"local"``:
    never looked up on the hub), a packaged alias as given (``"alias"``), anything else as a hub id."""
    key = str(name).strip()
    if key.lower() in ALIASES:
        return key, "alias"
    path = Path(key).expanduser()
    if path.is_dir():
        return str(path.resolve()), "local"
    return key, "hub"


def describe_model(model, name: str, source: str | None = None, *, document: bool = True) -> ModelInfo:
    """What the manifest records about ``model`` (an encoder or a SentenceTransformer): its
    ``encoder_identity()`` under ``name`` and, with ``document``, its ``document_fingerprint()`` if it has one."""
    encoder = as_encoder(model)
    ident = dict(encoder.encoder_identity())
    if not ident.get("fingerprint"):
        raise MedAdaptError(f"{type(encoder).__name__}.encoder_identity() gave no fingerprint")
    document_fn = getattr(encoder, "document_fingerprint", None) if document else None
    return ModelInfo(
        name=name,
        fingerprint=str(ident["fingerprint"]),
        similarity=ident.get("similarity") or getattr(encoder, "similarity_fn_name", None) or "cosine",
        max_seq_length=ident.get("max_seq_length"),
        query_prompt=ident.get("query_prompt") or "",
        document_prompt=ident.get("document_prompt") or "",
        source=source,
        document_fingerprint=str(document_fn()) if callable(document_fn) else None,
    )


def new_manifest(docs: Documents, config: RetrieverConfig, encoder, model_name: str | None, **fields) -> Manifest:
    """The manifest of a new index (or Qdrant collection) of ``docs``; ``encoder`` ``None``: BM25 only."""
    name, source = model_reference(model_name) if model_name else ("", None)
    return Manifest(medadapt_version=__version__, kind=config.kind,
                    encoder=encoder.encoder_tag if encoder is not None else ST_TAG,
                    model=describe_model(encoder, name, source) if encoder is not None else None,
                    corpus_hash=docs.content_hash(), n_docs=len(docs), config=config.model_dump(mode="json"),
                    **fields)


def build_config(docs: Documents, config: RetrieverConfig | None, kind: str | None, what: str = "index"
                 ) -> RetrieverConfig:
    """``config`` (default settings without one) with ``kind`` when given; an empty corpus is refused."""
    config = (config or RetrieverConfig()).model_copy()
    if kind is not None:
        config = RetrieverConfig(**{**config.model_dump(), "kind": kind})
    if len(docs) == 0:
        raise MedAdaptError(f"cannot {what} an empty corpus")
    return config


def search_queries(queries: Sequence[str], k: int) -> list[str]:
    """The argument check of every ``batch_search``: a list of queries (not one string) and ``k >= 1``; an
    empty or blank query, or one that is not valid Unicode text, is a :class:`~medadapt.errors.DataError`."""
    if isinstance(queries, str):
        raise TypeError("batch_search takes a list of queries; use search() for one query")
    if k < 1:
        raise ValueError("k must be >= 1")
    queries = list(queries)
    for n, query in enumerate(queries):
        if isinstance(query, str):
            if not query.strip():
                raise DataError(f"query {n} is empty" if len(queries) > 1 else "the query is empty")
            check_text(query, f"query {n}" if len(queries) > 1 else "the query")
    return queries


def with_fusion_defaults(config: RetrieverConfig, defaults: dict[str, Any], *, method: str | None = None,
                         dense_weight: float | None = None) -> RetrieverConfig:
    """``config`` with its fusion taken from an encoder's ``fusion_defaults``, except what the caller set
    explicitly (``method`` / ``dense_weight``: e.g. ``medadapt index --fusion`` / ``--dense-weight``)."""
    fusion = {**config.fusion.model_dump(), **{k: v for k, v in defaults.items() if k in ("method", "dense_weight")}}
    if method is not None:
        fusion["method"] = method
    if dense_weight is not None:
        fusion["dense_weight"] = dense_weight
    return RetrieverConfig(**{**config.model_dump(), "fusion": fusion})


def _listed(scores: np.ndarray, positions: np.ndarray) -> dict[int, float]:
    return {int(p): float(s) for s, p in zip(scores, positions) if p >= 0}


class Searcher:
    """What :class:`Retriever` and the Qdrant retriever share: ``kind`` and :meth:`search`."""

    config: RetrieverConfig

    @property
    def kind(self) -> str:
        return self.config.kind

    def search(self, query: str, k: int = 10) -> SearchResult:
        """Top-``k`` documents for one query."""
        return self.batch_search([query], k)[0]


class Retriever(Searcher):
    """Dense, lexical or hybrid retrieval. Build with :meth:`build`, reopen with :meth:`load`."""

    def __init__(self, config: RetrieverConfig, ids: list[str], docstore: DocStore | Documents,
                 model=None, dense: DenseIndex | None = None, lexical: LexicalIndex | None = None,
                 manifest: Manifest | None = None, reranker=None):
        self.config = config
        #: re-ranks each query's first-stage top ``reranker.depth`` (:class:`~medadapt.retrieval.late.MaxSimReranker`
        #: or anything with ``depth`` and ``rerank(query_texts, run, doc_texts)``); ``None``: the first stage alone
        self.reranker = reranker
        self.ids = ids
        self.docstore = docstore
        #: the encoder (:mod:`medadapt.retrieval.encoders`); ``None`` for a BM25-only index
        self.encoder = as_encoder(model) if model is not None else None
        #: the model as given (a SentenceTransformer for the sentence-transformers adapter)
        self.model = self.encoder.model if isinstance(self.encoder, SentenceTransformerEncoder) else self.encoder
        self.dense = dense
        self.lexical = lexical
        self.manifest = manifest
        self._encode_lock = threading.Lock()
        sparse_encoder = isinstance(self.encoder, SparseEncoder)
        if config.uses_lexical and lexical is None:
            raise MedAdaptError(f"a {config.kind} retriever needs a lexical index")
        if config.uses_lexical and self.learned_sparse and not sparse_encoder:
            raise MedAdaptError("a learned sparse lexical index needs an encoder that gives sparse vectors "
                                "(encode_lexical + n_terms), such as the model that built it")
        if config.uses_lexical and not self.learned_sparse and sparse_encoder:
            raise MedAdaptError(f"the {self.encoder.encoder_tag!r} encoder gives learned sparse vectors: its "
                                "lexical index must hold them, not BM25")
        if config.uses_dense and (dense is None or not isinstance(self.encoder, DenseEncoder)):
            raise MedAdaptError(f"a {config.kind} retriever needs a dense encoder and a dense index")

    @property
    def learned_sparse(self) -> bool:
        """The lexical index holds an encoder's learned sparse vectors (queries are encoded by it), not BM25."""
        return self.lexical is not None and self.lexical.weighting is None

    def __len__(self) -> int:
        return len(self.ids)

    # ------------------------------------------------------------------ build
    @classmethod
    def build(cls, docs: Documents, model: Any = None, kind: str | None = None,
              config: RetrieverConfig | None = None, cache=None, model_name: str | None = None,
              show_progress: bool = True) -> Retriever:
        """Index ``docs`` with ``model`` (an encoder, a ``SentenceTransformer`` or a name for :func:`medadapt.load`;
        one of learned sparse vectors fills the lexical index instead of BM25). ``kind`` overrides
        ``config.kind``; without a ``config`` an encoder's ``fusion_defaults`` set the fusion; ``cache`` holds a
        SentenceTransformer's documents; ``model_name`` (default: ``model`` when it is a name) is recorded so
        :meth:`load` can reload the model."""
        given = config is not None
        config = build_config(docs, config, kind)
        encoder, name = _build_encoder(model, config, cache)
        if not given and getattr(encoder, "fusion_defaults", None):  # e.g. a HyReC model's tuned NM sum
            config = with_fusion_defaults(config, encoder.fusion_defaults)
        sparse = config.uses_lexical and isinstance(encoder, SparseEncoder)
        if config.uses_dense and not isinstance(encoder, DenseEncoder):
            raise MedAdaptError(f"a {config.kind} index needs a dense model (e.g. model='minilm')")
        texts = docs.indexed_texts()
        dense = lexical = None
        vecs = sparse_vecs = None
        if isinstance(encoder, HybridEncoder) and (config.uses_dense or sparse):  # both sides in one pass
            vecs, sparse_vecs = encoder.encode(texts, "document", dense=config.uses_dense, lexical=sparse,
                                               batch_size=config.batch_size, show_progress=show_progress,
                                               desc="encoding documents")
        elif sparse:
            sparse_vecs = encoder.encode_lexical(texts, "document", batch_size=config.batch_size,
                                                 show_progress=show_progress)
        if vecs is not None:
            dense = DenseIndex.build(np.ascontiguousarray(vecs, dtype=np.float32), config.dense,
                                     normalized=uses_cosine(encoder))
        elif config.uses_dense:
            dense = DenseIndex.build_from_model(encoder, texts, config.dense, config.batch_size, show_progress)
        if sparse:
            lexical = LexicalIndex.from_sparse(sparse_vecs, n_terms=encoder.n_terms, config=config.lexical)
        elif config.uses_lexical:
            lexical = LexicalIndex.build_bm25(texts, config.lexical, show_progress)
        used = encoder if dense is not None or sparse else None
        manifest = new_manifest(docs, config, used, model_name or name,
                                embedding_dim=dense.dim if dense else None,
                                normalized=dense.normalized if dense else None,
                                build=(dense.build_info or None) if dense else None)
        return cls(config, list(docs.ids), docs, used, dense, lexical, manifest)

    # ------------------------------------------------------------------ search
    def document(self, position: int) -> dict[str, str]:
        if isinstance(self.docstore, Documents):
            d = self.docstore
            return {"_id": d.ids[position], "title": d.titles[position], "text": d.texts[position]}
        return self.docstore.get(position)

    def _result(self, scores: Sequence[float], positions: Sequence[int]) -> SearchResult:
        res = SearchResult()
        for s, p in zip(scores, positions):
            if p >= 0 and np.isfinite(s):
                doc = self.document(int(p))
                res.append(self.ids[int(p)], s, doc["text"], doc.get("title", ""))
        return res

    def encode_queries(self, queries: Sequence[str]) -> np.ndarray:
        """Query embeddings through the encoder's ``encode_query`` (serialised: tokenizers are not thread-safe)."""
        with self._encode_lock:
            emb = self.encoder.encode_query(list(queries), batch_size=self.config.batch_size)
        return np.ascontiguousarray(emb, dtype=np.float32)

    def _lexical_queries(self, queries: list[str]):
        """Sparse query matrix: BM25 query terms, or the encoder's learned sparse query vectors."""
        if not self.learned_sparse:
            return self.lexical.encode_queries(queries)
        with self._encode_lock:
            vectors = self.encoder.encode_lexical(queries, "query", batch_size=self.config.batch_size)
        return to_csr(vectors, self.lexical.engine.n_terms)

    def with_reranker(self, reranker: Any = None, **options: Any) -> Retriever:
        """This retriever (indexes shared, not copied) with ``reranker`` re-ranking its results; ``options``
        alone (``weight=0.7, depth=100, ...``) build a :class:`~medadapt.retrieval.late.MaxSimReranker` over the
        index's own model; ``with_reranker(None)`` without options: the first stage alone."""
        if reranker is None and options:
            if self.model is None or not hasattr(self.model, "encode_query"):
                raise MedAdaptError("MaxSim re-ranking needs the index's sentence-transformers model (a BM25 index "
                                    "has none): pass MaxSimReranker(model, ...)")
            reranker = MaxSimReranker(self.model, **options)
        elif options:
            raise MedAdaptError("with_reranker: give a reranker or its options, not both")
        out = copy.copy(self)
        out.reranker = reranker
        return out

    def batch_search(self, queries: Sequence[str], k: int = 10, *, query_embeddings: np.ndarray | None = None
                     ) -> list[SearchResult]:
        """Top-``k`` documents for each query (ids, scores, texts, titles), best first; ``query_embeddings``
        skips query encoding (e.g. embeddings from the cache). With a :attr:`reranker`, the first stage's top
        ``max(k, reranker.depth)`` are re-ranked and the best ``k`` returned (scores: the fused ones)."""
        queries = search_queries(queries, k)
        if not queries:
            return []
        if self.reranker is None:
            return self._first_stage(queries, k, query_embeddings)
        first = self._first_stage(queries, max(k, self.reranker.depth), query_embeddings)
        return self._reranked(queries, first, k)

    def _reranked(self, queries: list[str], first: list[SearchResult], k: int) -> list[SearchResult]:
        """``first`` re-ranked by :attr:`reranker`, ``k`` per query."""
        hits = {h.id: h for res in first for h in res}
        run = {str(i): dict(zip(res.ids, res.scores)) for i, res in enumerate(first)}
        with self._encode_lock:  # the reranker's model may be the query encoder (tokenizers are not thread-safe)
            reranked = self.reranker.rerank({str(i): q for i, q in enumerate(queries)}, run,
                                            {d: doc_text(h.title, h.text) for d, h in hits.items()})
        out = []
        for i in range(len(queries)):
            res = SearchResult()
            for d, score in list(reranked[str(i)].items())[:k]:
                res.append(d, score, hits[d].text, hits[d].title)
            out.append(res)
        return out

    def _first_stage(self, queries: list[str], k: int, query_embeddings: np.ndarray | None) -> list[SearchResult]:
        if self.kind == "lexical":
            s, p = self.lexical.search(self._lexical_queries(queries), k)
            return [self._result(s[r], p[r]) for r in range(len(queries))]
        q = query_embeddings if query_embeddings is not None else self.encode_queries(queries)
        if self.kind == "dense":
            s, p = self.dense.search(q, k)
            return [self._result(s[r], p[r]) for r in range(len(queries))]
        fc = self.config.fusion
        depth = max(k, fc.depth)
        if fc.method == "sum":
            out = self._hybrid_rescored(queries, q, k, depth)
            if out is not None:
                return out
        ds, dp = self.dense.search(q, depth)
        ls, lp = self.lexical.search(self._lexical_queries(queries), depth)
        fused = [fuse_positions(_listed(ds[r], dp[r]), _listed(ls[r], lp[r]), fc, k) for r in range(len(queries))]
        return [self._result([s for _, s in f], [p for p, _ in f]) for f in fused]

    def _hybrid_rescored(self, queries: list[str], q: np.ndarray, k: int, depth: int
                         ) -> list[SearchResult] | None:
        """``sum`` fusion scored exactly: every candidate of either top-``depth`` list gets its true lexical
        score (0 without a shared term) and its dense score from the stored vectors
        (:func:`~medadapt.retrieval.fusion.hybrid_topk`, HyReC's NM sum). ``None`` when the dense index cannot
        give its vectors back (the caller then fuses the two lists)."""
        fc = self.config.fusion
        ds, dp = self.dense.search(q, depth)
        lex_all = self.lexical.engine.score(self._lexical_queries(queries))
        _, lp = topk_rows(lex_all, min(depth, self.lexical.n_docs))
        qp = self.dense._prep(q)
        out = []
        for r in range(len(queries)):
            cand = np.unique(np.concatenate([dp[r][dp[r] >= 0], lp[r][lp[r] >= 0]]))
            vecs = self.dense.reconstruct(cand)
            if vecs is None:
                return None
            lex = np.asarray(lex_all[r, cand].todense()).ravel() if len(cand) else np.zeros(0)
            positions, scores = hybrid_topk(cand, lex, vecs @ qp[r], fc.dense_weight, k)  # ties by position
            out.append(self._result(scores.tolist(), positions.tolist()))
        return out

    # ------------------------------------------------------------------ persistence
    def save(self, folder: str | Path) -> Path:
        """Write the index folder atomically; a folder :func:`medadapt.io.check_output` refuses (a file, a
        non-empty folder that is not an index, ...) is a ConfigError and nothing is changed."""
        if self.manifest is None:
            raise MedAdaptError("this retriever has no manifest")
        folder = Path(folder)
        with atomic_dir(folder) as tmp:
            atomic_write_json(tmp / "doc_ids.json", self.ids, indent=None)
            if isinstance(self.docstore, Documents):
                DocStore.write(tmp, self.docstore)
            else:
                shutil.copyfile(self.docstore.path, tmp / "docs.jsonl")
                atomic_save_npy(tmp / "docs.offsets.npy", self.docstore.offsets)
            for index in (self.dense, self.lexical):
                if index is not None:
                    index.save(tmp)
            names = sorted(p.name for p in tmp.iterdir())  # every file written, the manifest comes last
            manifest = self.manifest.model_copy(update={"files": file_infos(tmp, names)})
            write_manifest(tmp, manifest)
        self.manifest = manifest
        return folder

    @classmethod
    def load(cls, folder: str | Path, model: Any = None, device: str | None = None, verify: bool = True,
             mmap: bool = False) -> Retriever:
        """Open a saved index; ``model`` ``None`` reloads the recorded model, a given one is checked against it;
        ``verify`` checks every file's SHA-256 (sizes always); ``mmap`` memory-maps the FAISS file.

        Raises:
            IndexMismatchError: another model than the index's, or its recorded local model folder is gone.
            IndexCorruptError: a file (the manifest included) is missing, truncated, modified or unreadable, or
                the index kept changing while being read: a folder replaced meanwhile is read again (up to
                :data:`LOAD_ATTEMPTS` times), so one version's manifest never meets another's files.
        """
        folder = Path(folder)
        encoders: dict = {}  # a model loaded once serves every attempt
        for _ in range(LOAD_ATTEMPTS):
            manifest, digest = load_manifest(folder, verify=verify)
            try:
                retriever = cls._load_version(folder, manifest, model, device, mmap, encoders)
            except (MedAdaptError, OSError):
                if manifest_digest(folder) != digest:
                    continue  # replaced while reading: the error belongs to the mix, not to either version
                raise
            if manifest_digest(folder) == digest:
                return retriever
        raise IndexCorruptError(f"{folder}: the index changed while being read ({LOAD_ATTEMPTS} attempts); "
                                "try again when it is no longer being rewritten")

    @classmethod
    def _load_version(cls, folder: Path, manifest: Manifest, model, device, mmap: bool,
                      encoders: dict) -> Retriever:
        """The index files read by path, checked against ``manifest`` (see :meth:`load`)."""
        try:
            config = RetrieverConfig.model_validate(_current_config(manifest, folder))
        except ValueError as exc:
            raise IndexCorruptError(f"{folder}: invalid retriever config in manifest ({exc})") from None
        if manifest.format != FORMAT:
            manifest = manifest.model_copy(update={"format": FORMAT, "config": config.model_dump(mode="json")})
        try:
            ids = json.loads((folder / "doc_ids.json").read_text(encoding="utf-8"))
        except (OSError, ValueError) as exc:
            raise IndexCorruptError(f"{folder / 'doc_ids.json'}: cannot read ({exc})") from None
        if not isinstance(ids, list) or len(ids) != manifest.n_docs:
            raise IndexCorruptError(f"{folder}: doc_ids.json does not hold {manifest.n_docs} ids")
        docstore = DocStore.open(folder, ids)
        dense = lexical = None
        if config.uses_lexical:
            lexical = LexicalIndex.load(folder)
            if lexical.n_docs != manifest.n_docs:
                raise IndexCorruptError(f"{folder}: lexical index holds {lexical.n_docs} documents, "
                                        f"manifest says {manifest.n_docs}")
        encoder = None  # a learned sparse index encodes its lexical queries with the model too
        if config.uses_dense or (lexical is not None and lexical.weighting is None):
            encoder = _check_model(folder, manifest, model, device, config.uses_dense, encoders)
        if config.uses_dense:
            dense = DenseIndex.load(folder, config.dense, bool(manifest.normalized), mmap=mmap)
            if dense.ntotal != manifest.n_docs or dense.dim != manifest.embedding_dim:
                raise IndexCorruptError(f"{folder}: dense index holds {dense.ntotal}×{dense.dim} vectors, "
                                        f"manifest says {manifest.n_docs}×{manifest.embedding_dim}")
        return cls(config, ids, docstore, encoder, dense, lexical, manifest)


def _build_encoder(model, config: RetrieverConfig, cache) -> tuple[Any, str | None]:
    """``(encoder or None, name)`` for a build: a name is loaded when the index is dense / hybrid or the model
    gives learned sparse vectors; for a lexical index only an encoder of learned sparse vectors is kept (else
    BM25)."""
    if model is None:
        return None, None
    name = None
    if isinstance(model, (str, Path)):
        name = str(model)
        if not config.uses_dense and not offers_sparse(name):
            return None, None
    encoder = open_encoder(model, cache=cache)
    if not config.uses_dense and not isinstance(encoder, SparseEncoder):
        return None, None
    return encoder, name


def _current_config(manifest: Manifest, folder: Path) -> dict[str, Any]:
    """The manifest's retriever config in this version's meaning. Format 1 stored ``fusion.dense_weight`` as
    the convex share ``w`` of ``w * dense + (1 - w) * lexical``; the same ranking is ``lexical +
    w / (1 - w) * dense``."""
    config = dict(manifest.config)
    if manifest.format >= 2 or not isinstance(config.get("fusion"), dict):
        return config
    fusion = dict(config["fusion"])
    share = float(fusion.get("dense_weight", 0.5))
    if share >= 1.0:
        if config.get("kind") == "hybrid":
            raise MedAdaptError(f"{folder} (index format 1) fuses with dense_weight=1, i.e. the dense side alone; "
                                "rebuild it, or build a kind='dense' index")
        share = 0.5
    fusion["dense_weight"] = share / (1.0 - share)
    config["fusion"] = fusion
    return config


def _check_model(folder: Path, manifest: Manifest, model, device, dense: bool, encoders: dict | None = None):
    """The index's encoder: reloaded from the name its manifest records (a local folder only from that folder,
    never from the hub), or the given model; checked against the manifest (tag and fingerprint; for a dense
    index also dimension, similarity and prompts). ``encoders`` keeps models loaded by name across attempts."""
    tag = manifest.encoder
    info = manifest.model
    if info is None:
        raise IndexCorruptError(f"{folder}: {'dense' if dense else 'learned sparse'} index without model "
                                "information in its manifest")
    if model is None:
        if not info.name:
            raise MedAdaptError(f"{folder} was built from an in-memory model with no name; pass model=... to load it")
        model = info.name
        if info.source == "local" and not Path(info.name).is_dir():
            raise IndexMismatchError(f"{folder} was built with the model folder {info.name}, which is gone; "
                                     "pass the same model with --model / model=..., or rebuild the index")
    encoders = {} if encoders is None else encoders
    key = (tag, str(model), device)
    if isinstance(model, (str, Path)) and key not in encoders:
        encoders[key] = open_encoder(str(model), device=device)
    encoder = encoders[key] if isinstance(model, (str, Path)) else as_encoder(model)
    if encoder.encoder_tag != tag:
        raise IndexMismatchError(f"{folder} was built with a {tag!r} encoder; the given model is a "
                                 f"{encoder.encoder_tag!r} encoder")
    got = describe_model(encoder, info.name, document=False)
    if got.fingerprint != info.fingerprint:
        raise IndexMismatchError(
            f"{folder} was built with model {info.name!r} (fingerprint {info.fingerprint}) but the given model "
            f"has fingerprint {got.fingerprint}; search with the same model or rebuild the index"
        )
    if not dense:
        return encoder
    dim = embedding_dim(encoder)
    if dim is not None and dim != manifest.embedding_dim:
        raise IndexMismatchError(f"{folder}: index dimension {manifest.embedding_dim} != model dimension {dim}")
    if uses_cosine(encoder) != manifest.normalized:
        raise IndexMismatchError(f"{folder}: the model's similarity ({got.similarity}) differs from the index's")
    if (got.query_prompt, got.document_prompt) != (info.query_prompt, info.document_prompt):
        raise IndexMismatchError(f"{folder}: the model's query/document prompts differ from those used to build it")
    return encoder
