"""The BMRetriever recipe kind (``kind: bmretriever``; schema in :mod:`medadapt.bmretriever.schema`) for the
one runner (:func:`medadapt.recipes.run_recipe`, ``medadapt train``, also under ``accelerate launch``).

:func:`train` builds the encoder (:func:`~medadapt.bmretriever.model.build_retriever`), then runs
**stage I** (§3.2: title -> text / cropped pairs, in-batch negatives; the merged model is saved to
``<output>.checkpoints/stage1-model`` so a re-run skips a finished stage I) and **stage II** (§3.3: per task
(query, positive, hard negative) rows, the negative one random passage of the base retriever's top 100,
optional synthetic data: instance-level sources consistency-filtered and task-level examples, each generated
until its target is kept or its cap reached, with generated / kept per source in
``ctx.result.details["synthetic"]``, i.e. ``train_log.json``), each with a fresh LoRA adapter (seeded) merged
afterwards, each a Stage of the one loop (:func:`~medadapt.bmretriever.train.contrastive_stage`; checkpoints in
``<output>.checkpoints/stage1`` and ``stage2``, each folder claimed by the fingerprint of what decides its
weights, so a re-run with another recipe or data is refused). It returns the model with the ``query``
(evaluation instruction) and ``document`` (passage) prompts; per-stage summaries go to
``ctx.result.details["stages"]``.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from medadapt.bmretriever.finetune_data import beir_groups, groups_to_dataset, subsample_groups
from medadapt.bmretriever.instructions import query_prompt
from medadapt.bmretriever.model import build_retriever
from medadapt.bmretriever.pretrain_data import CorpusSource, CropConfig, pretrain_dataset
from medadapt.bmretriever.schema import BmRetrieverRecipe, BmStageSection, Stage2Section
from medadapt.bmretriever.synthetic import (
    FakeQueryGenerator,
    FakeTaskGenerator,
    LLMQueryGenerator,
    LLMTaskGenerator,
    OpenAICompatibleClient,
    TransformersChatClient,
    filter_task_groups,
    generate_instance_data,
    generate_task_data,
)
from medadapt.bmretriever.train import contrastive_stage, logged_rows
from medadapt.checksums import ChecksumError, verify_sums, write_sums
from medadapt.curation import DenseSearcher
from medadapt.data import load_beir
from medadapt.data.beir import BeirDataset
from medadapt.data.training import TrainingGroup, load_training_groups
from medadapt.errors import ConfigError, warn
from medadapt.io import atomic_write_text
from medadapt.models import load
from medadapt.plan import LoraSpec, ModelSpec, PhaseSpec, PlanSpec, Usage
from medadapt.recipes.run import RunContext, fingerprint, replace_folder
from medadapt.systems import load_paper
from medadapt.training.checkpoint import CheckpointCorruptError, all_checkpoints, load_checkpoint
from medadapt.training.lora import attach_lora, enable_gradient_checkpointing, merge_lora

__all__ = ["stage1_dataset", "stage2_datasets", "train"]


def _resolve(recipe: BmRetrieverRecipe, value: str) -> str:
    return str(recipe.resolve(value))


def stage1_dataset(recipe: BmRetrieverRecipe):
    """The stage I ``Dataset`` (``anchor`` / ``positive``) the recipe describes."""
    s1 = recipe.stage1
    sources = [CorpusSource(_resolve(recipe, sec.path), sec.mode, sec.title_field, sec.text_field,
                            sec.id_field, sec.max_docs) for sec in s1.sources]
    sources = sources or [CorpusSource(_resolve(recipe, recipe.data.path))]
    return pretrain_dataset(sources, CropConfig(s1.min_words, s1.max_words), recipe.training.seed,
                            s1.max_pairs)


def stage2_datasets(recipe: BmRetrieverRecipe, *, cache=None, device: str | None = None,
                    show_progress: bool = True, log: Callable[[str], None] = print, base=None,
                    report: dict | None = None):
    """``(datasets, prompts)`` for stage II: ``{task: Dataset}`` and ST prompts
    ``{task: {column: prompt}}``. ``base``: the mining retriever, already loaded (default: loaded here from
    ``stage2.base_retriever`` when a task mines). ``report``: filled with each synthetic source's
    :meth:`~medadapt.bmretriever.synthetic.SyntheticReport.as_dict` (generated / kept), by source name."""
    s2, ins, tr = recipe.stage2, recipe.instructions, recipe.training
    mining = s2.mining
    if "seed" not in mining.model_fields_set:
        mining = mining.model_copy(update={"seed": tr.seed})
    out, prompts, searchers = {}, {}, {}

    def searcher_for(path: str, data):
        nonlocal base
        if path not in searchers:
            if base is None:
                base = load(s2.base_retriever, device=device)
            searchers[path] = DenseSearcher(base, data.doc_ids, data.doc_texts(), cache=cache,
                                            batch_size=tr.encode_batch_size, show_progress=show_progress)
        return searchers[path]

    def add(name: str, groups, instruction: str) -> None:
        out[name] = groups_to_dataset(groups, hard_negatives=s2.hard_negatives)
        prompts[name] = {"anchor": query_prompt(instruction, ins.query_template), "positive": ins.passage,
                         "negative": ins.passage}

    for task in s2.tasks:
        instruction = recipe.task_instruction(task)
        if task.kind == "beir":
            path = _resolve(recipe, task.path or recipe.data.path)
            data = load_beir(path, [task.split])
            groups = beir_groups(data, task.split, searcher_for(path, data), mining,
                                 max_queries=task.max_queries, seed=tr.seed, show_progress=show_progress)
        else:
            groups = subsample_groups(load_training_groups(_resolve(recipe, task.path)), task.max_queries,
                                      tr.seed)
        add(task.name, groups, instruction)
        log(f"stage II task {task.name}: {len(out[task.name])} rows from {len(groups)} groups")
    reports = report if report is not None else {}

    def record(rep, **details) -> None:
        rep.details.update(details)
        reports[rep.name] = rep.as_dict()
        log(rep.summary())
        if rep.kept < rep.target:
            warn(f"synthetic {rep.level} level {rep.name}: kept {rep.kept:,}, fewer than the target "
                 f"{rep.target:,} ({rep.stopped}); raise the cap (max_generated, overgenerate) or lower the target")

    if s2.synthetic is not None:
        syn = s2.synthetic
        gen = (FakeQueryGenerator(noise=syn.noise, seed=tr.seed) if syn.generator == "fake"
               else LLMQueryGenerator(chat_client(syn, device), max_new_tokens=syn.max_new_tokens or 48))
        for source in syn.sources:
            path = _resolve(recipe, source.corpus or recipe.data.path)
            data = load_beir(path, [])
            searcher = searcher_for(path, data)
            instruction = ins.synthetic.get(source.instruction, source.instruction)
            ids = data.doc_ids
            cap = syn.cap(source)
            picked = random.Random(tr.seed).sample(range(len(ids)), min(cap, len(ids)))  # a seeded order
            passages = [data.doc_text(ids[i]) for i in picked]
            text_to_id = {data.doc_text(d): d for d in ids}
            kept, rep = generate_instance_data(passages, gen, instruction, searcher, text_to_id,
                                               target=source.passages, max_generated=cap, top_k=syn.top_k,
                                               name=source.name, show_progress=show_progress)
            record(rep, corpus=source.corpus or recipe.data.path, corpus_passages=len(ids),
                   instruction=instruction, top_k=syn.top_k)
            if kept:  # mine negatives for the kept pairs like labelled data, on a temporary BEIR view of them
                queries = {f"syn{i}": g.query for i, g in enumerate(kept)}
                qrels = {f"syn{i}": {text_to_id[g.pos[0]]: 1} for i, g in enumerate(kept)}
                view = BeirDataset(corpus=data.corpus, queries=queries, qrels={"synthetic": qrels},
                                   root=data.root)
                groups = beir_groups(view, "synthetic", searcher, mining, seed=tr.seed,
                                     show_progress=show_progress)
                add(source.name, [TrainingGroup(query=g.query, pos=g.pos, neg=g.neg, prompt=instruction)
                               for g in groups], instruction)
    if s2.task_synthetic is not None:
        ts = s2.task_synthetic
        if ts.generator == "fake":
            data = load_beir(_resolve(recipe, recipe.data.path), [])
            task_gen = FakeTaskGenerator([(data.corpus[d]["title"] or d, data.corpus[d]["text"])
                                          for d in data.doc_ids], seed=tr.seed)
        else:
            task_gen = LLMTaskGenerator(chat_client(ts, device), per_call=ts.per_call,
                                        max_new_tokens=ts.max_new_tokens or 512)

        def positive_above_negative(groups):
            nonlocal base
            if base is None:
                base = load(s2.base_retriever, device=device)
            return filter_task_groups(groups, base, batch_size=tr.encode_batch_size)

        kept, rep = generate_task_data(task_gen, tasks=ts.tasks, examples_per_task=ts.examples_per_task,
                                       max_generated_per_task=ts.cap_per_task, seed=tr.seed,
                                       keep=positive_above_negative if ts.filter else None, name=ts.name)
        record(rep, filter="positive above negative (base retriever)" if ts.filter else None)
        if kept:  # each example carries its own task instruction: applied to its query, no dataset prompt
            out[ts.name] = groups_to_dataset(kept, hard_negatives=s2.hard_negatives,
                                             query_template=ins.query_template)
            prompts[ts.name] = {"anchor": "", "positive": ins.passage, "negative": ins.passage}
    if not out:
        raise ConfigError("stage II has no training data (no task rows and no kept synthetic pairs)")
    return out, prompts


def chat_client(section, device: str | None = None):
    """The :class:`~medadapt.bmretriever.synthetic.ChatClient` a synthetic-data section names (generator
    ``transformers`` or ``openai``)."""
    if section.generator == "openai":
        return OpenAICompatibleClient(section.model, base_url=section.endpoint,
                                      api_key_env=section.api_key_env, temperature=section.temperature)
    return TransformersChatClient(section.model, device=device, temperature=section.temperature)


def stage1_identity(recipe: BmRetrieverRecipe) -> str:
    """Fingerprint of what decides the stage-I weights (model, stage I, instructions, data, training
    settings, data files): the recipe with stage II switched off, through the runner's fingerprint. A
    finished stage I is reused by a re-run only under the same identity."""
    only_stage1 = recipe.model_copy(update={"stage2": Stage2Section(enabled=False)})
    only_stage1._source = recipe._source
    return fingerprint(only_stage1)


def _intact(folder: Path) -> bool:
    """``folder`` holds a finished stage-I model whose ``SHA256SUMS`` lists every file and matches; a damaged
    one is reported with a warning (stage I then resumes from its own checkpoints)."""
    if not (folder / "modules.json").is_file():
        return False
    try:
        verify_sums(folder, complete=True)
    except ChecksumError as exc:
        warn(f"stage I model: {exc}; finishing stage I from its checkpoints again")
        return False
    return True


def _claim(folder: Path, identity: str, ctx: RunContext) -> None:
    """Refuse to resume ``folder`` when it holds the checkpoints of another run; record ``identity``."""
    mark = folder / "fingerprint.txt"
    unmarked = not mark.is_file() and folder.is_dir() and any(folder.glob("step-*"))  # nobody's run
    if unmarked or (mark.is_file() and mark.read_text().strip() != identity):
        raise ConfigError(f"{folder} holds checkpoints of another run (recipe, data or base model differ); "
                          "train into a new output folder, or pass --overwrite to start this one afresh")
    if ctx.is_main and not mark.is_file():
        folder.mkdir(parents=True, exist_ok=True)
        atomic_write_text(mark, identity)
    ctx.accelerator.wait_for_everyone()


def _finished_rows(folder: Path) -> list[dict[str, Any]]:
    """The loss rows of a finished stage, from the newest checkpoint in ``folder`` that reads back intact
    (none when there is none): a re-run that reuses the stage's model reports the rows it trained with."""
    for path in all_checkpoints(folder):
        try:
            return list(load_checkpoint(path)[2]["loss_history"])
        except CheckpointCorruptError:
            continue
    return []


def _share_mining_encode(recipe: BmRetrieverRecipe, ctx: RunContext):
    """Under a multi-process launch with hard-negative mining: the base retriever, loaded on every process,
    after each encoded its share of every mined task's corpus (``ctx.share_encoding``), so the main
    process's mining inside ``main_process_first`` reads the cache; ``None`` otherwise."""
    s2 = recipe.stage2
    beir_tasks = [t for t in s2.tasks if t.kind == "beir"]
    if ctx.accelerator.num_processes <= 1 or not s2.hard_negatives or not beir_tasks:
        return None
    base = load(s2.base_retriever, device=ctx.device)
    for path in dict.fromkeys(_resolve(recipe, t.path or recipe.data.path) for t in beir_tasks):
        ctx.share_encoding(base, load_beir(path, splits=[]).doc_texts(),
                           batch_size=recipe.training.encode_batch_size)
    return base


def train(recipe: BmRetrieverRecipe, ctx: RunContext):
    """Train a BMRetriever recipe (see module docstring); returns the SentenceTransformer with its
    inference prompts."""
    tr, ins, m = recipe.training, recipe.instructions, recipe.model
    acc, log, device = ctx.accelerator, ctx.log, ctx.device
    show = ctx.show_progress and ctx.is_main
    stages: dict[str, Any] = ctx.result.details.setdefault("stages", {})
    model = build_retriever(m.name, m.kind, max_seq_length=m.max_seq_length, padding_side=m.padding_side,
                            torch_dtype=m.torch_dtype, normalize=m.normalize, device=device)

    def run_stage(index: int, name: str, section: BmStageSection, data, prompts, identity: str) -> None:
        _claim(ctx.checkpoint_dir / name, identity, ctx)
        lora = m.lora if section.lora else None
        if lora is not None:
            with torch.random.fork_rng(devices=[]):  # the adapter's initial weights depend on the seed only
                torch.manual_seed(tr.seed * 1_000_003 + index)
                attach_lora(model, lora, gradient_checkpointing=m.gradient_checkpointing)
        elif m.gradient_checkpointing:
            enable_gradient_checkpointing(model)
        stage = contrastive_stage(model, data, prompts, section, seed=tr.seed, name=name)
        rows = stage.n_items
        how = f"LoRA r={lora.r}" if lora is not None else "full fine-tuning"
        log(f"{name}: {rows} rows, global batch {section.effective_batch_size}, {how}, "
            f"tau={section.temperature}")
        res = ctx.train(model, [stage], name=name, fingerprint=identity)
        merge_lora(model)
        hist = logged_rows(res.loss_history, tr.logging_steps or max(1, min(50, res.steps // 20)))
        stages[name] = {"rows": rows, "steps": res.steps, "seconds": round(res.seconds, 2),
                        "first_loss": hist[0]["loss"] if hist else None,
                        "last_loss": hist[-1]["loss"] if hist else None, "loss_history": hist}

    # ---- stage I: unsupervised contrastive pre-training
    stage1_model = ctx.checkpoint_dir / "stage1-model"
    if recipe.stage1.enabled:
        identity = stage1_identity(recipe)
        if _intact(stage1_model):
            _claim(ctx.checkpoint_dir / "stage1", identity, ctx)
            log(f"stage I: finished earlier, loading {stage1_model}")
            model = load(str(stage1_model), device=device)  # trusts only sentence_transformers / medadapt
            stages["stage1"] = {"resumed": True}
            ctx.result.loss_history += _finished_rows(ctx.checkpoint_dir / "stage1")
        else:
            with acc.main_process_first():
                data1 = stage1_dataset(recipe)
            run_stage(0, "stage1", recipe.stage1, data1, {"anchor": ins.pretrain_query, "positive": ins.passage},
                      identity)
            if ctx.is_main:
                with replace_folder(stage1_model) as tmp:
                    model.save(str(tmp))
                    write_sums(tmp)  # a rerun reuses it only when every file is intact
            acc.wait_for_everyone()

    # ---- stage II: instruction fine-tuning with hard negatives
    if recipe.stage2.enabled:
        t0 = time.perf_counter()
        base = _share_mining_encode(recipe, ctx)
        synthetic: dict[str, Any] = {}
        with acc.main_process_first():  # the main process fills the embedding cache, the others read it
            data2, prompts2 = stage2_datasets(recipe, cache=ctx.cache, device=device, show_progress=show,
                                              log=log, base=base, report=synthetic)
        if synthetic:  # generated / kept per synthetic source, in train_log.json
            ctx.result.details["synthetic"] = synthetic
        ctx.result.encode_seconds += time.perf_counter() - t0
        run_stage(1, "stage2", recipe.stage2, data2, prompts2, ctx.fingerprint)

    # ---- the inference prompts (saved with the model)
    model.prompts = {"query": recipe.eval_query_prompt(), "document": ins.passage}
    return model


#: ``medadapt train --paper``: the paper's settings, with where it states each (``paper.yaml`` here).
PAPER = load_paper(Path(__file__).with_name("paper.yaml"))


def frozen_base(recipe: BmRetrieverRecipe, ctx: RunContext):
    """The frozen base a run is compared with (``eval.baseline``, ``eval.also``): the encoder :func:`train`
    starts from, untrained, with the same inference prompts."""
    m = recipe.model
    model = build_retriever(m.name, m.kind, max_seq_length=m.max_seq_length, padding_side=m.padding_side,
                            torch_dtype=m.torch_dtype, normalize=m.normalize, device=ctx.device)
    model.prompts = {"query": recipe.eval_query_prompt(), "document": recipe.instructions.passage}
    return model


def plan_spec(recipe: BmRetrieverRecipe):
    """What ``medadapt plan`` needs (:mod:`medadapt.plan`): the retriever and its two stages (stage I: a
    query and a passage per pair, in-batch negatives; stage II: query, positive and
    ``mining.num_negatives`` hard negatives)."""
    m, s1, s2 = recipe.model, recipe.stage1, recipe.stage2
    stages = [s for s in (s1, s2) if s.enabled]
    lora = None
    if m.lora is not None and any(s.lora for s in stages):
        lora = LoraSpec(m.lora.r, m.lora.alpha, m.lora.dropout,
                        tuple(m.lora.target_modules) if m.lora.target_modules else None)
    seq = m.max_seq_length or 512
    spec = ModelSpec("retriever", m.name, lora=lora, torch_dtype=m.torch_dtype,
                     gradient_checkpointing=m.gradient_checkpointing)
    phases = []
    if s1.enabled:
        phases.append(PhaseSpec("stage I (pre-training)", s1.batch_size, s1.gradient_accumulation_steps,
                                (Usage("retriever", 2, seq),)))
    if s2.enabled:
        negatives = s2.mining.num_negatives if s2.hard_negatives else 0
        phases.append(PhaseSpec("stage II (fine-tuning)", s2.batch_size, s2.gradient_accumulation_steps,
                                (Usage("retriever", 2 + negatives, seq),)))
    notes = [f"stage II mining runs {s2.base_retriever} for inference only before training (not planned)"] \
        if s2.enabled and s2.hard_negatives else []
    if s2.enabled and (s2.synthetic is not None or s2.task_synthetic is not None):
        notes.append("synthetic data is generated before training (its generator's memory is not planned)")
    if len({s.lora for s in stages}) > 1:
        notes.append("one stage trains through LoRA and the other fully: planned as LoRA throughout")
    return PlanSpec(recipe.name, (spec,), tuple(phases), recipe.training.mixed_precision, tuple(notes),
                    data=tuple(synthetic_plan(recipe)))


def synthetic_plan(recipe: BmRetrieverRecipe) -> list[str]:
    """The synthetic-data accounting of a recipe, one line per source, before anything is generated: what
    each source keeps (the target) of at most how many generated (the cap), from what, by which generator
    and filter; the instance level's total when it has several sources (``medadapt plan`` prints these)."""
    s2 = recipe.stage2
    if not s2.enabled:
        return []
    lines = []

    def by(section) -> str:
        return "the fake generator" if section.generator == "fake" else \
            f"{section.model} ({section.generator})"

    if s2.synthetic is not None:
        syn = s2.synthetic
        for source in syn.sources:
            corpus = source.corpus or recipe.data.path
            lines.append(f"synthetic instance level {source.name}: keep {source.passages:,} (query, passage) "
                         f"pairs of at most {syn.cap(source):,} queries generated by {by(syn)} for passages "
                         f"of {corpus} (instruction {source.instruction!r}); kept when the passage is in "
                         f"{s2.base_retriever}'s top {syn.top_k}")
        if len(syn.sources) > 1:
            keep, cap = sum(s.passages for s in syn.sources), sum(syn.cap(s) for s in syn.sources)
            lines.append(f"synthetic instance level, all sources: keep {keep:,} of at most {cap:,} generated")
    if s2.task_synthetic is not None:
        ts = s2.task_synthetic
        check = (f"kept when {s2.base_retriever} scores the positive above the negative" if ts.filter
                 else "no filter")
        keep, cap = ts.tasks * ts.examples_per_task, ts.tasks * ts.cap_per_task
        lines.append(f"synthetic task level {ts.name}: {ts.tasks:,} tasks x {ts.examples_per_task:,} "
                     f"examples = keep {keep:,} of at most {cap:,} generated by {by(ts)} (tasks brainstormed "
                     f"{ts.per_call} per call, Appendix A.1 prompts with sampled attributes; {check})")
    return lines
