"""The :class:`Retriever`: dense, lexical or hybrid search over a document store, saved as one folder.

Example::

    from medadapt.retrieval import Retriever, load_documents
    docs = load_documents("medmini")
    r = Retriever.build(docs, model="minilm", kind="hybrid")
    hit = r.search("what causes gout?", k=5)       # SearchResult(ids, scores, texts, titles)
    r.save("medmini.index")
    r = Retriever.load("medmini.index")            # refuses an index built with another model

Queries go through ``model.encode_query`` and documents through ``encode_document`` (asymmetric models
with query/document prompts or routes work). A :class:`~medadapt.hyrec.HyReCModel` (or its folder) encodes
both sides instead: its dense vectors go into FAISS and its learned sparse vectors into the inverted index,
so ``kind="lexical"`` searches with learned term weights and ``kind="hybrid"`` with
``FusionConfig(method="sum")`` is HyReC's NM sum (eq. 9). ``search`` is thread-safe: FAISS and scipy searches run
concurrently; only the model's tokenizer (HF fast tokenizers raise "Already borrowed" when shared
across threads) is behind a lock.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from medadapt.errors import MedAdaptError
from medadapt.retrieval.config import RetrieverConfig
from medadapt.retrieval.dense import DenseIndex, embedding_dim, model_uses_cosine
from medadapt.retrieval.docstore import Documents, DocStore
from medadapt.retrieval.errors import IndexCorruptError, IndexMismatchError
from medadapt.retrieval.fusion import fuse
from medadapt.retrieval.lexical import LexicalIndex
from medadapt.retrieval.storage import Manifest, ModelInfo, atomic_dir, file_infos, read_manifest, write_manifest


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


def is_hyrec(model) -> bool:
    """``model`` is a HyReC model (checked without importing the HyReC package for other models)."""
    return type(model).__name__ == "HyReCModel" and type(model).__module__.startswith("medadapt.hyrec")


def is_hyrec_folder(model) -> bool:
    return isinstance(model, (str, Path)) and (Path(model) / "hyrec" / "config.json").is_file()


def load_hyrec(model, device: str | None = None):
    from medadapt.hyrec import HyReCModel

    return HyReCModel.load(model, device=device)


def describe_model(model, name: str) -> ModelInfo:
    from medadapt.cache import effective_prompt
    from medadapt.models import model_fingerprint

    if is_hyrec(model):  # every module (dense side, lexicon encoder, projectors) and the bagging settings
        import hashlib
        import json

        ident = model_fingerprint(model) + json.dumps(model.config.to_dict(), sort_keys=True)
        return ModelInfo(name=name, fingerprint=hashlib.sha256(ident.encode()).hexdigest()[:32],
                         similarity="cosine", max_seq_length=model.config.passage_max_length)

    return ModelInfo(
        name=name,
        fingerprint=model_fingerprint(model),
        similarity=(getattr(model, "similarity_fn_name", None) or "cosine"),
        max_seq_length=getattr(model, "max_seq_length", None),
        query_prompt=effective_prompt(model, "query"),
        document_prompt=effective_prompt(model, "document"),
    )


class Retriever:
    """Dense, lexical or hybrid retrieval. Build with :meth:`build`, reopen with :meth:`load`."""

    def __init__(self, config: RetrieverConfig, ids: list[str], docstore: DocStore | Documents,
                 model=None, dense: DenseIndex | None = None, lexical: LexicalIndex | None = None,
                 manifest: Manifest | None = None):
        self.config = config
        self.ids = ids
        self.docstore = docstore
        self.model = model
        self.dense = dense
        self.lexical = lexical
        self.manifest = manifest
        self._encode_lock = threading.Lock()
        self.hyrec = is_hyrec(model)
        if self.hyrec and config.uses_lexical and lexical is not None and lexical.weighting is not None:
            raise MedAdaptError("a HyReC retriever needs a learned sparse index, not BM25")
        if config.uses_dense and (dense is None or model is None):
            raise MedAdaptError(f"a {config.kind} retriever needs a model and a dense index")
        if config.uses_lexical and lexical is None:
            raise MedAdaptError(f"a {config.kind} retriever needs a lexical index")

    @property
    def kind(self) -> str:
        return self.config.kind

    def __len__(self) -> int:
        return len(self.ids)

    # ------------------------------------------------------------------ build
    @classmethod
    def build(cls, docs: Documents, model: Any = None, kind: str | None = None,
              config: RetrieverConfig | None = None, cache=None, model_name: str | None = None,
              show_progress: bool = True) -> Retriever:
        """Index ``docs``.

        Args:
            docs: a :class:`Documents` (see :func:`~medadapt.retrieval.load_documents`).
            model: a ``SentenceTransformer`` or a name for :func:`medadapt.load` (dense / hybrid only), or
                a :class:`~medadapt.hyrec.HyReCModel` / HyReC folder (any kind: it also gives the learned
                lexical vectors; documents are encoded in one pass, without the embedding cache).
            kind: ``"dense"``, ``"lexical"`` or ``"hybrid"`` (overrides ``config.kind``).
            config: :class:`RetrieverConfig` (FAISS factory, BM25 and fusion settings).
            cache: an :class:`~medadapt.cache.EmbeddingCache` for document embeddings (default cache dir).
            model_name: recorded in the manifest so :meth:`load` can reload the model (default: ``model``
                when it is a string).
        """
        config = (config or RetrieverConfig()).model_copy()
        if kind is not None:
            config = RetrieverConfig(**{**config.model_dump(), "kind": kind})
        if len(docs) == 0:
            raise MedAdaptError("cannot index an empty corpus")
        dense = lexical = None
        if is_hyrec_folder(model):
            model_name = model_name or str(model)
            model = load_hyrec(model)
        if is_hyrec(model):
            vecs, sparse = model.encode(docs.indexed_texts(), "document", dense=config.uses_dense,
                                        lexical=config.uses_lexical, batch_size=config.batch_size,
                                        show_progress=show_progress, desc="encoding documents")
            if config.uses_dense:
                dense = DenseIndex.build(np.ascontiguousarray(vecs, dtype=np.float32), config.dense)
            if config.uses_lexical:
                lexical = LexicalIndex.from_sparse(sparse, n_terms=model.n_terms, config=config.lexical)
        elif config.uses_dense:
            if model is None:
                raise MedAdaptError(f"a {config.kind} index needs a model (e.g. model='minilm')")
            if isinstance(model, (str, Path)):
                from medadapt.models import load

                model_name = model_name or str(model)
                model = load(str(model))
            dense = DenseIndex.build_from_model(model, docs.indexed_texts(), cache, config.dense,
                                                config.batch_size, show_progress)
        if config.uses_lexical and lexical is None:
            lexical = LexicalIndex.build_bm25(docs.indexed_texts(), config.lexical, show_progress)
        hyrec = is_hyrec(model)
        info = describe_model(model, model_name or "") if dense is not None or hyrec else None
        from medadapt import __version__

        manifest = Manifest(
            medadapt_version=__version__, kind=config.kind, encoder="hyrec" if hyrec else "sentence-transformers",
            model=info,
            embedding_dim=dense.dim if dense else None, normalized=dense.normalized if dense else None,
            corpus_hash=docs.content_hash(), n_docs=len(docs), config=config.model_dump(mode="json"),
        )
        return cls(config, list(docs.ids), docs, model if dense or hyrec else None, dense, lexical, manifest)

    # ------------------------------------------------------------------ documents
    def document(self, position: int) -> dict[str, str]:
        if isinstance(self.docstore, Documents):
            d = self.docstore
            return {"_id": d.ids[position], "title": d.titles[position], "text": d.texts[position]}
        return self.docstore.get(position)

    def _result(self, scores: Sequence[float], positions: Sequence[int]) -> SearchResult:
        res = SearchResult()
        for s, p in zip(scores, positions):
            if p < 0 or not np.isfinite(s):
                continue
            doc = self.document(int(p))
            res.ids.append(self.ids[int(p)])
            res.scores.append(float(s))
            res.texts.append(doc["text"])
            res.titles.append(doc.get("title", ""))
        return res

    # ------------------------------------------------------------------ search
    def encode_queries(self, queries: Sequence[str]) -> np.ndarray:
        """Query embeddings through ``model.encode_query`` (serialised: tokenizers are not thread-safe)."""
        with self._encode_lock:
            if self.hyrec:
                return np.ascontiguousarray(self.model.encode_dense(list(queries), "query",
                                                                    batch_size=self.config.batch_size),
                                            dtype=np.float32)
            return np.asarray(
                self.model.encode_query(list(queries), batch_size=self.config.batch_size,
                                        convert_to_numpy=True, show_progress_bar=False), dtype=np.float32)

    def _lexical_queries(self, queries: list[str]):
        """Sparse query matrix: BM25 query terms, or the HyReC model's learned query vectors."""
        if not self.hyrec:
            return self.lexical.encode_queries(queries)
        from medadapt.retrieval.inverted import to_csr

        with self._encode_lock:
            vectors = self.model.encode_lexical(queries, "query", batch_size=self.config.batch_size)
        return to_csr(vectors, self.lexical.engine.n_terms)

    def _lexical_search(self, queries: list[str], k: int) -> tuple[np.ndarray, np.ndarray]:
        return self.lexical.search(self._lexical_queries(queries), k)

    def search(self, query: str, k: int = 10) -> SearchResult:
        """Top-``k`` documents for one query."""
        return self.batch_search([query], k)[0]

    def batch_search(self, queries: Sequence[str], k: int = 10, *, query_embeddings: np.ndarray | None = None
                     ) -> list[SearchResult]:
        """Top-``k`` documents for each query (ids, scores, texts, titles), best first.

        ``query_embeddings`` skips query encoding (e.g. embeddings from the cache).
        """
        if isinstance(queries, str):
            raise TypeError("batch_search takes a list of queries; use search() for one query")
        if k < 1:
            raise ValueError("k must be >= 1")
        queries = list(queries)
        if not queries:
            return []
        kind = self.config.kind
        if kind == "lexical":
            s, p = self._lexical_search(queries, k)
            return [self._result(s[r], p[r]) for r in range(len(queries))]
        q = query_embeddings if query_embeddings is not None else self.encode_queries(queries)
        if kind == "dense":
            s, p = self.dense.search(q, k)
            return [self._result(s[r], p[r]) for r in range(len(queries))]
        return self._hybrid(queries, q, k)

    def _hybrid(self, queries: list[str], q: np.ndarray, k: int) -> list[SearchResult]:
        fc = self.config.fusion
        depth = max(k, fc.depth)
        if fc.method == "sum":
            out = self._hybrid_rescored(queries, q, k, depth)
            if out is not None:
                return out
        ds, dp = self.dense.search(q, depth)
        ls, lp = self._lexical_search(queries, depth)
        out = []
        for r in range(len(queries)):
            dense = {int(p): float(s) for s, p in zip(ds[r], dp[r]) if p >= 0}
            lex = {int(p): float(s) for s, p in zip(ls[r], lp[r]) if p >= 0}
            fused = fuse([_keyed(dense), _keyed(lex)], fc.method, [fc.dense_weight, 1 - fc.dense_weight], k,
                         fc.rrf_k)
            out.append(self._result(list(fused.values()), [int(p) for p in fused]))
        return out

    def _hybrid_rescored(self, queries: list[str], q: np.ndarray, k: int, depth: int
                         ) -> list[SearchResult] | None:
        """``sum`` fusion scored exactly: every document of either top-``depth`` list gets its true lexical
        score (0 when it shares no term with the query) and its dense score from the index's stored vectors,
        so a HyReC hybrid equals the NM sum over the candidates. ``None`` when the dense index cannot give
        its vectors back (the caller then fuses the two lists)."""
        from medadapt.retrieval.inverted import topk_rows

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
            dense = vecs @ qp[r]
            lex = np.asarray(lex_all[r, cand].todense()).ravel() if len(cand) else np.zeros(0)
            score = fc.dense_weight * dense + (1 - fc.dense_weight) * lex
            order = np.lexsort((cand, -score))[:k]  # ties by position, as in fuse()
            out.append(self._result(score[order].tolist(), cand[order].tolist()))
        return out

    # ------------------------------------------------------------------ persistence
    def save(self, folder: str | Path) -> Path:
        """Write the index folder atomically: manifest, documents, ``dense.faiss`` and/or lexical files."""
        if self.manifest is None:
            raise MedAdaptError("this retriever has no manifest")
        folder = Path(folder)
        with atomic_dir(folder) as tmp:
            names = ["doc_ids.json", "docs.jsonl", "docs.offsets.npy"]
            from medadapt.io import atomic_write_json

            atomic_write_json(tmp / "doc_ids.json", self.ids, indent=None)
            if isinstance(self.docstore, Documents):
                DocStore.write(tmp, self.docstore)
            else:
                import shutil

                shutil.copyfile(self.docstore.path, tmp / "docs.jsonl")
                from medadapt.io import atomic_save_npy

                atomic_save_npy(tmp / "docs.offsets.npy", self.docstore.offsets)
            if self.dense is not None:
                self.dense.save(tmp)
                names.append("dense.faiss")
            if self.lexical is not None:
                self.lexical.save(tmp)
                names += ["lexical.safetensors", "lexical.json"]
            manifest = self.manifest.model_copy(update={"files": file_infos(tmp, names)})
            write_manifest(tmp, manifest)
        self.manifest = manifest
        return folder

    @classmethod
    def load(cls, folder: str | Path, model: Any = None, device: str | None = None, verify: bool = True,
             mmap: bool = False) -> Retriever:
        """Open a saved index.

        Args:
            model: ``None`` reloads the model recorded in the manifest; a name or ``SentenceTransformer``
                is checked against the recorded fingerprint.
            verify: check every file's SHA-256 against the manifest (sizes are always checked).
            mmap: memory-map the FAISS file instead of reading it (large indexes).

        Raises:
            IndexMismatchError: ``model`` is not the model the index was built with.
            IndexCorruptError: a file is missing, truncated, modified or unreadable.
        """
        import json

        folder = Path(folder)
        manifest = read_manifest(folder, verify=verify)
        try:
            config = RetrieverConfig.model_validate(manifest.config)
        except ValueError as exc:
            raise IndexCorruptError(f"{folder}: invalid retriever config in manifest ({exc})") from None
        try:
            ids = json.loads((folder / "doc_ids.json").read_text(encoding="utf-8"))
        except (OSError, ValueError) as exc:
            raise IndexCorruptError(f"{folder / 'doc_ids.json'}: cannot read ({exc})") from None
        if not isinstance(ids, list) or len(ids) != manifest.n_docs:
            raise IndexCorruptError(f"{folder}: doc_ids.json does not hold {manifest.n_docs} ids")
        docstore = DocStore.open(folder, ids)
        dense = lexical = None
        if config.uses_dense or manifest.encoder == "hyrec":  # a HyReC index encodes lexical queries too
            model = _check_model(folder, manifest, model, device)
        if config.uses_dense:
            dense = DenseIndex.load(folder, config.dense, bool(manifest.normalized), mmap=mmap)
            if dense.ntotal != manifest.n_docs or dense.dim != manifest.embedding_dim:
                raise IndexCorruptError(f"{folder}: dense index holds {dense.ntotal}×{dense.dim} vectors, "
                                        f"manifest says {manifest.n_docs}×{manifest.embedding_dim}")
        elif manifest.encoder != "hyrec":
            model = None
        if config.uses_lexical:
            lexical = LexicalIndex.load(folder)
            if lexical.n_docs != manifest.n_docs:
                raise IndexCorruptError(f"{folder}: lexical index holds {lexical.n_docs} documents, "
                                        f"manifest says {manifest.n_docs}")
        return cls(config, ids, docstore, model, dense, lexical, manifest)


def _keyed(scores: dict[int, float]) -> dict[str, float]:
    """Fusion keys: zero-padded positions, so its id tie-break equals the position order."""
    return {f"{p:012d}": s for p, s in scores.items()}


def _check_model(folder: Path, manifest: Manifest, model, device):
    """The index's model: reloaded from the name its manifest records, or the given one, checked against it
    (a HyReC index needs a HyReC model and checks its fingerprint only)."""
    hyrec = manifest.encoder == "hyrec"
    info = manifest.model
    if info is None:
        raise IndexCorruptError(f"{folder}: {'HyReC' if hyrec else 'dense'} index without model information in "
                                "its manifest")
    if model is None:
        if not info.name:
            raise MedAdaptError(f"{folder} was built from an in-memory model with no name; pass model=... to load it")
        model = info.name
    if isinstance(model, (str, Path)):
        if hyrec:
            model = load_hyrec(model, device=device)
        else:
            from medadapt.models import load

            model = load(str(model), device=device)
    if hyrec != is_hyrec(model):
        raise IndexMismatchError(f"{folder} was built with {'a' if hyrec else 'no'} HyReC model; pass "
                                 f"{'a HyReCModel or its folder' if hyrec else 'a SentenceTransformer'}")
    got = describe_model(model, info.name)
    if got.fingerprint != info.fingerprint:
        raise IndexMismatchError(
            f"{folder} was built with model {info.name!r} (fingerprint {info.fingerprint}) but the given model "
            f"has fingerprint {got.fingerprint}; search with the same model or rebuild the index"
        )
    if hyrec:
        return model
    dim = embedding_dim(model)
    if dim is not None and dim != manifest.embedding_dim:
        raise IndexMismatchError(f"{folder}: index dimension {manifest.embedding_dim} != model dimension {dim}")
    if model_uses_cosine(model) != manifest.normalized:
        raise IndexMismatchError(f"{folder}: the model's similarity ({got.similarity}) differs from the index's")
    if (got.query_prompt, got.document_prompt) != (info.query_prompt, info.document_prompt):
        raise IndexMismatchError(f"{folder}: the model's query/document prompts differ from those used to build it")
    return model
