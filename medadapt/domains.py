"""Domain classification shared by the systems that adapt per domain of a ``data.mix``: a class-balanced
linear classifier on a frozen sentence embedding, fitted once after training (not by the loop), and the
per-input mix ``sum_k p_k value_k`` of a per-domain setting. A MoE head mixes residual scales with it
(:mod:`medadapt.moe.domains`), the HyReC lexical branch fusion weights (:mod:`medadapt.hyrec.branch`).
scikit-learn's LogisticRegression would do the fit, but it is not a dependency and its solvers are not
deterministic across thread counts; this is a dozen lines of torch L-BFGS, deterministic and zero-initialised.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch
from torch import Tensor, nn

__all__ = ["domain_mix", "domain_probabilities", "fit_domain_classifier"]


def fit_domain_classifier(features: Sequence[np.ndarray], l2: float = 1e-5, max_iter: int = 200
                          ) -> tuple[Tensor, Tensor, float]:
    """A multinomial logistic regression from rows of ``features[k]`` (domain ``k``'s embeddings) to ``k``:
    class-balanced mean cross-entropy plus ``l2 * ||W||^2``, on L2-normalised rows, zero-initialised and
    solved full-batch with L-BFGS (deterministic). Returns ``(weight, bias, training accuracy)``."""
    if len(features) < 2 or any(len(f) == 0 for f in features):
        raise ValueError("a domain classifier needs at least two domains, each with at least one text")
    x = nn.functional.normalize(torch.as_tensor(np.concatenate(features), dtype=torch.float32), dim=-1)
    y = torch.cat([torch.full((len(f),), k, dtype=torch.long) for k, f in enumerate(features)])
    counts = torch.tensor([len(f) for f in features], dtype=torch.float32)
    weights = counts.sum() / (len(features) * counts)  # balanced: every domain weighs the same in the loss
    linear = nn.Linear(x.shape[1], len(features))
    nn.init.zeros_(linear.weight)
    nn.init.zeros_(linear.bias)
    opt = torch.optim.LBFGS(linear.parameters(), lr=1.0, max_iter=max_iter, line_search_fn="strong_wolfe")
    loss_fn = nn.CrossEntropyLoss(weight=weights)

    def closure():
        opt.zero_grad()
        loss = loss_fn(linear(x), y) + l2 * linear.weight.pow(2).sum()
        loss.backward()
        return loss

    with torch.enable_grad():
        opt.step(closure)
    with torch.no_grad():
        accuracy = float((linear(x).argmax(-1) == y).float().mean())
    return linear.weight.detach().clone(), linear.bias.detach().clone(), accuracy


def domain_probabilities(classifier: nn.Linear, v: Tensor) -> Tensor:
    """The probabilities (rows, domains) of a fitted ``classifier`` for raw embeddings ``v`` (rows, dim),
    L2-normalised first as in :func:`fit_domain_classifier`."""
    v = v.reshape(-1, classifier.in_features).to(device=classifier.weight.device, dtype=classifier.weight.dtype)
    return torch.softmax(classifier(nn.functional.normalize(v, dim=-1)), dim=-1)


def domain_mix(classifier: nn.Linear, v: Tensor, values: Tensor) -> Tensor:
    """Per row of ``v`` the per-domain ``values`` (domains,) mixed by the classifier: ``sum_k p_k values_k``."""
    probs = domain_probabilities(classifier, v)
    return probs @ values.to(device=probs.device, dtype=probs.dtype)
