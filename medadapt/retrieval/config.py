"""Typed, validated configuration of retrieval indexes (pydantic, unknown keys refused).

``RetrieverConfig`` is saved inside every index manifest, so an index folder fully describes how it was
built and how it searches.
"""

from __future__ import annotations

from typing import Literal, Optional

from pydantic import Field, field_validator

from medadapt.config import Section

RetrieverKind = Literal["dense", "lexical", "hybrid"]
FusionMethod = Literal["minmax", "zscore", "rrf", "sum"]
Language = Literal["auto", "en", "zh", "none"]


class _Strict(Section):
    """Unknown keys and non-finite numbers are refused (:class:`medadapt.config.Section`)."""


class DenseConfig(_Strict):
    """FAISS index settings.

    Attributes:
        factory: any ``faiss.index_factory`` string (``"Flat"``, ``"HNSW32"``, ``"IVF4096,PQ64"``, ...);
            the metric is always inner product (vectors are normalised when the model's similarity is cosine).
        ef_construction / ef_search: HNSW graph build / search breadth (ignored by other indexes).
        nprobe: IVF lists visited per query (ignored by other indexes).
        train_size: vectors sampled to train IVF / PQ indexes (``None``: 64 per IVF list, at least 10k).
        use_gpu: ``"auto"`` moves the index to every visible GPU when faiss-gpu is installed (extra
            ``[gpu]``), ``True`` requires it, ``False`` stays on CPU.
        chunk_size: documents encoded (through the embedding cache) and added per step of a build.
        k_factor: refine indexes (``...,RFlat`` / ``...,Refine(SQfp16)``): the compressed index returns
            ``k_factor * k`` candidates that are re-scored with the refine codes (FAISS ``IndexRefine``).
        gpu_shard: with several GPUs, split the index across them (FAISS ``IndexShards`` through
            ``GpuMultipleClonerOptions.shard``: each GPU holds ``1/n`` of the vectors) instead of
            replicating it on each (more queries per second, each GPU holds all vectors).
    """

    factory: str = "Flat"
    ef_construction: int = Field(40, ge=1)
    ef_search: int = Field(64, ge=1)
    nprobe: int = Field(16, ge=1)
    train_size: Optional[int] = Field(None, ge=1)
    use_gpu: Literal["auto"] | bool = "auto"
    chunk_size: int = Field(16384, ge=1)
    k_factor: float = Field(1.0, ge=1)
    gpu_shard: bool = False

    @field_validator("factory")
    @classmethod
    def _non_empty(cls, v: str) -> str:
        if not v.strip():
            raise ValueError("factory must be a FAISS index_factory string such as 'Flat' or 'HNSW32'")
        return v.strip()


class LexicalConfig(_Strict):
    """BM25 settings (bm25s-compatible: same token pattern, stopwords, stemmer and Lucene scoring).

    Attributes:
        language: ``"en"`` (regex words, English stopwords, Snowball stemmer), ``"zh"`` (jieba search
            mode), ``"none"`` (regex words only) or ``"auto"`` (``"zh"`` when most characters are CJK).
        k1, b: BM25 parameters (bm25s defaults).
        stopwords: drop English stopwords (``"en"`` only).
        stem: apply the Snowball English stemmer (PyStemmer; ``"en"`` only).
    """

    language: Language = "auto"
    k1: float = Field(1.5, gt=0)
    b: float = Field(0.75, ge=0, le=1)
    stopwords: bool = True
    stem: bool = True


class FusionConfig(_Strict):
    """How hybrid retrieval combines its dense and lexical sides.

    ``dense_weight`` has one meaning in medadapt (HyReC eq. 9, :func:`~medadapt.retrieval.fusion.hybrid_score`)::

        score = lexical + dense_weight * dense

    taken over each method's scores: the raw scores (``sum``), min-max or z-score normalised scores
    (``minmax`` / ``zscore``), or reciprocal ranks (``rrf``). ``1`` weighs both sides equally, ``0``
    ignores the dense side (use ``kind="dense"`` for the dense side alone).

    Attributes:
        method: ``"minmax"`` / ``"zscore"`` sum of normalised scores, ``"rrf"``, or ``"sum"``: the raw scores,
            every candidate of either top-``depth`` list scored exactly (for a model whose dense and lexical
            scores are both dot products of L2-normalised vectors, such as HyReC: its NM sum, eq. 9).
        dense_weight: the dense side's weight (the lexical side's is 1); for a HyReC model use the weight
            it was trained with (``model.config.dense_weight``, 1 in the paper).
        depth: documents taken from each list before fusing.
        rrf_k: the RRF constant (60, as in Cormack et al. 2009).

    Format-1 index manifests (``dense_weight`` a convex share ``w``) convert on load to ``w / (1 - w)``.
    """

    method: FusionMethod = "minmax"
    dense_weight: float = Field(1.0, ge=0)
    depth: int = Field(100, ge=1)
    rrf_k: int = Field(60, ge=1)


class RetrieverConfig(_Strict):
    """What a :class:`~medadapt.retrieval.Retriever` indexes and how it searches."""

    kind: RetrieverKind = "dense"
    dense: DenseConfig = Field(default_factory=DenseConfig)
    lexical: LexicalConfig = Field(default_factory=LexicalConfig)
    fusion: FusionConfig = Field(default_factory=FusionConfig)
    batch_size: int = Field(64, ge=1, description="encoding batch size")

    @property
    def uses_dense(self) -> bool:
        return self.kind in ("dense", "hybrid")

    @property
    def uses_lexical(self) -> bool:
        return self.kind in ("lexical", "hybrid")
