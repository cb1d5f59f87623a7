"""Peer baselines trained in the same run (``eval.peers``): is the head worth more than a simpler one? Only their
scores are kept (``metrics.json`` ``"peers"``, the final table, the card). See docs/training.md.
"""

from __future__ import annotations

from typing import Any

from medadapt.models import load
from medadapt.moe.schedule import train_head
from medadapt.recipes.also import redirect
from medadapt.recipes.run import evaluate_dense

__all__ = ["run_peers"]


def run_peers(recipe: Any, query, positive, ctx: Any) -> None:
    """Train every ``eval.peers`` entry with :func:`~medadapt.moe.schedule.train_head` on the cached ``query`` /
    ``positive`` embeddings the head trained on and, on the main process, score it on the run's sets through its
    cache into ``ctx.result.peers`` (nothing when the run does not evaluate)."""
    if not recipe.eval.peers or not ctx.evaluate:
        return
    for peer in recipe.eval.peers:
        model = load(recipe.model.backbone, device=ctx.device)  # the cache keys it as the run's base: no re-encode
        if recipe.model.max_seq_length:
            model.max_seq_length = recipe.model.max_seq_length
        head = model.add_adapter(peer.head_config(), adapter_name="peer").to(ctx.accelerator.device)
        ctx.log(f"training peer baseline: {peer.label} ({sum(p.numel() for p in head.parameters()):,} "
                f"parameters, {peer.epochs} epochs)")
        res = train_head(head, query.float(), positive.float(), None, peer.training(recipe.training),
                         peer.loss(), accelerator=ctx.accelerator, route=peer.head_config().route)
        if ctx.is_main:
            row: dict[str, Any] = {"metrics": dict(evaluate_dense(recipe, model, ctx)),
                                   "train_seconds": res.seconds}
            row["also"] = {entry.name: dict(evaluate_dense(redirect(recipe, entry), model, ctx))
                           for entry in recipe.eval.also}
            ctx.result.peers[peer.label] = row
        del model, head
