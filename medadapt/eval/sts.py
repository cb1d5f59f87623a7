"""STS evaluation: Pearson and Spearman correlation (scipy) between the model's similarity of each pair
and the gold score."""

from __future__ import annotations

import numpy as np

from medadapt.data.sts import StsPair


def evaluate_sts(model, pairs: list[StsPair], batch_size: int = 64, show_progress: bool = False) -> dict[str, float]:
    from scipy.stats import pearsonr, spearmanr

    a = model.encode([p.sentence1 for p in pairs], batch_size=batch_size, convert_to_tensor=True,
                     show_progress_bar=show_progress)
    b = model.encode([p.sentence2 for p in pairs], batch_size=batch_size, convert_to_tensor=True,
                     show_progress_bar=show_progress)
    sims = model.similarity_pairwise(a, b).float().cpu().numpy()
    gold = np.array([p.score for p in pairs], dtype=np.float64)
    if np.std(gold) == 0 or np.std(sims) == 0:
        raise ValueError("STS correlation is undefined: gold scores or model similarities are constant")
    return {"pearson": float(pearsonr(sims, gold)[0]), "spearman": float(spearmanr(sims, gold)[0])}
