"""Domain routing of a trained MoE head: one residual scale per ``data.mix`` domain, chosen on its dev split, and
a linear domain classifier giving each input ``gamma = sum_k p_k gamma_k`` (:meth:`MoEHead.scale_for`): domains
want different interpolations ``v + gamma h``, and ``Router`` routes by task, not content. The classifier
(:func:`medadapt.domains.fit_domain_classifier`) reads the frozen embedding.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np
import torch

from medadapt.data import BeirDataset
from medadapt.domains import fit_domain_classifier
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
