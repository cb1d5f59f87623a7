"""Typed, validated configuration of retrieval indexes (:class:`medadapt.config.Section`: unknown keys and
non-finite numbers refused), saved inside every index manifest so a folder describes how it was built."""

from __future__ import annotations

from typing import Literal, Optional

from pydantic import Field, field_validator

from medadapt.config import Section

RetrieverKind = Literal["dense", "lexical", "hybrid"]
FusionMethod = Literal["minmax", "zscore", "rrf", "sum"]
Language = Literal["auto", "en", "zh", "none"]


class DenseConfig(Section):
    """FAISS index settings.

    Attributes:
        factory: any ``faiss.index_factory`` string (``"Flat"``, ``"HNSW32"``, ``"IVF4096,PQ64"``, ...), always
            inner product (vectors normalised for cosine models).
        ef_construction / ef_search: HNSW build / search breadth; nprobe: IVF lists visited per query.
        train_size: vectors sampled to train IVF / PQ indexes (``None``: 64 per IVF list, at least 10k).
        use_gpu: ``"auto"`` uses every visible GPU when faiss-gpu is installed, ``True`` requires one.
        chunk_size: documents encoded and added per step of a build.
        k_factor: refine indexes (``...,RFlat``) re-score ``k_factor * k`` candidates (FAISS ``IndexRefine``).
        gpu_shard: with several GPUs, split the index across them (``IndexShards``) instead of replicating it.
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


class LexicalConfig(Section):
    """BM25 settings, bm25s-compatible: ``language`` ``"en"`` (words, English stopwords, Snowball stems),
    ``"zh"`` (jieba), ``"none"`` (words only) or ``"auto"`` (``"zh"`` when most characters are CJK); ``k1`` /
    ``b`` (bm25s defaults); ``stopwords`` / ``stem`` apply to English only."""

    language: Language = "auto"
    k1: float = Field(1.5, gt=0)
    b: float = Field(0.75, ge=0, le=1)
    stopwords: bool = True
    stem: bool = True


class FusionConfig(Section):
    """How hybrid retrieval combines its sides: ``score = lexical + dense_weight * dense`` (HyReC eq. 9), over
    the raw scores (``sum``: every candidate of either top-``depth`` list scored exactly, e.g. HyReC's NM sum),
    min-max or z-score normalised scores, or reciprocal ranks (``rrf``, constant ``rrf_k``). ``dense_weight``
    1 weighs both sides equally (HyReC: the weight it was trained with); ``depth``: documents taken from each
    list. Format-1 manifests (a convex share ``w``) convert on load to ``w / (1 - w)``."""

    method: FusionMethod = "minmax"
    dense_weight: float = Field(1.0, ge=0)
    depth: int = Field(100, ge=1)
    rrf_k: int = Field(60, ge=1)


class RetrieverConfig(Section):
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
