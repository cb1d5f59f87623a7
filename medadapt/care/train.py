"""CARE training (``kind: care``): one phase function per phase, each returning ``(module, Stage)`` for the one
loop (the stages themselves are built in :mod:`medadapt.care.stages`), and :func:`train`, which composes them:
document tower (+ init) -> query tower (+ RetroMAE -> unsupervised -> supervised init) -> Router model ->
stage I -> stage II -> merged LoRA -> branches."""

from __future__ import annotations

import contextlib
import random
import time
from typing import TYPE_CHECKING

import torch

import medadapt.training.lora as training_lora
from medadapt.adapters.compose import branch_kind, check_composition
from medadapt.care.alignment_loss import QueryAlignmentLoss
from medadapt.care.data import mined_pairs, self_contrastive_texts
from medadapt.care.lora import attach_document_lora, merge_document_lora
from medadapt.care.model import build_asymmetric_model, build_document_tower, build_query_tower, tower
from medadapt.care.sections import CareRecipe, _InitTexts
from medadapt.care.stages import (AlignReplay, AlignStep, align_stage, init_stage, joint_stage,
                                  teacher_targets, trainable_only, unsupervised_stage)
from medadapt.data import load_beir
from medadapt.losses import AsymInfoNCELoss, InfoNCELoss, LearnableTemperatureInfoNCELoss, MatryoshkaLoss
from medadapt.training.lora import attach_lora, merge_lora
from medadapt.training.retromae import retromae_stage

if TYPE_CHECKING:
    from medadapt.recipes.run import RunContext

__all__ = ["init_document", "init_query", "query_pretrain", "query_unsupervised", "stage1", "stage2", "train"]


def train(recipe: CareRecipe, ctx: RunContext):
    """Train what a CARE recipe describes; returns the asymmetric model (saved by the runner). Each phase runs
    through ``ctx.train`` with its own checkpoint folder (a re-run resumes); its summary (steps, seconds,
    first / last loss) goes to ``ctx.result.details["stages"]``."""
    init, s1, s2, q_init = recipe.init, recipe.stage1, recipe.stage2, recipe.init.query
    stages = ctx.result.details.setdefault("stages", {})
    supervised_init = bool(init.document) or bool(q_init and q_init.supervised)
    splits = set(recipe.stage1_splits()) if s1.enabled else set()
    if s2.enabled:
        splits.add(recipe.stage2_split())
    if supervised_init:
        splits.add(recipe.init_split())
    for sec in (q_init.pretrain, q_init.unsupervised) if q_init else ():
        if sec is not None:
            splits.update(recipe.init_text_splits(sec))
    data = load_beir(ctx.resolve(recipe.data.path), sorted(splits) or None)
    doc_texts = data.doc_texts()

    document = build_document_tower(recipe.document, ctx.device)
    _check_branches(recipe, document)  # before anything trains
    init_pairs = None
    if supervised_init:
        if init.negatives:  # under a multi-process launch every process encodes a share first
            ctx.share_encoding(document, doc_texts, batch_size=recipe.training.encode_batch_size)
        with _encoding(ctx):
            init_pairs = _mined(recipe, data, recipe.init_split(), init.max_queries, init.negatives, document, ctx)
    if init.document:
        _run(ctx, *init_document(recipe, document, init_pairs, doc_texts, ctx))
        merge_lora(document)

    stage1_items = []
    if s1.enabled:
        stage1_items = self_contrastive_texts(data, recipe.stage1_splits(), s1.include_corpus, s1.max_texts,
                                              recipe.training.seed, s1.max_corpus_texts, s1.corpus_units)
    distil_texts = doc_texts + [t for t, r in stage1_items if r == "query"]  # static: token table + SIF
    query = build_query_tower(recipe.query, document, distil_texts, ctx.device)
    if q_init and q_init.pretrain:
        pretrainer, stage = query_pretrain(recipe, query, data, ctx)
        _run(ctx, pretrainer, stage)  # trains the query tower's encoder in place; the decoder is dropped here
        del pretrainer
    if q_init and q_init.unsupervised:
        module, stage = query_unsupervised(recipe, query, data, ctx)
        _run(ctx, module, stage)
        stages[stage.name]["temperature"] = round(stage.step.loss_fn.temperature, 6)
    if q_init and q_init.supervised:
        _run(ctx, *init_query(recipe, query, init_pairs, doc_texts, ctx))

    towers = {"query": recipe.query, "document": recipe.document}
    arch = recipe.architecture
    model = build_asymmetric_model(query, document, projection=arch.projection, truncate_to=arch.truncate_to,
                                   prompts={r: s.prompts[r] for r, s in towers.items() if r in s.prompts},
                                   device=ctx.device)
    align = None
    if s1.enabled:
        _, stage = stage1(recipe, model, document, stage1_items, doc_texts, ctx)
        _run(ctx, model, stage)
        align = stage.step
    if s2.enabled:
        _run(ctx, *stage2(recipe, model, document, data, doc_texts, align, ctx))
    if recipe.training.merge_lora_on_save:
        merge_document_lora(model)
    for section in recipe.branches:  # each branch wraps the model it is given (medadapt.adapters.compose)
        model = branch_kind(section.kind).build_and_train(model, section, recipe, ctx)
    return model


# ---------------------------------------------------------------------------------------------- phases
def init_document(recipe: CareRecipe, document, pairs, doc_texts, ctx: RunContext):
    """Independent initialisation of the document tower (Appendix C.1): symmetric InfoNCE, MRL-wrapped when
    ``document.mrl_dims`` is set (eq. 5), through LoRA when ``document.lora`` is."""
    init, spec = recipe.init, recipe.document
    if spec.lora is not None:
        attach_lora(document, spec.lora, gradient_checkpointing=spec.gradient_checkpointing)
    elif spec.gradient_checkpointing:
        training_lora.enable_gradient_checkpointing(document)  # through the module: tests spy on it
    base = InfoNCELoss(init.temperature)
    loss = MatryoshkaLoss(base, spec.mrl_dims) if spec.mrl_dims else base
    ctx.log("init: document tower (symmetric InfoNCE" + (" + MRL)" if spec.mrl_dims else ")"))
    return document, init_stage(document, pairs, doc_texts, init.document, loss, max_length=init.max_length,
                                name="init_document")


def query_pretrain(recipe: CareRecipe, query, data, ctx: RunContext):
    """Query-init step 1: RetroMAE on the texts of ``init.query.pretrain``; the module to train is the
    pre-trainer (the query tower's encoder inside it changes in place)."""
    section = recipe.init.query.pretrain
    texts = [t for t, _ in _init_texts(data, recipe, section)]
    ctx.log(f"init: query tower, RetroMAE pre-training on {len(texts)} texts")
    return retromae_stage(query, texts, section, name="init_query_pretrain")


def query_unsupervised(recipe: CareRecipe, query, data, ctx: RunContext):
    """Query-init step 2: InfoNCE with a learnable temperature on (title, content) pairs, or each text with
    itself (two dropout views)."""
    un = recipe.init.query.unsupervised
    titled: dict[str, tuple[str, str]] = {}
    if un.positives == "title_text" and un.include_corpus:
        for doc in data.corpus.values():
            title = (doc.get("title") or "").strip()
            if title and doc["text"].strip():
                titled[f"{title} {doc['text']}".strip()] = (title, doc["text"])
    pairs = [titled.get(text, (text, text)) for text, _ in _init_texts(data, recipe, un)]
    random.Random(recipe.training.seed).shuffle(pairs)
    loss = LearnableTemperatureInfoNCELoss(un.temperature, min_temperature=un.min_temperature,
                                           learnable=un.learn_temperature)
    ctx.log(f"init: query tower, unsupervised InfoNCE (learnable temperature) on {len(pairs)} pairs")
    return unsupervised_stage(query, pairs, un, loss, max_length=un.max_length, name="init_query_unsupervised")


def init_query(recipe: CareRecipe, query, pairs, doc_texts, ctx: RunContext):
    """Query-init step 3: supervised symmetric InfoNCE on labelled pairs and mined negatives."""
    init = recipe.init
    ctx.log("init: query tower (symmetric InfoNCE)")
    return query, init_stage(query, pairs, doc_texts, init.query, InfoNCELoss(init.temperature),
                             max_length=init.max_length, name="init_query")


def stage1(recipe: CareRecipe, model, document, items, doc_texts, ctx: RunContext):
    """Stage I: the query route learns the frozen document tower's cached embedding of each text (eq. 3),
    plus the ranking distillation over the corpus when ``distill_weight`` > 0."""
    s1, bs = recipe.stage1, recipe.training.encode_batch_size
    dim, documents, show = model.get_embedding_dimension(), None, ctx.show_progress and ctx.is_main
    with _encoding(ctx):
        teacher = teacher_targets(document, items, ctx.cache, dim=dim, batch_size=bs, show_progress=show)
        if s1.distill_weight > 0:  # the teacher's corpus, that the query tower learns to rank alike
            documents = teacher_targets(document, [(t, "document") for t in doc_texts], ctx.cache, dim=dim,
                                        batch_size=bs, show_progress=show)
    ranked = f" (ranking distillation over {len(doc_texts)} documents)" if documents is not None else ""
    ctx.log(f"stage I: aligning the query tower on {len(items)} texts{ranked}")
    loss = QueryAlignmentLoss(s1.temperature, s1.contrastive_weight, s1.mse_weight, documents=documents,
                              distill_weight=s1.distill_weight, distill_temperature=s1.distill_temperature)
    return model, align_stage(model, [t for t, _ in items], teacher, s1, loss, max_length=s1.max_length,
                              name="stage1")


def stage2(recipe: CareRecipe, model, document, data, doc_texts, align: AlignStep | None, ctx: RunContext):
    """Stage II: Asym-InfoNCE (eq. 4) on labelled pairs with negatives mined by ``document``; the document
    route trains (through LoRA when set) or is a frozen table of cached embeddings. With ``align_weight`` > 0,
    stage I's alignment (``align``, its step) is replayed."""
    s2, bs, lora = recipe.stage2, recipe.training.encode_batch_size, recipe.document.lora
    doc_table = None
    if s2.negatives:
        ctx.share_encoding(document, doc_texts, batch_size=bs)
    if not s2.train_document:
        ctx.share_encoding(tower(model, "document"), doc_texts, batch_size=bs)
    with _encoding(ctx):
        pairs = _mined(recipe, data, recipe.stage2_split(), s2.max_queries, s2.negatives, document, ctx)
        if s2.train_document and lora is not None:
            attach_document_lora(model, lora, gradient_checkpointing=recipe.document.gradient_checkpointing)
        elif not s2.train_document:
            table = ctx.cache.encode(tower(model, "document"), doc_texts, role="document", batch_size=bs,
                                     show_progress=ctx.show_progress and ctx.is_main)
            doc_table = torch.from_numpy(table)
    how = "frozen"
    if s2.train_document:
        how = "trainable via LoRA" if lora is not None else "fully trainable"
    ctx.log(f"stage II: joint fine-tuning on {len(pairs)} pairs (document tower {how})")
    replay = None
    if s2.align_weight > 0:  # stage I's texts and teacher rows, kept aligned during stage II
        replay = AlignReplay(align.texts, align.teacher, align.loss_fn, s2.align_weight,
                             max_length=recipe.stage1.max_length)
        ctx.log(f"stage II: replaying stage I's alignment on {len(align.texts)} texts (weight {s2.align_weight:g})")
    return model, joint_stage(model, pairs, doc_texts, s2, AsymInfoNCELoss(s2.temperature),
                              train_document=s2.train_document, doc_table=doc_table,
                              query_max_length=s2.query_max_length, doc_max_length=s2.document_max_length,
                              align=replay, name="stage2")


# ---------------------------------------------------------------------------------------------- helpers
def _run(ctx: RunContext, module, stage) -> None:
    """Train ``stage`` with only its parameters trainable; record its summary."""
    with trainable_only(module, stage.params):
        res = ctx.train(module, [stage], name=stage.name)
    hist = res.loss_history
    ctx.result.details["stages"][stage.name] = {
        "steps": res.steps, "seconds": round(res.seconds, 2), "first_loss": hist[0]["loss"] if hist else None,
        "last_loss": hist[-1]["loss"] if hist else None,
        "last_parts": {k: v for k, v in (hist[-1] if hist else {}).items()
                       if k not in ("stage", "step", "epoch", "loss", "lr")}}


@contextlib.contextmanager
def _encoding(ctx: RunContext):
    """Counts as encoding time; the main process goes first (it fills the cache, the others read it)."""
    t0 = time.perf_counter()
    with ctx.accelerator.main_process_first():
        yield
    ctx.result.encode_seconds += time.perf_counter() - t0


def _mined(recipe: CareRecipe, data, split: str, max_queries, negatives: int, document, ctx: RunContext):
    s2 = recipe.stage2
    return mined_pairs(data, split, max_queries, negatives, s2.skip_top, s2.depth, document, ctx.cache,
                       recipe.training.encode_batch_size, recipe.training.seed)


def _check_branches(recipe: CareRecipe, document) -> None:
    """The branches against the compositions allowed on ``asymmetric`` and each kind's ``check``, on a probe
    whose two routes are the built document tower (the query tower does not exist yet)."""
    if not recipe.branches:
        return
    check_composition("asymmetric", [(b.kind, "branch") for b in recipe.branches])
    probe = build_asymmetric_model(document, document, truncate_to=None)
    for section in recipe.branches:
        kind = branch_kind(section.kind)
        if kind.check is not None:
            kind.check(probe, section, recipe)


def _init_texts(data, recipe: CareRecipe, section: _InitTexts) -> list[tuple[str, str]]:
    return self_contrastive_texts(data, recipe.init_text_splits(section), section.include_corpus,
                                  section.max_texts, recipe.training.seed)
