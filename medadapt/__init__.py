"""medadapt: make any frozen Sentence-Transformers embedder good at medical retrieval.

Top-level API (imported lazily so ``import medadapt`` stays cheap)::

    import medadapt
    model = medadapt.load("minilm")            # alias, local path, or hub id
    results = medadapt.evaluate_retrieval(model, medadapt.load_beir("medmini"), split="test")
"""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING, Any

from medadapt._version import __version__

if "sentence_transformers" in sys.modules:  # already paid for: let SentenceTransformer.add_adapter take
    import medadapt.adapters  # noqa: F401,E402  medadapt head configs right away (else on first use of one)

__all__ = [
    "__version__",
    "load",
    "load_beir",
    "evaluate_retrieval",
    "EmbeddingCache",
    "MedAdaptError",
    "MoEConfig",
    "save_adapter",
]

_LAZY = {
    "load": ("medadapt.models", "load"),
    "load_beir": ("medadapt.data", "load_beir"),
    "evaluate_retrieval": ("medadapt.eval", "evaluate_retrieval"),
    "EmbeddingCache": ("medadapt.cache", "EmbeddingCache"),
    "MedAdaptError": ("medadapt.errors", "MedAdaptError"),
    "MoEConfig": ("medadapt.moe", "MoEConfig"),
    "save_adapter": ("medadapt.adapters", "save_adapter"),
}

if TYPE_CHECKING:  # pragma: no cover
    from medadapt.cache import EmbeddingCache
    from medadapt.data import load_beir
    from medadapt.errors import MedAdaptError
    from medadapt.eval import evaluate_retrieval
    from medadapt.models import load


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        import importlib

        module, attr = _LAZY[name]
        return getattr(importlib.import_module(module), attr)
    raise AttributeError(f"module 'medadapt' has no attribute {name!r}")
