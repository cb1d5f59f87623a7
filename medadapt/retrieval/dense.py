"""Dense index on FAISS: any ``index_factory`` string, inner product on (normalised) vectors.

Built ``chunk_size`` documents at a time (IVF / PQ trained first on a sample of ``train_size``). With faiss-gpu
(extra ``[gpu]``) the index is cloned to every visible GPU; saved files are CPU indexes. Searches are
thread-safe (GPU searches serialised by a lock: FAISS GPU resources are not thread-safe).
"""

from __future__ import annotations

import contextlib
import re
import threading
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np

from medadapt.errors import MedAdaptError
from medadapt.io import atomic_open
from medadapt.progress import progress
from medadapt.retrieval.config import DenseConfig
from medadapt.retrieval.errors import IndexCorruptError
from medadapt.retrieval.exact import normalize_rows, similarity_is_cosine

FILE = "dense.faiss"


def gpu_count() -> int:
    import faiss

    get = getattr(faiss, "get_num_gpus", None)
    return int(get()) if callable(get) else 0


def normalize(x: np.ndarray) -> np.ndarray:
    """float32, C-contiguous, L2-normalised rows (:func:`~medadapt.retrieval.exact.normalize_rows`)."""
    return normalize_rows(np.ascontiguousarray(x, dtype=np.float32))


def new_index(dim: int, factory: str):
    """``faiss.index_factory(dim, factory, METRIC_INNER_PRODUCT)`` with a clear error for bad strings."""
    import faiss

    try:
        return faiss.index_factory(int(dim), factory, faiss.METRIC_INNER_PRODUCT)
    except RuntimeError as exc:
        raise MedAdaptError(
            f"invalid FAISS factory string {factory!r} for dimension {dim} "
            f"({_faiss_message(exc)}; examples: 'Flat', 'HNSW32', 'IVF1024,Flat', 'IVF4096,PQ64')"
        ) from None


def _faiss_message(exc: BaseException) -> str:
    """The useful part of the first line of a FAISS error (``Error in ... at f:1: Error: 'x' failed: <msg>``)."""
    text = str(exc).strip()
    first = text.splitlines()[0] if text else type(exc).__name__
    match = re.match(r"Error in .*? at \S+:\d+: (.*)$", first)
    rest = match.group(1) if match else first
    for marker in ("failed: ", "Error: "):
        if marker in rest:
            rest = rest.rsplit(marker, 1)[-1]
            break
    return rest.strip() or first


def ivf_lists(index) -> int:
    """The number of IVF lists (``nlist``) of ``index``, 0 for non-IVF indexes."""
    import faiss

    ivf = faiss.try_extract_index_ivf(index)
    return int(ivf.nlist) if ivf is not None else 0


def default_train_size(index) -> int:
    return max(10_000, 64 * ivf_lists(index))


def check_trainable(index, factory: str, n_train: int, n_docs: int) -> None:
    """Refuse, before any encoding, an IVF index with more lists than training vectors (FAISS's k-means
    needs at least ``nlist`` points and warns below ``39 * nlist``)."""
    nlist = ivf_lists(index)
    if nlist and n_train < nlist:
        fit = max(1, n_docs // 39)
        raise MedAdaptError(
            f"FAISS factory {factory!r} has nlist={nlist} IVF lists but the corpus has only {n_docs} documents "
            f"({n_train} training vectors; IVF needs at least nlist, ideally 39 * nlist): use a smaller nlist "
            f"such as 'IVF{fit},Flat', or 'Flat' / 'HNSW32' for a corpus this small"
        )


class DenseIndex:
    """A CPU FAISS index (inner product) over document positions ``0..n-1``; ``normalized``: vectors are
    L2-normalised before adding and searching (cosine models). ``config``'s search settings apply now."""

    def __init__(self, index, config: DenseConfig | None = None, normalized: bool = True):
        self.config = config or DenseConfig()
        self.normalized = normalized
        self._cpu = index
        self._lock = threading.Lock()
        self._search_index = index
        self._on_gpu = False
        #: how the index was built (vectors trained on, seed, ...), recorded in the manifest's ``build``
        self.build_info: dict = {}
        self.apply_search_params()
        self._maybe_to_gpu()

    # ------------------------------------------------------------------ construction
    @classmethod
    def empty(cls, dim: int, config: DenseConfig | None = None, normalized: bool = True) -> DenseIndex:
        config = config or DenseConfig()
        index = new_index(dim, config.factory)
        hnsw = _hnsw(index)
        if hnsw is not None:
            hnsw.efConstruction = config.ef_construction
        return cls(index, config, normalized)

    @property
    def dim(self) -> int:
        return int(self._cpu.d)

    @property
    def ntotal(self) -> int:
        return int(self._search_index.ntotal)

    @property
    def is_trained(self) -> bool:
        return bool(self._cpu.is_trained)

    def _prep(self, x: np.ndarray) -> np.ndarray:
        x = np.ascontiguousarray(x, dtype=np.float32)
        if x.ndim != 2 or x.shape[1] != self.dim:
            raise ValueError(f"expected vectors of shape (n, {self.dim}), got {x.shape}")
        return normalize(x) if self.normalized else x

    def train(self, sample: np.ndarray) -> None:
        """Train IVF / PQ components (no-op for indexes that need none); too few vectors for the IVF lists,
        or FAISS refusing to train, is a :class:`MedAdaptError`."""
        if not self._cpu.is_trained:
            check_trainable(self._cpu, self.config.factory, len(sample), len(sample))
            try:
                self._search_index.train(self._prep(sample))
                self.build_info["n_train"] = int(len(sample))
            except RuntimeError as exc:
                raise MedAdaptError(f"FAISS cannot train {self.config.factory!r} on {len(sample)} vectors "
                                    f"({_faiss_message(exc)}); try a smaller nlist / fewer PQ bits, or 'Flat'"
                                    ) from None

    def add(self, vectors: np.ndarray) -> None:
        if not self._search_index.is_trained:
            raise MedAdaptError(f"FAISS index {self.config.factory!r} must be trained before adding vectors")
        with self._lock:
            self._search_index.add(self._prep(vectors))

    @classmethod
    def build(cls, vectors: np.ndarray, config: DenseConfig | None = None, normalized: bool = True,
              seed: int = 0) -> DenseIndex:
        """Build from vectors already in memory (trained on a random sample when needed)."""
        return cls.build_chunked(len(vectors), lambda positions: vectors[positions], vectors.shape[1], config,
                                 normalized, seed, show_progress=False)

    @classmethod
    def build_chunked(
        cls,
        n_docs: int,
        embed: Callable[[np.ndarray], np.ndarray],
        dim: int,
        config: DenseConfig | None = None,
        normalized: bool = True,
        seed: int = 0,
        show_progress: bool = True,
    ) -> DenseIndex:
        """Build by calling ``embed(positions)`` (e.g. through the embedding cache) for one chunk of document
        positions at a time; trainable indexes first embed a random sample of ``train_size`` documents."""
        config = config or DenseConfig()
        index = cls.empty(dim, config, normalized)
        if not index.is_trained:
            n = min(n_docs, config.train_size or default_train_size(index._cpu))
            check_trainable(index._cpu, config.factory, n, n_docs)  # before encoding the sample
            rng = np.random.default_rng(seed)
            index.train(embed(np.sort(rng.choice(n_docs, n, replace=False))))
        bar = progress(total=n_docs, desc=f"indexing ({config.factory})", unit="doc", disable=not show_progress)
        try:
            for start in range(0, n_docs, config.chunk_size):
                positions = np.arange(start, min(n_docs, start + config.chunk_size))
                index.add(embed(positions))
                bar.update(len(positions))
        finally:
            bar.close()
        return index

    @classmethod
    def build_from_model(cls, encoder, texts: Sequence[str], config: DenseConfig | None = None,
                         batch_size: int = 64, show_progress: bool = True) -> DenseIndex:
        """Encode ``texts`` with ``encoder.encode_document`` chunk by chunk (a
        :class:`~medadapt.retrieval.encoders.DenseEncoder`), normalised when its similarity is cosine."""
        normalized = uses_cosine(encoder)

        def embed(positions: np.ndarray) -> np.ndarray:
            return np.asarray(encoder.encode_document([texts[int(i)] for i in positions], batch_size=batch_size,
                                                      show_progress=False), dtype=np.float32)

        dim = embedding_dim(encoder)
        if dim is None:
            dim = int(embed(np.arange(1)).shape[1])
        return cls.build_chunked(len(texts), embed, int(dim), config, normalized, show_progress=show_progress)

    # ------------------------------------------------------------------ search
    def apply_search_params(self) -> None:
        """Set ``efSearch`` / ``nprobe`` on whatever index type the factory produced."""
        import faiss

        ps = faiss.ParameterSpace()
        hnsw = _hnsw(self._cpu)
        if hnsw is not None:
            hnsw.efSearch = self.config.ef_search
        ivf = faiss.try_extract_index_ivf(self._cpu)
        if ivf is not None:
            ps.set_index_parameter(self._cpu, "nprobe", self.config.nprobe)
            quantizer = _hnsw(faiss.downcast_index(ivf.quantizer))  # IVF..._HNSW: the coarse quantizer's graph
            if quantizer is not None:
                quantizer.efSearch = max(self.config.ef_search, self.config.nprobe)
        if hasattr(self._cpu, "k_factor"):  # IndexRefine / IndexRefineFlat (factory ``...,RFlat``)
            self._cpu.k_factor = float(self.config.k_factor)

    def search(self, queries: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
        """Top-``k`` ``(scores, positions)`` per query, padded with ``-inf`` / ``-1``."""
        q = self._prep(queries)
        k = max(1, min(k, max(self.ntotal, 1)))
        with self._lock if self._on_gpu else contextlib.nullcontext():
            s, i = self._search_index.search(q, k)
        s = np.where(i < 0, -np.inf, s).astype(np.float32)
        return s, i.astype(np.int64)

    def reconstruct(self, positions: np.ndarray) -> np.ndarray | None:
        """The stored vectors at ``positions`` (decoded), or ``None`` when the index type cannot give them back
        (e.g. IVF without a direct map)."""
        try:
            return self.cpu_index().reconstruct_batch(np.asarray(positions, dtype=np.int64))
        except RuntimeError:
            return None

    def reconstruct_all(self) -> np.ndarray:
        """All stored vectors (Flat-like indexes only); used by tests and exact re-scoring."""
        return self.cpu_index().reconstruct_n(0, self.ntotal)

    # ------------------------------------------------------------------ gpu
    def _maybe_to_gpu(self) -> None:
        use = self.config.use_gpu
        n = gpu_count() if use else 0
        if use is True and n == 0:
            raise MedAdaptError("use_gpu=True but no GPU is visible to FAISS: pip install 'medadapt[gpu]'")
        if n > 0:
            import faiss

            try:
                options = faiss.GpuMultipleClonerOptions()
                options.shard = bool(self.config.gpu_shard)  # IndexShards across the GPUs, else replicas
                self._search_index = faiss.index_cpu_to_all_gpus(self._cpu, options)
                self._on_gpu = True
            except RuntimeError:  # index type without a GPU implementation (e.g. HNSW): stay on CPU
                if use is True:
                    raise MedAdaptError(f"FAISS has no GPU implementation of {self.config.factory!r}") from None

    def cpu_index(self):
        if self._on_gpu:
            import faiss

            with self._lock:
                return faiss.index_gpu_to_cpu(self._search_index)
        return self._cpu

    # ------------------------------------------------------------------ persistence
    def save(self, folder: str | Path) -> None:
        """``faiss.write_index`` to a temporary file, then rename (atomic)."""
        import faiss

        folder = Path(folder)
        with atomic_open(folder / FILE, "wb") as f:
            f.write(faiss.serialize_index(self.cpu_index()).tobytes())

    @classmethod
    def load(cls, folder: str | Path, config: DenseConfig, normalized: bool, mmap: bool = False) -> DenseIndex:
        import faiss

        path = Path(folder) / FILE
        if not path.is_file():
            raise IndexCorruptError(f"{path}: dense index file is missing")
        try:
            flags = faiss.IO_FLAG_MMAP | faiss.IO_FLAG_READ_ONLY if mmap else 0
            index = faiss.read_index(str(path), flags)
        except RuntimeError as exc:
            msg = str(exc).strip().rsplit(": ", 1)[-1] if str(exc).strip() else type(exc).__name__
            raise IndexCorruptError(f"{path}: FAISS cannot read the index ({msg})") from None
        return cls(index, config, normalized)


def _hnsw(index):
    """The ``faiss.HNSW`` structure inside ``index`` (also behind IDMap / pre-transforms), or ``None``."""
    import faiss

    for _ in range(4):
        if hasattr(index, "hnsw"):
            return index.hnsw
        inner = getattr(index, "index", None)
        if inner is None:
            return None
        index = faiss.downcast_index(inner)
    return None


def uses_cosine(model) -> bool:
    """True when the model's ``similarity_fn_name`` is cosine (vectors normalised), False for dot; other
    similarities raise :class:`MedAdaptError`."""
    try:
        return similarity_is_cosine(getattr(model, "similarity_fn_name", None))
    except ValueError as exc:
        raise MedAdaptError(f"{exc} (inner-product retrieval)") from None


def embedding_dim(model) -> int | None:
    """The output dimension of a SentenceTransformer (either getter name) or of an encoder with an
    ``embedding_dim`` attribute; ``None`` when it is not known before encoding."""
    dim = getattr(model, "embedding_dim", None)
    if dim is not None:
        return int(dim() if callable(dim) else dim)
    getter = getattr(model, "get_embedding_dimension", None) or getattr(
        model, "get_sentence_embedding_dimension", None)
    return getter() if getter is not None else None
