"""What ``medadapt plan`` needs for a ``kind: moe`` recipe (:mod:`medadapt.plan`)."""

from __future__ import annotations

from medadapt.adapters.types import adapter_type_of
from medadapt.moe.sections import MoERecipe
from medadapt.plan import LoraSpec, ModelSpec, PhaseSpec, PlanSpec, Usage, find_config

__all__ = ["plan_spec"]


def plan_spec(recipe: MoERecipe) -> PlanSpec:
    """Fast path: the frozen backbone encodes the corpus into the cache (no gradients) and only the head trains,
    on cached embeddings (query, positive and the mined negatives per example). Slow path: the backbone (or its
    LoRA) trains on the texts."""
    m, tr = recipe.model, recipe.training
    cfg, _ = find_config(m.backbone, recipe._source)
    seq = m.max_seq_length or min(int(cfg.get("max_position_embeddings") or 512), 512)
    mining = recipe.data.hard_negatives
    texts = 2 + (mining.num_negatives if mining is not None else 0)
    head = 0
    if recipe.head.kind != "none":
        built = adapter_type_of(recipe.head).build(recipe.head, int(cfg["hidden_size"]))
        head = sum(p.numel() for p in built.parameters())
    lora = m.peft and LoraSpec(m.peft.r, m.peft.alpha, m.peft.dropout,
                               tuple(m.peft.target_modules) if m.peft.target_modules else None)
    if recipe.fast:
        models = (ModelSpec("backbone", m.backbone, lora=lora or None), ModelSpec("head", None, head_params=head))
        uses = (Usage("backbone", texts, seq, trains=False), Usage("head", texts, 1))
        notes = ("the head trains on cached backbone embeddings: activations are a few floats per text",)
    else:
        models = (ModelSpec("backbone", m.backbone, lora=lora or None, head_params=head),)
        uses, notes = (Usage("backbone", texts, seq),), ()
    epochs = tr.shared_epochs + tr.random_routing_epochs + tr.epochs
    phases = (PhaseSpec(f"training ({epochs} epochs)", tr.batch_size, tr.gradient_accumulation_steps, uses),)
    # the fast path's stages (medadapt.moe.schedule): "shared" has its own optimiser, random and learned share one
    moe = recipe.head.kind == "moe"
    shared = bool(moe and recipe.head.shared_experts and tr.shared_epochs)
    rest = bool((moe and recipe.head.routed_experts and tr.random_routing_epochs) or tr.epochs)
    optimizers = int(shared) + int(rest) if recipe.fast else 1
    return PlanSpec(recipe.name, models, phases, tr.mixed_precision, notes, optimizers=optimizers)
