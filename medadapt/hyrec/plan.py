"""What ``medadapt plan`` needs for a ``kind: hyrec`` recipe (:mod:`medadapt.plan`)."""

from __future__ import annotations

from medadapt.hyrec.sections import HyReCRecipe
from medadapt.plan import ModelSpec, PhaseSpec, PlanSpec, Usage, find_config
from medadapt.plan.memory import mlm_logit_bytes

__all__ = ["plan_spec"]


def plan_spec(recipe: HyReCRecipe) -> PlanSpec:
    """What ``medadapt plan`` needs (:mod:`medadapt.plan`): the GLAE encoder (the backbone's first
    ``num_layers`` layers plus the lexicon copy of ``lexicon_layers`` layers) with its projectors, the
    RetroMAE pre-training phase when the recipe has one (one text of ``pretrain.max_length`` tokens), the
    preliminary fine-tuning phase when the recipe has one (a query and its positive), and the fine-tuning
    phase (a query of ``query_max_length`` tokens, its positive and ``negatives.num`` passages of
    ``passage_max_length``)."""
    m, tr = recipe.model, recipe.training
    cfg, _ = find_config(m.backbone, recipe._source)
    h = int(cfg.get("hidden_size") or 0)
    projectors = (h + 1) + (4 * h + 4) + (h * h + h)  # weight (h -> 1), union (h -> 4), dense (h -> h)
    full = m.variant == "full"
    models = [ModelSpec("encoder", m.backbone, num_layers=m.num_layers,
                        extra_layers=m.lexicon_layers or m.branch_layers, head_params=projectors if full else 0)]
    if not full:
        models.append(ModelSpec("projectors", None, head_params=projectors))
    passages = 1 + (recipe.negatives.num if recipe.negatives.source != "none" else 0)
    uses = (Usage("encoder", 1, m.query_max_length, trains=full),
            Usage("encoder", passages, m.passage_max_length, trains=full)) + \
        (() if full else (Usage("projectors", 1 + passages, 1),))
    per_device = tr.batch_size_scope == "per_device"  # the preliminary stage follows training's scope
    phases = (PhaseSpec("fine-tuning", tr.batch_size, tr.gradient_accumulation_steps, uses, per_device=per_device),)
    notes = (f"hard negatives are mined with {recipe.negatives.miner} before training (inference only, not planned)",) \
        if recipe.negatives.source == "dense" else ()
    pre = recipe.prefinetune
    if pre is not None:  # query + its positive, in-batch negatives only
        ptr = pre.training(tr)
        pre_uses = (Usage("encoder", 1, m.query_max_length, trains=full),
                    Usage("encoder", 1, m.passage_max_length, trains=full)) + \
            (() if full else (Usage("projectors", 2, 1),))
        phases = (PhaseSpec("preliminary fine-tuning", ptr.batch_size, ptr.gradient_accumulation_steps,
                            pre_uses, per_device=per_device), *phases)
        if pre.scorer is not None:
            notes += (f"preliminary pairs are scored with {pre.scorer} before training (inference only, not planned)",)
    pt = recipe.pretrain
    if pt is not None:  # the backbone once per text, + the MLM head's logits on the masked tokens
        length = pt.max_length or m.dense_max_length or m.passage_max_length
        masked = (pt.encoder_mask_ratio + pt.decoder_mask_ratio) * length  # MLM logits on masked tokens only
        logits = mlm_logit_bytes(masked, int(cfg.get("vocab_size") or 0))
        phases = (PhaseSpec("RetroMAE pre-training", pt.batch_size, pt.gradient_accumulation_steps,
                            (Usage("encoder", 1, length, trains=full or tr.train_dense_encoder),),
                            extra_bytes_per_example=logits, per_device=pt.batch_size_scope == "per_device"),
                  *phases)
        note = (f"RetroMAE pre-training: the MLM head's logits on the masked tokens are counted ({logits / 2**30:.3f} "
                "GB per example); the one-layer decoder is not; the lexicon copy does not run there but is counted")
        notes += (note,)
    scoped = [name for name, on in (("pretrain", pt is not None and pt.batch_size_scope == "per_device"),
                                     ("training", tr.batch_size_scope == "per_device")) if on]
    if scoped:
        notes += ((f"batch_size_scope: per_device ({', '.join(scoped)}): that batch_size is per device, the "
                   "global batch is batch_size x gradient_accumulation_steps x devices"),)
    return PlanSpec(recipe.name, tuple(models), phases, tr.mixed_precision, notes)
