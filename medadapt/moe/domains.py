"""Domain routing of a trained MoE head: one residual scale per ``data.mix`` domain, chosen on its dev split, and
a linear domain classifier giving each input ``gamma = sum_k p_k gamma_k`` (:meth:`MoEHead.scale_for`): domains
want different interpolations ``v + gamma h``, and ``Router`` routes by task, not content. The classifier is a
class-balanced logistic regression on the frozen embedding, fitted with deterministic L-BFGS in torch.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np
import torch
from torch import nn

from medadapt.data import BeirDataset
from medadapt.eval.retrieval import evaluate_retrieval
from medadapt.moe.config import DOMAIN_SCALE_GRID
from medadapt.moe.head import MoEHead

__all__ = ["DomainRouting", "fit_domain_classifier", "fit_domain_routing"]


@dataclass
class DomainRouting:
    """What :func:`fit_domain_routing` chose: per domain the dev nDCG@10 at every scale tried, the chosen
    scale, and the classifier's accuracy on each domain's dev queries (the share routed to their own domain)."""

    domains: list[str]
    scales: list[float]
    dev: dict[str, dict[str, float]] = field(default_factory=dict)
    dev_query_accuracy: dict[str, float] = field(default_factory=dict)
    train_accuracy: float = 0.0

    def as_dict(self) -> dict:
        return {"domains": self.domains, "scales": dict(zip(self.domains, self.scales)), "dev_ndcg@10": self.dev,
                "dev_query_accuracy": self.dev_query_accuracy, "train_accuracy": round(self.train_accuracy, 4)}


def fit_domain_classifier(features: Sequence[np.ndarray], l2: float = 1e-5, max_iter: int = 200
                          ) -> tuple[torch.Tensor, torch.Tensor, float]:
    """A multinomial logistic regression from rows of ``features[k]`` (domain ``k``'s embeddings) to ``k``:
    class-balanced mean cross-entropy plus ``l2 * ||W||^2``, on L2-normalised rows, zero-initialised and
    solved full-batch with L-BFGS (deterministic). Returns ``(weight, bias, training accuracy)``."""
    if len(features) < 2 or any(len(f) == 0 for f in features):
        raise ValueError("a domain classifier needs at least two domains, each with at least one text")
    x = torch.nn.functional.normalize(torch.as_tensor(np.concatenate(features), dtype=torch.float32), dim=-1)
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


def _best(scores: dict[float, float]) -> float:
    """The scale with the highest dev score; ties go to the smaller scale (closer to the frozen model)."""
    return min(scores, key=lambda g: (-round(scores[g], 6), g))


def fit_domain_routing(model, head: MoEHead, domains: dict[str, BeirDataset], cache, *, train_split: str,
                       dev_split: str = "dev", grid: Sequence[float] = DOMAIN_SCALE_GRID, batch_size: int = 64,
                       log: Callable[[str], None] = print) -> DomainRouting:
    """Choose each domain's residual scale on its ``dev_split`` and install the domain classifier on ``head`` (in
    ``model``). ``domains``: name -> BEIR set with both splits; ``cache``: the run's embedding cache (each scale
    costs a pass of the head, not of the backbone)."""
    names = list(domains)
    saved_scale, saved_routing = head.residual_scale, head.domain_routing
    head.domain_routing = False
    dev: dict[str, dict[str, float]] = {}
    scales = []
    try:
        for name in names:
            scores = {}
            for g in grid:
                head.residual_scale = float(g)
                scores[float(g)] = evaluate_retrieval(model, domains[name], dev_split, ["ndcg@10"], cache=cache,
                                                      batch_size=batch_size, show_progress=False)["ndcg@10"]
            dev[name] = {f"{g:g}": round(s, 4) for g, s in scores.items()}
            scales.append(_best(scores))
            log(f"domain {name}: residual scale {scales[-1]:g} (dev nDCG@10 "
                + ", ".join(f"{g:g}: {s:.4f}" for g, s in scores.items()) + ")")
        head.residual_scale = 0.0  # v + 0 h = v: the frozen backbone's embedding, what the classifier reads
        feats, dev_feats = [], []
        for name in names:
            d = domains[name]
            queries = d.split_queries(train_split)
            q = cache.encode(model, list(queries.values()), role="query", normalize=False,
                             batch_size=batch_size, show_progress=False)
            docs = cache.encode(model, d.doc_texts(), role="document", normalize=False, batch_size=batch_size,
                                show_progress=False)
            feats.append(np.concatenate([q, docs]))
            dev_feats.append(cache.encode(model, list(d.split_queries(dev_split).values()), role="query",
                                          normalize=False, batch_size=batch_size, show_progress=False))
    finally:
        head.residual_scale, head.domain_routing = saved_scale, saved_routing
    weight, bias, accuracy = fit_domain_classifier(feats)
    head.set_domains(names, scales, weight, bias)
    routing = DomainRouting(names, scales, dev, train_accuracy=accuracy)
    with torch.no_grad():
        for k, name in enumerate(names):
            probs = head.domain_probabilities(torch.as_tensor(dev_feats[k], device=head.domain_gammas.device))
            routing.dev_query_accuracy[name] = round(float((probs.argmax(-1) == k).float().mean()), 4)
    log("domain routing: " + ", ".join(f"{n} -> scale {g:g} ({routing.dev_query_accuracy[n]:.1%} of dev queries "
                                       "routed to it)" for n, g in zip(names, scales)))
    return routing
