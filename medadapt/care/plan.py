"""What ``medadapt plan`` needs (:mod:`medadapt.plan`) from a CARE recipe."""

from __future__ import annotations

from medadapt.care.sections import CareRecipe
from medadapt.plan import LoraSpec, ModelSpec, PhaseSpec, PlanSpec, Usage, find_config
from medadapt.plan.memory import mlm_logit_bytes

__all__ = ["plan_spec"]


def plan_spec(recipe: CareRecipe):
    """The two towers and the phases that train them (init per tower, the query tower's RetroMAE /
    unsupervised steps, stage I with the document tower frozen, stage II), texts per example as each phase
    encodes them (query, positive, ``negatives`` hard negatives)."""
    doc, q = recipe.document, recipe.query
    lora = LoraSpec(doc.lora.r, doc.lora.alpha, doc.lora.dropout,
                    tuple(doc.lora.target_modules) if doc.lora.target_modules else None) if doc.lora else None
    models = [ModelSpec("document", doc.model, lora=lora, torch_dtype=doc.torch_dtype,
                        gradient_checkpointing=doc.gradient_checkpointing)]
    notes = []
    if q.kind == "sentence_transformer":
        models.append(ModelSpec("query", q.model))
    elif q.kind == "pruned":
        models.append(ModelSpec("query", doc.model, torch_dtype=doc.torch_dtype, num_layers=q.layers,
                                gradient_checkpointing=doc.gradient_checkpointing))
    else:
        notes.append("the static query tower (a token table, no transformer) is not planned")
    dlen, qlen = doc.max_seq_length or 512, getattr(q, "max_seq_length", None) or 512
    has_q = q.kind != "static"
    ini, phases = recipe.init, []
    n = 2 + ini.negatives
    if ini.query is not None and has_q:
        pre, un = ini.query.pretrain, ini.query.unsupervised
        if pre is not None:  # the encoder once per text, + the MLM head's logits on the masked tokens
            length = pre.max_length or qlen
            vocab = int(find_config(q.model, recipe._source)[0].get("vocab_size") or 0)
            logits = mlm_logit_bytes((pre.encoder_mask_ratio + pre.decoder_mask_ratio) * length, vocab)
            phases.append(PhaseSpec("init query: RetroMAE", pre.batch_size, pre.gradient_accumulation_steps,
                                    (Usage("query", 1, length),), extra_bytes_per_example=logits))
            notes.append(f"init query: RetroMAE: the MLM head's logits on the masked tokens are counted "
                         f"({logits / 2**30:.3f} GB per example); the one-layer decoder (about one encoder layer) "
                         "is not")
        if un is not None:
            phases.append(PhaseSpec("init query: unsupervised", un.batch_size, un.gradient_accumulation_steps,
                                    (Usage("query", 2, un.max_length or qlen),)))
        if ini.query.supervised:
            phases.append(PhaseSpec("init query", ini.query.batch_size, ini.query.gradient_accumulation_steps,
                                    (Usage("query", n, ini.max_length or qlen),)))
    if ini.document is not None:
        phases.append(PhaseSpec("init document", ini.document.batch_size, ini.document.gradient_accumulation_steps,
                                (Usage("document", n, ini.max_length or dlen),)))
    s1, s2 = recipe.stage1, recipe.stage2
    if s1.enabled and has_q:
        phases.append(PhaseSpec("stage I", s1.batch_size, s1.gradient_accumulation_steps,
                                (Usage("query", 1, s1.max_length or qlen), Usage("document", 1, dlen, trains=False))))
    if s2.enabled:
        uses = [Usage("document", 1 + s2.negatives, s2.document_max_length or dlen, trains=s2.train_document)]
        if has_q:
            uses.append(Usage("query", 1, s2.query_max_length or qlen))
        phases.append(PhaseSpec("stage II", s2.batch_size, s2.gradient_accumulation_steps, tuple(uses)))
    notes.append("stage I: the document tower's targets are cached (computed without gradients) before training")
    if s1.enabled and has_q and s1.distill_weight > 0:
        notes.append("stage I: ranking distillation keeps the corpus's document embeddings on every device "
                     "(N x d fp32, e.g. 1M x 4096 = 16 GiB) plus a (batch x N) score matrix; not counted, "
                     "the plan does not know the corpus size")
    return PlanSpec(recipe.name, tuple(models), tuple(phases), recipe.training.mixed_precision, tuple(notes))
