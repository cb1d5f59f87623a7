"""Med-MoE-Embed's training schedule (paper §III-D) on cached frozen-backbone embeddings, as stages of the one
loop. :func:`head_stages` gives a MoE head the stages ``shared`` (shared experts alone), ``random`` (random
routing) and ``learned`` (top-k gate; shares the optimiser of ``random``); other heads train in one stage,
``main``. The loss (:class:`MoEStep`) is InfoNCE over in-batch + hard negatives, the load-balancing term and a
head's own ``penalty`` on the whole gathered step; random routing is seeded per step, so 1 and N processes agree.
:func:`train_head` is the Python API (docs/training.md).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from medadapt.errors import ConfigError
from medadapt.losses.load_balance import switch_load_balance
from medadapt.moe.head import MoEHead
from medadapt.moe.routing import RoutingMode
from medadapt.moe.sections import InfoNCESection, MoETrainingSection
from medadapt.training.checkpoint import CheckpointConfig
from medadapt.training.loop import Batch, LoopResult, Stage, train

__all__ = ["HeadTrainResult", "MoEStep", "encode_with_head", "expert_load_log", "head_stages",
           "head_training", "merge_routing_stats", "train_head"]


class MoEStep:
    """One stage's :class:`~medadapt.training.loop.Step`: ``head`` (whose router is observed) over cached
    ``(N, d)`` query / positive and ``(N, n, d)`` negative (or ``None``) raw embeddings, in routing mode
    ``routing`` (``None`` for heads that are not a ``MoEHead``)."""

    def __init__(self, head: nn.Module, query: Tensor, positive: Tensor, negatives: Tensor | None,
                 loss: InfoNCESection, routing: RoutingMode | None, route: str = "all") -> None:
        if route not in ("all", "query", "document"):
            raise ConfigError(f"route must be all, query or document, got {route!r}")
        self.head, self.routing, self.route = head, routing, route
        self.query, self.positive, self.negatives = query, positive, negatives
        self.n_neg = 0 if negatives is None else negatives.shape[1]
        self.infonce, self.load_balance = loss.build()
        #: ``head.penalty(frozen, adapted) -> {name: loss part}`` of heads that regularise their output
        self.penalty = getattr(head, "penalty", None)
        has_router = isinstance(head, MoEHead) and head.router is not None
        self.routed = has_router and routing in ("learned", "random")
        #: per optimiser step of this stage: ``{"step": 1-based step, "load": [fraction per routed expert]}``
        #: over every row the step routed (the gathered step, so the same on every process)
        self.load_history: list[dict[str, Any]] = []

    def forward(self, model: nn.Module, batch: Batch) -> dict[str, Tensor]:
        """Per item of ``batch.indices``: ``q``, ``p`` (d), ``n`` (n, d) embeddings, mapped by the head on the
        stage's route (the other side stays the raw tower output) and, when the stage routes, the router's
        ``probs`` / ``selected`` of the item's mapped rows."""
        device = next(self.head.parameters()).device
        index = torch.as_tensor(batch.indices, dtype=torch.long)
        b = len(batch.indices)
        blocks = [self.query[index], self.positive[index]]
        if self.negatives is not None:
            blocks.append(self.negatives[index].reshape(b * self.n_neg, -1))
        rows = torch.cat(blocks).to(device=device, dtype=torch.float32)
        first, last = {"all": (0, rows.shape[0]), "query": (0, b), "document": (b, rows.shape[0])}[self.route]
        features = {"sentence_embedding": rows[first:last]}
        decisions: list[Any] = []
        handle, counters, router = None, None, self.head.router if self.routed else None
        if self.routed:
            if self.routing == "random":
                features["routing_noise"] = self._noise(batch, device)[first:last]
            handle = router.register_forward_hook(lambda _m, _a, out: decisions.append(out))
            if not torch.is_grad_enabled():  # GradCache's first pass: the chunk runs again, count it once
                counters = (router.running_counts.clone(), router.last_load.clone(), router.inputs_seen)
        try:
            mapped = model(features)["sentence_embedding"].float()
            if self.route != "all":
                mapped = torch.cat([rows[:first], mapped, rows[last:]])
        finally:
            if handle is not None:
                handle.remove()
            if counters is not None:
                router.running_counts.copy_(counters[0])
                router.last_load.copy_(counters[1])
                router.inputs_seen = counters[2]
        out = {"q": mapped[:b], "p": mapped[b: 2 * b]}
        if self.n_neg:
            out["n"] = mapped[2 * b:].reshape(b, self.n_neg, -1)
        if self.routed:
            out["probs"] = self._per_item(decisions[-1].probs, b)
            out["selected"] = self._per_item(decisions[-1].selected, b)
        return out

    def _per_item(self, rows: Tensor, b: int) -> Tensor:
        """The head's input rows (``[queries, positives, negatives]`` of the step's items, or the route's part of
        them, see :meth:`forward`) -> per item ``(b, rows per item, E)``."""
        if self.route == "query":
            return rows[:, None]
        per_item = [rows[:b, None]] if self.route == "document" else [rows[:b, None], rows[b: 2 * b, None]]
        if self.n_neg:
            per_item.append(rows[-b * self.n_neg:].reshape(b, self.n_neg, rows.shape[-1]))
        return torch.cat(per_item, dim=1)

    def loss(self, outputs: dict[str, Tensor], batch: Batch) -> dict[str, Tensor]:
        """``infonce`` of the gathered step, the head's ``penalty`` parts and, for a ``MoEHead``, ``load_balance``
        (weighted Switch loss on every row the step routed; zero when the stage does not route)."""
        parts = self.infonce(outputs["q"], outputs["p"], outputs.get("n"))
        if callable(self.penalty):
            parts.update(self.penalty(*self._mapped_rows(outputs, batch)))
        if isinstance(self.head, MoEHead):
            if "probs" in outputs:
                n_experts = outputs["probs"].shape[-1]
                selected = outputs["selected"].reshape(-1, n_experts)
                aux = switch_load_balance(outputs["probs"].reshape(-1, n_experts).float(), selected)
                counts = selected.detach().sum(0).double()
                self.load_history.append({"step": batch.step + 1,
                                          "load": [round(x, 6) for x in
                                                   (counts / counts.sum().clamp_min(1)).tolist()]})
            else:
                aux = outputs["q"].new_zeros(())
            parts.update(self.load_balance(aux))
        return parts

    def _mapped_rows(self, outputs: dict[str, Tensor], batch: Batch) -> tuple[Tensor, Tensor]:
        """``(frozen, adapted)`` rows of the whole gathered step on the stage's route: the cached inputs of
        ``batch.all_indices`` and the head's outputs for them."""
        index = torch.as_tensor(batch.all_indices, dtype=torch.long)
        q = outputs["q"]
        frozen = {"q": self.query[index], "p": self.positive[index]}
        adapted = {"q": q, "p": outputs["p"]}
        if self.n_neg:
            frozen["n"] = self.negatives[index].reshape(-1, q.shape[-1])
            adapted["n"] = outputs["n"].reshape(-1, q.shape[-1])
        sides = {"all": ("q", "p", "n"), "query": ("q",), "document": ("p", "n")}[self.route]
        sides = [k for k in sides if k in adapted]
        before = torch.cat([frozen[k] for k in sides]).to(device=q.device, dtype=torch.float32)
        return before, torch.cat([adapted[k] for k in sides]).float()

    def _noise(self, batch: Batch, device: torch.device) -> Tensor:
        """This chunk's rows of one uniform draw, seeded by ``(seed, step)``, over every head-input row of
        the optimiser step (laid out ``[queries, positives, negatives]`` of ``batch.all_indices``)."""
        total = len(batch.all_indices)
        generator = torch.Generator().manual_seed(batch.seed * 1_000_003 + batch.step)
        noise = torch.rand((total * (2 + self.n_neg), self.head.router.num_experts), generator=generator)
        where = {item: j for j, item in enumerate(batch.all_indices)}
        pos = torch.tensor([where[i] for i in batch.indices], dtype=torch.long)
        rows = [pos, total + pos]
        if self.n_neg:
            rows.append((2 * total + pos[:, None] * self.n_neg + torch.arange(self.n_neg)).reshape(-1))
        return noise[torch.cat(rows)].to(device)


def _trainable(params) -> list[nn.Parameter]:
    return [p for p in params if p.requires_grad]


def head_stages(head: nn.Module, query: Tensor, positive: Tensor, negatives: Tensor | None,
                training: MoETrainingSection, loss: InfoNCESection, route: str = "all") -> list[Stage]:
    """The stages of the module docstring (those with zero epochs left out); ``route``: the side the head maps
    (``all``, ``query`` or ``document``; the other side's embeddings are used as they are)."""
    n = int(query.shape[0])

    def step(routing: RoutingMode | None) -> MoEStep:
        return MoEStep(head, query, positive, negatives, loss, routing, route)

    if not isinstance(head, MoEHead):
        if training.shared_epochs or training.random_routing_epochs:
            raise ConfigError("training.shared_epochs / random_routing_epochs need a MoEHead; "
                              f"set them to 0 to train a {type(head).__name__}")
        if not training.epochs:
            return []
        return [Stage("main", n, step(None), _trainable(head.parameters()), training.optim(training.epochs))]

    def start(mode: RoutingMode) -> Callable[[], None]:
        def on_start() -> None:
            head.set_routing(mode)
            head.reset_routing_stats()  # the reported statistics describe the last stage
        return on_start

    everything = _trainable(head.parameters())
    shared = _trainable(head.parameter_groups()["shared"])
    routed = head.router is not None
    stages = []
    if shared and training.shared_epochs:
        stages.append(Stage("shared", n, step("off"), shared, training.optim(training.shared_epochs),
                            on_start=start("off")))
    if routed and training.random_routing_epochs:
        stages.append(Stage("random", n, step("random"), everything,
                            training.optim(training.random_routing_epochs), schedule="routed",
                            on_start=start("random")))
    if training.epochs:
        mode: RoutingMode = "learned" if routed else "off"
        stages.append(Stage("learned", n, step(mode), everything, training.optim(training.epochs),
                            schedule="routed", on_start=start(mode)))
    return stages


@contextlib.contextmanager
def head_training(head: nn.Module | None) -> Iterator[nn.Module | None]:
    """While training, a ``MoEHead`` learns the full-strength correction (``residual_scale = 1``, no domain
    routing; the configured scale is the inference-time interpolation); restored afterwards, also after an
    error. Other heads (or ``None``) pass through."""
    if not isinstance(head, MoEHead):
        yield head
        return
    routing, scale, domains = head.routing, head.residual_scale, head.domain_routing
    head.residual_scale, head.domain_routing = 1.0, False
    try:
        yield head
    finally:
        head.set_routing(routing)
        head.residual_scale, head.domain_routing = scale, domains


def merge_routing_stats(head: nn.Module, accelerator: Any | None) -> None:
    """Sum the per-process routing counters (call on every process) so ``head.routing_stats()`` describes
    every process's inputs, as in a one-process run."""
    if not isinstance(head, MoEHead) or head.router is None or accelerator is None \
            or accelerator.num_processes < 2:
        return
    router = head.router
    router.running_counts.copy_(accelerator.reduce(router.running_counts, "sum"))
    seen = torch.tensor([float(router.inputs_seen)], device=router.running_counts.device)
    router.inputs_seen = int(accelerator.reduce(seen, "sum").item())


@dataclass
class HeadTrainResult(LoopResult):
    """The loop's result plus the head's routing statistics over the last stage and per-step expert load (both
    empty for heads that are not a ``MoEHead``)."""

    routing_stats: dict[str, Any] = field(default_factory=dict)
    expert_load: dict[str, Any] = field(default_factory=dict)


def expert_load_log(head: nn.Module, stages: list[Stage]) -> dict[str, Any]:
    """The per-step expert load of a finished run's routed stages for ``train_log.json``: ``{"names", "rows":
    [{"stage", "step", "load"}]}`` (empty without routed experts; steps before a resume point are not in it)."""
    if not isinstance(head, MoEHead) or head.router is None:
        return {}
    rows = [{"stage": s.name, **row} for s in stages for row in getattr(s.step, "load_history", [])]
    return {"names": list(head.config.routed_experts), "rows": rows}


def _check_inputs(query: Tensor, positive: Tensor, negatives: Tensor | None) -> None:
    if query.dim() != 2 or query.shape != positive.shape:
        raise ConfigError(f"query_emb and pos_emb must both be (N, d); got {tuple(query.shape)}, "
                          f"{tuple(positive.shape)}")
    if negatives is not None and (negatives.dim() != 3 or negatives.shape[0] != query.shape[0]
                                  or negatives.shape[2] != query.shape[1]):
        raise ConfigError(f"neg_emb must be (N, n, d) matching query_emb {tuple(query.shape)}; "
                          f"got {tuple(negatives.shape)}")
    if query.shape[0] == 0:
        raise ConfigError("no training pairs")


def _fingerprint(head: nn.Module, tensors: list[Tensor | None], training: MoETrainingSection,
                 loss: InfoNCESection, route: str = "all") -> str:
    """Identity of a :func:`train_head` run (configuration, head, route, training data), so that a checkpoint
    of another run is refused."""
    config: Any = type(head).__name__
    if isinstance(head, MoEHead):
        config = head.get_config_dict()
    elif callable(getattr(head, "get_config_dict", None)):  # LinearHead, SearchAdaptorHead: their configuration too
        config = [config, head.get_config_dict()]
    parts = [training.model_dump(mode="json", exclude={"device", "checkpoint_every_steps", "encode_batch_size"}),
             loss.model_dump(mode="json"), config, [None if t is None else list(t.shape) for t in tensors]]
    if route != "all":  # runs on every input keep the fingerprint they had before routes existed
        parts.append(route)
    digest = hashlib.sha256(json.dumps(parts, sort_keys=True, default=str).encode())
    for t in tensors:
        if t is not None:
            digest.update(t.detach().cpu().contiguous().numpy().data)
    return digest.hexdigest()[:32]


def train_head(head: nn.Module, query_emb: Tensor, pos_emb: Tensor, neg_emb: Tensor | None = None,
               training: MoETrainingSection | None = None, loss: InfoNCESection | None = None, *,
               accelerator: Any | None = None, checkpoint: CheckpointConfig | str | Path | None = None,
               fingerprint: str | None = None, route: str = "all",
               progress: Callable[[str, int, int, dict[str, Any]], None] | None = None) -> HeadTrainResult:
    """Train ``head`` (any module mapping ``features["sentence_embedding"]``) in place on cached raw ``(N, d)``
    query / positive and optional ``(N, n, d)`` hard-negative embeddings through :func:`head_stages`: the Python
    API of the ``moe`` recipe's fast path. ``training.seed`` seeds data order and random routing; without an
    ``accelerator`` (one process) ``training.device`` places the head. ``checkpoint`` (a ``CheckpointConfig`` or a
    folder): a later call resumes, unless its ``fingerprint`` (default: a hash of configuration, head and data)
    differs. ``route``: the side the head maps. ``progress(stage, step, total, row)`` runs after every step.
    """
    training = training if training is not None else MoETrainingSection()
    loss = loss if loss is not None else InfoNCESection()
    _check_inputs(query_emb, pos_emb, neg_emb)
    if accelerator is None:
        if training.mixed_precision != "no":
            raise ConfigError(f"training.mixed_precision={training.mixed_precision!r} needs an accelerator: "
                              "pass accelerator=accelerate.Accelerator(mixed_precision=...)")
        device = torch.device(training.device) if training.device else next(head.parameters()).device
    else:
        device = accelerator.device
    head.to(device)
    if isinstance(checkpoint, (str, Path)):
        checkpoint = CheckpointConfig(Path(checkpoint), every_steps=training.checkpoint_every_steps)
    tensors = [query_emb.float(), pos_emb.float(), None if neg_emb is None else neg_emb.float()]
    if checkpoint is not None and fingerprint is None:
        fingerprint = _fingerprint(head, tensors, training, loss, route)
    with head_training(head):
        stages = head_stages(head, *tensors, training, loss, route=route)
        res = train(head, stages, seed=training.seed, accelerator=accelerator, checkpoint=checkpoint,
                    fingerprint=fingerprint, progress=progress)
    merge_routing_stats(head, accelerator)
    return HeadTrainResult(loss_history=res.loss_history, stage_steps=res.stage_steps, seconds=res.seconds,
                           routing_stats=head.routing_stats() if isinstance(head, MoEHead) else {},
                           expert_load=expert_load_log(head, stages))


@torch.no_grad()
def encode_with_head(head: nn.Module, emb: Tensor, batch_size: int = 1024) -> Tensor:
    """``head`` then L2 normalisation on cached raw embeddings ``(N, d)`` in eval mode (what the attached head and
    ``Normalize`` compute), float32 on ``emb``'s device."""
    was_training = head.training
    head.eval()
    device = next(head.parameters()).device
    try:
        outputs = []
        for start in range(0, emb.shape[0], batch_size):
            block = emb[start: start + batch_size].to(device=device, dtype=torch.float32)
            mapped = head({"sentence_embedding": block})["sentence_embedding"]
            outputs.append(torch.nn.functional.normalize(mapped, dim=-1).to(emb.device))
        return torch.cat(outputs) if outputs else emb.new_zeros((0, emb.shape[-1]), dtype=torch.float32)
    finally:
        head.train(was_training)
