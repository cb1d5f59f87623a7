"""Peer baselines trained in the same run (``eval.peers``): is the head worth more than a simpler one?

Each peer (``linear_query``: :class:`LinearQueryPeer`, the query-only linear adapter) trains on the run's cached
training embeddings with :func:`~medadapt.moe.schedule.train_head` and is scored on the same sets through the
run's cache; only its scores are kept (``metrics.json`` ``"peers"``, the final table, the card), with a warning
where it beats the head. See docs/training.md, "Peer baselines in the same run".
"""

from __future__ import annotations

from typing import Annotated, Any, Literal, Union

from pydantic import Field, field_validator

from medadapt.config import Section
from medadapt.errors import ConfigError
from medadapt.heads.linear import LinearHeadConfig
from medadapt.models import load
from medadapt.moe.schedule import train_head
from medadapt.moe.sections import InfoNCESection, MoETrainingSection
from medadapt.recipes.also import redirect
from medadapt.recipes.base import EvalSection
from medadapt.recipes.run import evaluate_dense

__all__ = ["LinearQueryPeer", "MoEEvalSection", "PeerSection", "check_peers", "peers_problem", "run_peers"]


class LinearQueryPeer(Section):
    """The query-only linear adapter (``W q``, ``W`` identity-initialised; documents stay frozen) trained with
    in-batch negatives and InfoNCE; defaults are ``recipes/linear-query-demo.yaml``'s settings. The seed,
    device and precision are the recipe's ``training`` ones; the other optimiser settings (no warm-up, cosine
    decay, gradient clipping at 1) are :class:`~medadapt.moe.sections.MoETrainingSection`'s defaults."""

    kind: Literal["linear_query"] = "linear_query"
    label: str = Field("linear query adapter", min_length=1,
                       description="name in the table, metrics.json, the card and the warning line")
    temperature: float = Field(0.05, gt=0, description="InfoNCE temperature")
    lr: float = Field(3e-3, gt=0, le=10.0)
    epochs: int = Field(20, ge=1)
    batch_size: int = Field(64, ge=1)
    weight_decay: float = Field(0.0, ge=0)

    def head_config(self) -> LinearHeadConfig:
        """The peer's head: a bias-free linear head on the query route."""
        return LinearHeadConfig(route="query")

    def training(self, run: MoETrainingSection) -> MoETrainingSection:
        """The peer's training section: its own optimisation settings, the run's seed / device / precision."""
        return MoETrainingSection(epochs=self.epochs, batch_size=self.batch_size, lr=self.lr,
                                  weight_decay=self.weight_decay, seed=run.seed, device=run.device,
                                  mixed_precision=run.mixed_precision,
                                  encode_batch_size=run.encode_batch_size)

    def loss(self) -> InfoNCESection:
        return InfoNCESection(temperature=self.temperature, load_balance_weight=0.0)


#: one ``eval.peers`` entry; a bare name (``linear_query``) is that kind with its defaults
PeerSection = Annotated[Union[LinearQueryPeer], Field(discriminator="kind")]


class MoEEvalSection(EvalSection):
    """The ``moe`` kind's ``eval``: :class:`~medadapt.recipes.base.EvalSection` plus ``peers``."""

    peers: list[PeerSection] = Field(default_factory=list, description="peer baselines trained in the same "
                                     "run on the same cached embeddings and scored on the same sets (fast "
                                     "path only), e.g. [linear_query] or [{kind: linear_query, lr: 1.0e-3}]")

    @field_validator("peers", mode="before")
    @classmethod
    def _names(cls, value):
        """``[linear_query]`` -> ``[{kind: linear_query}]``."""
        return [{"kind": v} if isinstance(v, str) else v for v in (value or [])]

    @field_validator("peers")
    @classmethod
    def _distinct(cls, value):
        labels = [p.label for p in value]
        twice = sorted({x for x in labels if labels.count(x) > 1})
        if twice:
            raise ValueError(f"two peers are labelled {', '.join(twice)}; give one of them a label")
        return value


def peers_problem(recipe: Any) -> str | None:
    """Why ``recipe``'s ``eval.peers`` cannot run (``None`` when it can, or when there are none): peers
    train on the fast path's cached embeddings beside a trained head."""
    if not getattr(recipe.eval, "peers", None):
        return None
    if not recipe.fast:
        return ("eval.peers trains peer baselines on the frozen backbone's cached embeddings: it needs the "
                "fast path (model.freeze_backbone: true, no model.peft)")
    if recipe.head.kind == "none":
        return "eval.peers compares peer baselines with a trained head: set head.kind"
    if recipe.branches:
        return "eval.peers compares dense heads: a recipe with branches (per-mode metrics) takes no peers yet"
    return None


def _load_backbone(recipe: Any, ctx: Any):
    """A fresh copy of the recipe's frozen backbone (the cache keys it as the run's base: no re-encode)."""
    model = load(recipe.model.backbone, device=ctx.device)
    if recipe.model.max_seq_length:
        model.max_seq_length = recipe.model.max_seq_length
    return model


def run_peers(recipe: Any, query, positive, ctx: Any) -> None:
    """Train every ``eval.peers`` entry on the cached ``(N, d)`` ``query`` / ``positive`` embeddings the head
    trained on (every process, the run's accelerator) and, on the main process, score it on the recipe's
    evaluation split and ``eval.also`` sets; fills ``ctx.result.peers`` (``{label: {"metrics", "also",
    "train_seconds"}}``). Nothing is done when the run does not evaluate."""
    if not recipe.eval.peers or not ctx.evaluate:
        return
    for peer in recipe.eval.peers:
        model = _load_backbone(recipe, ctx)
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


def check_peers(recipe: Any) -> None:
    """:func:`peers_problem` as a :class:`~medadapt.errors.ConfigError`."""
    problem = peers_problem(recipe)
    if problem:
        raise ConfigError(problem)
