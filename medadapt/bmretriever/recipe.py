"""Load and run BMRetriever recipes (``kind: bmretriever``; schema in :mod:`medadapt.bmretriever.schema`).

:func:`run_bmretriever_recipe` does, in order:

1. build the encoder (:func:`~medadapt.bmretriever.model.build_retriever`: decoder tower with EOS pooling, or
   an ST model; dot product; optional bf16, gradient checkpointing);
2. **stage I** (§3.2): title -> text / cropped pairs streamed from the corpora, a fresh LoRA adapter,
   InfoNCE with in-batch negatives; the adapter is merged and the stage-I model saved to
   ``OUTPUT/checkpoints/stage1-model`` (a re-run skips a finished stage I);
3. **stage II** (§3.3): per task (query, positive, hard negative) rows, negatives = 1 random of the base
   retriever's top 100; optional consistency-filtered synthetic pairs; a fresh LoRA adapter; InfoNCE with
   in-batch + hard negatives; merge;
4. save (atomic; ``recipe.yaml``, ``train_log.json``), with prompts ``query`` (the evaluation instruction)
   and ``document`` (the passage instruction), then evaluate on ``eval.split`` (``metrics.json``).

Runs unchanged under ``accelerate launch`` (DDP; DeepSpeed / FSDP configs in ``recipes/accelerate/``): data
preparation that fills the embedding cache runs on the main process first, saving and evaluation on the
main process only, and the trainer splits each global batch over the processes.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any


from medadapt.bmretriever.schema import BmRetrieverRecipe, LoopSection
from medadapt.errors import ConfigError
from medadapt.training.runner import RunResult

__all__ = ["BmRetrieverRunResult", "load_bmretriever_recipe", "run_bmretriever_recipe"]


def load_bmretriever_recipe(path_or_data: str | Path | dict, overrides: list[str] | None = None,
                            ) -> BmRetrieverRecipe:
    """Read a recipe file (or dict), apply ``section.field=value`` overrides, validate."""
    from medadapt.recipes.loader import load_kind_recipe

    recipe = load_kind_recipe(path_or_data, overrides, BmRetrieverRecipe, "bmretriever", "BMRetriever")
    recipe._source = None if isinstance(path_or_data, dict) else str(path_or_data)
    return recipe


@dataclass
class BmRetrieverRunResult(RunResult):
    """:class:`~medadapt.training.runner.RunResult` plus per-stage summaries (``stages``: name -> steps,
    seconds, rows, loss history)."""

    stages: dict[str, dict[str, Any]] = field(default_factory=dict)


def _stage_config(loop: LoopSection, recipe: BmRetrieverRecipe, use_cpu: bool):
    from medadapt.bmretriever.trainer import StageConfig

    tr = recipe.training
    return StageConfig(
        epochs=loop.epochs, batch_size=loop.batch_size, lr=loop.lr, weight_decay=loop.weight_decay,
        warmup_steps=loop.warmup_steps, scheduler=loop.scheduler, max_grad_norm=loop.max_grad_norm,
        max_steps=loop.max_steps, temperature=loop.temperature, seed=tr.seed,
        mixed_precision=tr.mixed_precision, checkpoint_every_steps=tr.checkpoint_every_steps,
        logging_steps=tr.logging_steps, no_duplicates=loop.no_duplicates, use_cpu=use_cpu)


def _resolve(value: str, recipe_path) -> str:
    from medadapt.recipes.loader import resolve_path

    return str(resolve_path(value, recipe_path))


def stage1_dataset(recipe: BmRetrieverRecipe, recipe_path=None):
    """The stage I ``Dataset`` (``anchor`` / ``positive``) the recipe describes."""
    from medadapt.bmretriever.pretrain_data import CorpusSource, CropConfig, pretrain_dataset

    s1 = recipe.stage1
    sections = s1.sources or [None]
    sources = []
    for sec in sections:
        if sec is None:
            sources.append(CorpusSource(_resolve(recipe.data.path, recipe_path)))
        else:
            sources.append(CorpusSource(_resolve(sec.path, recipe_path), sec.mode, sec.title_field,
                                        sec.text_field, sec.id_field, sec.max_docs))
    return pretrain_dataset(sources, CropConfig(s1.min_words, s1.max_words), recipe.training.seed, s1.max_pairs)


def stage2_datasets(recipe: BmRetrieverRecipe, recipe_path=None, *, cache=None, device: str | None = None,
                    show_progress: bool = True, log: Callable[[str], None] = print):
    """``(datasets, prompts)`` for stage II: ``{task: Dataset}`` and ST prompts ``{task: {column: prompt}}``."""
    from medadapt.bmretriever.finetune_data import beir_groups, groups_to_dataset, subsample_groups
    from medadapt.bmretriever.instructions import query_prompt
    from medadapt.curation import DenseSearcher
    from medadapt.data import load_beir
    from medadapt.data.training import load_training_groups
    from medadapt.models import load

    s2, ins, tr = recipe.stage2, recipe.instructions, recipe.training
    mining = s2.mining.model_copy(update={"seed": tr.seed}) if "seed" not in s2.mining.model_fields_set \
        else s2.mining
    passage = ins.passage
    out, prompts = {}, {}
    searchers: dict[str, Any] = {}
    base = None

    def searcher_for(path: str, data):
        nonlocal base
        if path not in searchers:
            if base is None:
                base = load(s2.base_retriever, device=device)
            searchers[path] = DenseSearcher(base, data.doc_ids, data.doc_texts(), cache=cache,
                                            batch_size=tr.encode_batch_size, show_progress=show_progress)
        return searchers[path]

    for task in s2.tasks:
        instruction = recipe.task_instruction(task)
        if task.kind == "beir":
            path = _resolve(task.path or recipe.data.path, recipe_path)
            data = load_beir(path, [task.split])
            groups = beir_groups(data, task.split, searcher_for(path, data), mining,
                                 max_queries=task.max_queries, seed=tr.seed, show_progress=show_progress)
        else:
            groups = subsample_groups(load_training_groups(_resolve(task.path, recipe_path)), task.max_queries,
                                      tr.seed)
        out[task.name] = groups_to_dataset(groups, hard_negatives=s2.hard_negatives)
        prompts[task.name] = {"anchor": query_prompt(instruction, ins.query_template), "positive": passage,
                              "negative": passage}
        log(f"stage II task {task.name}: {len(out[task.name])} rows from {len(groups)} groups")
    if s2.synthetic is not None:
        import random

        from medadapt.bmretriever.synthetic import (
            FakeQueryGenerator,
            TransformersQueryGenerator,
            synthesize_query_groups,
        )
        from medadapt.data.training import TrainingGroup

        syn = s2.synthetic
        path = _resolve(recipe.data.path, recipe_path)
        data = load_beir(path, [])
        searcher = searcher_for(path, data)
        instruction = ins.synthetic.get(syn.instruction, syn.instruction)
        ids = data.doc_ids
        picked = sorted(random.Random(tr.seed).sample(range(len(ids)), min(syn.passages, len(ids))))
        passages = [data.doc_text(ids[i]) for i in picked]
        gen = (FakeQueryGenerator(noise=syn.noise, seed=tr.seed) if syn.generator == "fake"
               else TransformersQueryGenerator(syn.model, device=device))
        text_to_id = {data.doc_text(d): d for d in ids}
        kept = synthesize_query_groups(passages, gen, instruction, searcher, text_to_id, top_k=syn.top_k,
                                       show_progress=show_progress)
        log(f"synthetic: kept {len(kept)} of {len(passages)} generated pairs (consistency top-{syn.top_k})")
        if kept:
            # mine negatives for the kept pairs like labelled data: a temporary BEIR view of them
            from medadapt.data.beir import BeirDataset

            queries = {f"syn{i}": g.query for i, g in enumerate(kept)}
            qrels = {f"syn{i}": {text_to_id[g.pos[0]]: 1} for i, g in enumerate(kept)}
            view = BeirDataset(corpus=data.corpus, queries=queries, qrels={"synthetic": qrels}, root=data.root)
            groups = beir_groups(view, "synthetic", searcher, mining, seed=tr.seed, show_progress=show_progress)
            groups = [TrainingGroup(query=g.query, pos=g.pos, neg=g.neg, prompt=instruction) for g in groups]
            out[syn.name] = groups_to_dataset(groups, hard_negatives=s2.hard_negatives)
            prompts[syn.name] = {"anchor": query_prompt(instruction, ins.query_template), "positive": passage,
                                 "negative": passage}
    if not out:
        raise ConfigError("stage II has no training data (no task rows and no kept synthetic pairs)")
    return out, prompts


def _summary(res, rows: int) -> dict[str, Any]:
    hist = res.loss_history
    return {"rows": rows, "steps": res.steps, "seconds": round(res.seconds, 2),
            "first_loss": hist[0]["loss"] if hist else None, "last_loss": hist[-1]["loss"] if hist else None,
            "loss_history": hist}


def run_bmretriever_recipe(
    spec: BmRetrieverRecipe | str | Path,
    output_dir: str | Path,
    *,
    cache=None,
    show_progress: bool = True,
    evaluate: bool = True,
    log: Callable[[str], None] = print,
    recipe_path: str | Path | None = None,
    overrides: list[str] | None = None,
    **_: Any,
) -> BmRetrieverRunResult:
    """Run a BMRetriever recipe into ``output_dir`` (see module docstring); returns a
    :class:`BmRetrieverRunResult`."""
    import torch
    from accelerate import PartialState
    from sentence_transformers import SentenceTransformer

    from medadapt.bmretriever.instructions import query_prompt
    from medadapt.bmretriever.model import (
        attach_lora,
        build_retriever,
        enable_gradient_checkpointing,
        merge_lora,
    )
    from medadapt.bmretriever.trainer import train_stage
    from medadapt.cache import EmbeddingCache
    from medadapt.training.runner import _save_model_atomically

    if isinstance(spec, BmRetrieverRecipe):
        if overrides:
            raise ConfigError("overrides apply to a recipe file; pass a path or edit the recipe")
        recipe = spec
        recipe_path = recipe_path or getattr(spec, "_source", None)
    else:
        recipe_path = Path(spec)
        recipe = load_bmretriever_recipe(recipe_path, overrides)
    output_dir = Path(output_dir)
    cache = cache if cache is not None else EmbeddingCache()
    tr, ins, m = recipe.training, recipe.instructions, recipe.model
    use_cpu = tr.device == "cpu" or not torch.cuda.is_available()
    state = PartialState(cpu=use_cpu)
    device = str(state.device)
    torch.manual_seed(tr.seed)
    result = BmRetrieverRunResult(output_dir=output_dir)
    t_start = time.perf_counter()

    model = build_retriever(m.name, m.kind, max_seq_length=m.max_seq_length, padding_side=m.padding_side,
                            torch_dtype=m.torch_dtype, normalize=m.normalize, device=device)

    def run_stage(name: str, loop: LoopSection, data, prompts) -> None:
        lora = m.lora if loop.lora else None
        if lora is not None:
            attach_lora(model, lora.r, lora.alpha, lora.dropout, lora.target_modules,
                        gradient_checkpointing=m.gradient_checkpointing)
        elif m.gradient_checkpointing:
            enable_gradient_checkpointing(model)
        rows = sum(len(d) for d in data.values()) if isinstance(data, dict) else len(data)
        how = f"LoRA r={lora.r}" if lora is not None else "full fine-tuning"
        log(f"{name}: {rows} rows, global batch {loop.batch_size}, {how}, tau={loop.temperature}")
        if isinstance(data, dict):
            from datasets import DatasetDict

            data = DatasetDict(data)
        res = train_stage(model, data, prompts, _stage_config(loop, recipe, use_cpu),
                          output_dir / "checkpoints" / name, show_progress=show_progress)
        merge_lora(model)
        result.stages[name] = _summary(res, rows)
        offset = result.loss_history[-1]["step"] if result.loss_history else 0.0
        result.loss_history += [{"step": r["step"] + offset, "loss": r["loss"]} for r in res.loss_history]

    # ---- stage I: unsupervised contrastive pre-training
    stage1_dir = output_dir / "checkpoints" / "stage1-model"
    if recipe.stage1.enabled:
        if (stage1_dir / "modules.json").is_file():
            log(f"stage I: finished earlier, loading {stage1_dir}")
            model = SentenceTransformer(str(stage1_dir), device=device, trust_remote_code=True)
            result.stages["stage1"] = {"resumed": True}
        else:
            with state.main_process_first():
                data1 = stage1_dataset(recipe, recipe_path)
            run_stage("stage1", recipe.stage1, data1, {"anchor": ins.pretrain_query, "positive": ins.passage})
            if state.is_main_process:
                _save_model_atomically(model, stage1_dir)
            state.wait_for_everyone()

    # ---- stage II: instruction fine-tuning with hard negatives
    if recipe.stage2.enabled:
        t0 = time.perf_counter()
        with state.main_process_first():  # the main process fills the embedding cache, the others read it
            data2, prompts2 = stage2_datasets(recipe, recipe_path, cache=cache, device=device,
                                              show_progress=show_progress and state.is_main_process, log=log)
        result.encode_seconds += time.perf_counter() - t0
        run_stage("stage2", recipe.stage2, data2, prompts2)

    # ---- save with the inference prompts
    eval_instruction = recipe.eval.instruction
    if eval_instruction is None and recipe.stage2.tasks:
        eval_instruction = recipe.task_instruction(recipe.stage2.tasks[0])
    if eval_instruction:  # a Table 10 / Table 9 name, or the instruction itself
        eval_instruction = ins.eval.get(eval_instruction, ins.finetune.get(eval_instruction, eval_instruction))
    query = query_prompt(eval_instruction, ins.query_template) if eval_instruction else ins.pretrain_query
    model.prompts = {"query": query, "document": ins.passage}
    result.train_seconds = time.perf_counter() - t_start - result.encode_seconds
    if state.is_main_process:
        _save_model_atomically(model, output_dir)
        result.write_run_files(output_dir, recipe, num_processes=state.num_processes, stages=result.stages)
    state.wait_for_everyone()
    if evaluate and state.is_main_process:
        from medadapt.data import load_beir
        from medadapt.eval import evaluate_retrieval

        ev = recipe.eval
        data = load_beir(_resolve(ev.data or recipe.data.path, recipe_path), [ev.split])
        result.record_metrics(evaluate_retrieval(model, data, ev.split, ev.metrics, cache=cache,
                                                 batch_size=tr.encode_batch_size, show_progress=show_progress),
                              ev, output_dir)
    return result
