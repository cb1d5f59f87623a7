"""STS evaluation: Pearson and Spearman correlation (scipy) between the model's similarity of each pair
and the gold score."""

from __future__ import annotations

import numpy as np

from medadapt.data.sts import StsPair
from medadapt.errors import MedAdaptError


def evaluate_sts(model, pairs: list[StsPair], batch_size: int = 64, show_progress: bool = False) -> dict[str, float]:
    """``{"pearson", "spearman"}`` between the model's pair similarities and the gold scores.

    Raises:
        MedAdaptError: a non-finite gold score or similarity, or a non-finite correlation.
        ValueError: gold scores or similarities are constant (the correlation is undefined).
    """
    from scipy.stats import pearsonr, spearmanr

    a = model.encode([p.sentence1 for p in pairs], batch_size=batch_size, convert_to_tensor=True,
                     show_progress_bar=show_progress)
    b = model.encode([p.sentence2 for p in pairs], batch_size=batch_size, convert_to_tensor=True,
                     show_progress_bar=show_progress)
    sims = model.similarity_pairwise(a, b).float().cpu().numpy()
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
