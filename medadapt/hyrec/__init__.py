"""HyReC (hybrid lexical + dense retrieval with a semantic union of terms): GLAE, projectors, bagging,
Normalisation Module, union labelling, training (a step of :func:`medadapt.training.loop.train`), recipes
(``kind: hyrec``, run by ``medadapt train`` / :func:`medadapt.recipes.run_recipe`) and evaluation.

Imports are lazy so ``import medadapt.hyrec`` stays light::

    from medadapt.hyrec import HyReCModel, evaluate_hyrec
    model = HyReCModel.load("runs/hyrec")
    vectors = model.encode_lexical(["高血压患者能吃党参吗？"], role="query")
    evaluate_hyrec(model, "../shared/data/zh-med-qa", "test", mode="hybrid")
"""

from __future__ import annotations

import importlib
from typing import Any

_LAZY = {
    "HyReCModel": "medadapt.hyrec.model",
    "HyReCConfig": "medadapt.hyrec.model",
    "LexicalBranch": "medadapt.hyrec.model",
    "UnionLabeler": "medadapt.hyrec.labels",
    "segment": "medadapt.hyrec.labels",
    "align_labels": "medadapt.hyrec.labels",
    "WordVocab": "medadapt.hyrec.bagging",
    "bag_words": "medadapt.hyrec.bagging",
    "group_words": "medadapt.hyrec.bagging",
    "sparse_from_tokens": "medadapt.hyrec.bagging",
    "split_layers": "medadapt.hyrec.glae",
    "WeightProjector": "medadapt.hyrec.projectors",
    "UnionProjector": "medadapt.hyrec.projectors",
    "DenseProjector": "medadapt.hyrec.projectors",
    "normalize_sparse": "medadapt.hyrec.normalize",
    "normalize_term_weights": "medadapt.hyrec.normalize",
    "hybrid_score": "medadapt.hyrec.normalize",
    "SharedStateCache": "medadapt.hyrec.data",
    "build_examples": "medadapt.hyrec.data",
    "train_hyrec": "medadapt.hyrec.train",
    "hyrec_stage": "medadapt.hyrec.train",
    "HyReCStep": "medadapt.hyrec.train",
    "evaluate_hyrec": "medadapt.hyrec.evaluate",
    "HyReCRecipe": "medadapt.hyrec.sections",
    "HyReCTrainingSection": "medadapt.hyrec.sections",
    "HyReCLossSection": "medadapt.hyrec.sections",
}

__all__ = sorted(_LAZY)


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'medadapt.hyrec' has no attribute {name!r}")
