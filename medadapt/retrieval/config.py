"""Typed, validated configuration of retrieval indexes (pydantic, unknown keys refused).

``RetrieverConfig`` is saved inside every index manifest, so an index folder fully describes how it was
built and how it searches.
"""

from __future__ import annotations

from typing import Literal, Optional

from pydantic import BaseModel, ConfigDict, Field, field_validator

RetrieverKind = Literal["dense", "lexical", "hybrid"]
FusionMethod = Literal["minmax", "zscore", "rrf", "sum"]
Language = Literal["auto", "en", "zh", "none"]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_assignment=True)


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
    """

    factory: str = "Flat"
    ef_construction: int = Field(40, ge=1)
    ef_search: int = Field(64, ge=1)
    nprobe: int = Field(16, ge=1)
    train_size: Optional[int] = Field(None, ge=1)
    use_gpu: Literal["auto"] | bool = "auto"
    chunk_size: int = Field(16384, ge=1)

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
    """How hybrid retrieval combines its dense and lexical lists.

    Attributes:
        method: ``"minmax"`` / ``"zscore"`` weighted sum of normalised scores, ``"rrf"``, or ``"sum"``: the
            weighted sum of the raw scores (for a HyReC model, whose dense and lexical scores are both dot
            products of L2-normalised vectors: HyReC's NM sum, eq. 9, up to scale).
        dense_weight: weight of the dense list; the lexical list gets ``1 - dense_weight``.
        depth: documents taken from each list before fusing.
        rrf_k: the RRF constant (60, as in Cormack et al. 2009).
    """

    method: FusionMethod = "minmax"
    dense_weight: float = Field(0.5, ge=0, le=1)
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
