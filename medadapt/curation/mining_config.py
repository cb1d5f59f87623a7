"""Typed configuration of hard-negative mining, with the papers' settings as named presets (each system
contributes its paper's: :attr:`medadapt.systems.System.mining_presets`)."""

from __future__ import annotations

from typing import Any

from pydantic import Field, model_validator

from medadapt import systems
from medadapt.config import Section
from medadapt.curation.negatives import validate_window
from medadapt.errors import ConfigError

MINING_CONFIG_VERSION = 1


def presets() -> dict[str, dict[str, Any]]:
    """The named presets the registered systems contribute, by name."""
    found = {name: dict(values) for s in systems.registered() for name, values in s.mining_presets.items()}
    return dict(sorted(found.items()))


class MiningConfig(Section):
    """How retrieved candidates become hard negatives.

    Attributes:
        window: inclusive 1-based rank window ``(lo, hi)``, positives counted; ``hi`` candidates retrieved.
        margin: drop candidates scoring above ``pos_score - margin * |pos_score|``, with the lowest positive
            score (the stricter guard); ``absolute_margin``: above ``pos_score - absolute_margin``.
        text_dup_threshold / embedding_dup_threshold: drop candidates whose character 3-gram Jaccard
            (:func:`mine_hard_negatives`) / embedding cosine (:func:`mine_from_embeddings`) with a positive is
            at least this (``None``: off).
        seed: each query samples with its own generator from ``(seed, query)``.
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
        validate_window(self.window)
        return self

    @property
    def depth(self) -> int:
        return self.window[1]

    @classmethod
    def preset(cls, name: str, **overrides) -> MiningConfig:
        """A paper preset (:func:`presets`) plus overrides."""
        known = presets()
        if name not in known:
            raise ConfigError(f"unknown mining preset {name!r}; valid presets: {', '.join(known)}")
        return cls(**{**known[name], **overrides})
