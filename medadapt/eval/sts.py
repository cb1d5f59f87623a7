"""STS evaluation: Pearson and Spearman correlation (scipy) between the model's similarity of each pair
and the gold score.

Similarity is **cosine** unless asked otherwise, as the papers define STS (BMRetriever, CMedTEB, MTEB): a
model whose retrieval similarity is the dot product (BMRetriever's instruction models) would otherwise be
scored on unnormalised dot products. STS is symmetric: on an asymmetric model (a sentence-transformers
``Router`` with query and document routes, e.g. CARE) both sentences go through **one** route, the query
route by default (the online encoder); ``route="document"`` picks the other. A plain ``encode`` would run
the Router's default route without saying which.
"""

from __future__ import annotations

from typing import Literal

import numpy as np

from medadapt.data.sts import StsPair
from medadapt.errors import MedAdaptError
from medadapt.progress import encode_with_progress


def _is_asymmetric(model) -> bool:
    from sentence_transformers.base.modules import Router

    first = next(iter(getattr(model, "_modules", {}).values()), None)
    return isinstance(first, Router) and {"query", "document"} <= set(first.sub_modules)


def evaluate_sts(model, pairs: list[StsPair], batch_size: int = 64, show_progress: bool = False, *,
                 similarity: Literal["cosine", "dot", "model"] = "cosine",
                 route: Literal["query", "document"] | None = None) -> dict[str, float]:
    """``{"pearson", "spearman"}`` between the model's pair similarities and the gold scores.

    Args:
        similarity: ``cosine`` (default, as the papers score STS), ``dot``, or ``model`` (the model's own
            ``similarity_fn_name``).
        route: the tower that encodes both sentences: ``query`` (``encode_query``) or ``document``
            (``encode_document``); ``None`` is ``query`` on an asymmetric model and plain ``encode`` on
            any other.

    Raises:
        MedAdaptError: a non-finite gold score or similarity, or a non-finite correlation.
        ValueError: gold scores or similarities are constant (the correlation is undefined).
    """
    from scipy.stats import pearsonr, spearmanr

    import torch

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
