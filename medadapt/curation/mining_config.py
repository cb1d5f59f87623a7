"""Typed configuration of hard-negative mining, with the papers' settings as named presets (each system
contributes its paper's: :attr:`medadapt.systems.System.mining_presets`)."""

from __future__ import annotations

from typing import Any

from pydantic import Field, model_validator

from medadapt import systems
from medadapt.config import Section
from medadapt.errors import ConfigError

MINING_CONFIG_VERSION = 1


def presets() -> dict[str, dict[str, Any]]:
    """The named presets the registered systems contribute (see :mod:`medadapt.curation.negatives` for the
    papers' settings), by name."""
    found = {name: dict(values) for s in systems.registered() for name, values in s.mining_presets.items()}
    return dict(sorted(found.items()))


class MiningConfig(Section):
    """How to turn retrieved candidates into hard negatives.

    Attributes:
        window: inclusive 1-based rank window ``(lo, hi)``; positives count towards ranks. The retriever
            is asked for ``hi`` candidates.
        num_negatives: negatives per query (fewer when fewer are eligible).
        margin: relative false-negative margin: drop candidates scoring above
            ``pos_score - margin * |pos_score|`` (= ``pos_score * (1 - margin)`` for positive scores).
            With several positives the *lowest* positive score is used (the stricter guard).
        absolute_margin: drop candidates scoring above ``pos_score - absolute_margin``.
        text_dup_threshold: drop candidates whose character 3-gram Jaccard with any positive's text is at
            least this (``None`` disables). Used by :func:`mine_hard_negatives`.
        embedding_dup_threshold: drop candidates whose embedding cosine with any positive document is at
            least this (``None`` disables). Used by :func:`mine_from_embeddings`.
        seed: sampling seed; each query gets its own generator derived from ``(seed, query)``, so results
            do not depend on batch sizes or on which other queries are mined.
        with_scores: write ``pos_scores`` / ``neg_scores`` in the training groups.
        drop_empty: drop queries left with no negative.
    """

    version: int = MINING_CONFIG_VERSION
    window: tuple[int, int] = (20, 100)
    num_negatives: int = Field(3, ge=1)
    margin: float | None = Field(None, ge=0.0)
    absolute_margin: float | None = None
    text_dup_threshold: float | None = Field(0.8, gt=0.0, le=1.0)
    embedding_dup_threshold: float | None = Field(0.98, gt=-1.0, le=1.0)
    seed: int = 42
    with_scores: bool = True
    drop_empty: bool = True

    @model_validator(mode="after")
    def _check_window(self) -> MiningConfig:
        lo, hi = self.window
        if lo < 1 or hi < lo:
            raise ValueError(f"window must satisfy 1 <= lo <= hi, got ({lo}, {hi})")
        return self

    @property
    def depth(self) -> int:
        """How many candidates to retrieve per query (the window's upper rank)."""
        return self.window[1]

    @classmethod
    def preset(cls, name: str, **overrides) -> MiningConfig:
        """A config from a paper preset (:func:`presets`) plus overrides."""
        known = presets()
        if name not in known:
            raise ConfigError(f"unknown mining preset {name!r}; valid presets: {', '.join(known)}")
        return cls(**{**known[name], **overrides})
