"""STS evaluation: Pearson and Spearman correlation (scipy) between the model's pair similarities and the
gold scores. Similarity is **cosine** unless asked otherwise, as the papers define STS (a dot-product
retriever would otherwise be scored on unnormalised products); on an asymmetric model (a ``Router`` with query
and document routes) both sentences go through **one** route, the query route by default.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

import numpy as np

from medadapt.data.sts import StsPair, load_sts
from medadapt.errors import MedAdaptError
from medadapt.eval.tasks.base import EvalSettings, EvalTask, register_task_kind
from medadapt.progress import encode_with_progress


def _is_asymmetric(model) -> bool:
    from sentence_transformers.base.modules import Router

    first = next(iter(getattr(model, "_modules", {}).values()), None)
    return isinstance(first, Router) and {"query", "document"} <= set(first.sub_modules)


def evaluate_sts(model, pairs: list[StsPair], batch_size: int = 64, show_progress: bool = False, *,
                 similarity: Literal["cosine", "dot", "model"] = "cosine",
                 route: Literal["query", "document"] | None = None) -> dict[str, float]:
    """``{"pearson", "spearman"}`` between the model's pair similarities and the gold scores.

    ``similarity``: ``cosine``, ``dot`` or ``model`` (its ``similarity_fn_name``); ``route``: the tower encoding
    both sentences (``None``: ``query`` on an asymmetric model, plain ``encode`` otherwise). Non-finite values
    are a :class:`MedAdaptError`; constant gold scores or similarities a ``ValueError`` (undefined correlation).
    """
    import torch
    from scipy.stats import pearsonr, spearmanr

    if similarity not in ("cosine", "dot", "model"):
        raise MedAdaptError(f"STS similarity must be cosine, dot or model, got {similarity!r}")
    if route not in (None, "query", "document"):
        raise MedAdaptError(f"STS route must be query or document, got {route!r}")
    if route is None and _is_asymmetric(model):
        route = "query"
    encode = getattr(model, {None: "encode", "query": "encode_query", "document": "encode_document"}[route])
    a = encode_with_progress(encode, [p.sentence1 for p in pairs], batch_size=batch_size, convert_to_tensor=True,
                             show_progress=show_progress, desc="encoding sentences (1)")
    b = encode_with_progress(encode, [p.sentence2 for p in pairs], batch_size=batch_size, convert_to_tensor=True,
                             show_progress=show_progress, desc="encoding sentences (2)")
    if similarity == "model":
        sims = model.similarity_pairwise(a, b)
    elif similarity == "cosine":
        sims = torch.nn.functional.cosine_similarity(a.float(), b.float(), dim=-1)
    else:
        sims = (a.float() * b.float()).sum(-1)
    sims = sims.float().cpu().numpy()
    gold = np.array([p.score for p in pairs], dtype=np.float64)
    if not np.isfinite(gold).all():
        raise MedAdaptError("STS gold scores must be finite numbers (found NaN or infinity)")
    if not np.isfinite(sims).all():
        raise MedAdaptError("the model gave non-finite similarities (NaN or infinity); check its weights")
    if np.std(gold) == 0 or np.std(sims) == 0:
        raise ValueError("STS correlation is undefined: gold scores or model similarities are constant")
    out = {"pearson": float(pearsonr(sims, gold)[0]), "spearman": float(spearmanr(sims, gold)[0])}
    if not all(np.isfinite(v) for v in out.values()):
        raise MedAdaptError(f"STS correlation is not finite ({out}); check the gold scores and the model")
    return out


@register_task_kind
class StsTask(EvalTask):
    kind = "sts"
    default_metrics = ("pearson", "spearman")
    fixed_metrics = "pearson and spearman"

    def read(self, path: Path):
        return load_sts(path)

    def score(self, model, settings: EvalSettings) -> dict[str, dict[str, float]]:
        try:
            metrics = evaluate_sts(model, self.data, settings.batch_size, settings.show_progress,
                                   similarity=settings.similarity, route=settings.route)
        except ValueError as exc:  # constant gold scores or similarities: the correlation is undefined
            raise MedAdaptError(f"{self.metadata.name} ({self.paths[0]}): {exc}") from None
        return {self.metadata.query_languages[0]: metrics}
