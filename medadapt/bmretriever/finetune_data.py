"""Stage II data (BMRetriever §3.3): (query, positive, hard negative) rows from labelled BEIR splits (the
negative one random passage of the base retriever's top 100, ``bmretriever`` mining preset), FlagEmbedding
JSONL groups, and synthetic data (:mod:`medadapt.bmretriever.synthetic`), consistency-filtered and mined
the same way.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence

from medadapt.bmretriever.instructions import query_prompt
from medadapt.bmretriever.sections import BmRetrieverRecipe
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
from medadapt.curation import DenseSearcher, mine_hard_negatives
from medadapt.curation.mining_config import MiningConfig
from medadapt.data import load_beir
from medadapt.data.beir import BeirDataset
from medadapt.data.training import TrainingGroup, load_training_groups
from medadapt.errors import ConfigError, DataError, warn
from medadapt.models import load

__all__ = ["beir_groups", "chat_client", "groups_to_dataset", "stage2_datasets", "subsample_groups"]


def subsample_groups(groups: Sequence[TrainingGroup], max_groups: int | None, seed: int) -> list[TrainingGroup]:
    """A seeded random subset of ``max_groups`` groups, kept in their original order."""
    groups = list(groups)
    if max_groups is None or len(groups) <= max_groups:
        return groups
    keep = sorted(random.Random(seed).sample(range(len(groups)), max_groups))
    return [groups[i] for i in keep]


def beir_groups(data, split: str, searcher, mining: MiningConfig | None = None, *,
                max_queries: int | None = None, seed: int = 42, batch_size: int = 256,
                show_progress: bool = True) -> list[TrainingGroup]:
    """Groups for the judged queries of ``split`` with hard negatives from ``searcher``; ``max_queries``
    subsamples the queries (seeded) before mining."""
    mining = mining or MiningConfig.preset("bmretriever", seed=seed)
    if split not in data.qrels:
        raise DataError(f"split {split!r} was not loaded (loaded: {', '.join(data.qrels) or 'none'})")
    qrels = data.qrels[split]
    if max_queries is not None and len(qrels) > max_queries:
        keep = set(random.Random(seed).sample(sorted(qrels), max_queries))
        qrels = {q: r for q, r in qrels.items() if q in keep}
        data = BeirDataset(corpus=data.corpus, queries=data.queries, qrels={split: qrels}, root=data.root)
    return mine_hard_negatives(data, split, searcher, mining, batch_size=batch_size,
                               show_progress=show_progress)


def groups_to_dataset(groups: Sequence[TrainingGroup], *, hard_negatives: bool = True,
                      query_template: str | None = None):
    """A ``Dataset`` with ``anchor`` / ``positive`` / ``negative`` (the first hard negative; groups without
    one dropped when any has one, eq. 3) columns, one row per positive. With ``query_template`` each
    group's own ``prompt`` (its task instruction) is applied to its query here."""
    from datasets import Dataset

    rows: dict[str, list[str]] = {"anchor": [], "positive": [], "negative": []}
    use_neg = hard_negatives and any(g.neg for g in groups)
    for g in groups:
        if use_neg and not g.neg:
            continue
        for p in g.pos:
            prefix = query_prompt(g.prompt or "", query_template) if query_template else ""
            rows["anchor"].append(prefix + g.query)
            rows["positive"].append(p)
            if use_neg:
                rows["negative"].append(g.neg[0])
    if not use_neg:
        del rows["negative"]
    if not rows["anchor"]:
        raise DataError("stage II has no training rows (no groups, or no group with a hard negative)")
    return Dataset.from_dict(rows)


def _path(recipe: BmRetrieverRecipe, value: str) -> str:
    return str(recipe.resolve(value))


def stage2_datasets(recipe: BmRetrieverRecipe, *, cache=None, device: str | None = None,
                    show_progress: bool = True, log: Callable[[str], None] = print, base=None,
                    report: dict | None = None):
    """``({task: Dataset}, {task: {column: prompt}})`` for stage II. ``base``: the mining retriever if already
    loaded; ``report``: filled with each synthetic source's generated / kept counts, by source name."""
    s2, ins, tr = recipe.stage2, recipe.instructions, recipe.training
    mining = s2.mining
    if "seed" not in mining.model_fields_set:
        mining = mining.model_copy(update={"seed": tr.seed})
    out, prompts, searchers = {}, {}, {}

    def base_model():
        nonlocal base
        if base is None:
            base = load(s2.base_retriever, device=device)
        return base

    def searcher_for(path: str, data):
        if path not in searchers:
            searchers[path] = DenseSearcher(base_model(), data.doc_ids, data.doc_texts(), cache=cache,
                                            batch_size=tr.encode_batch_size, show_progress=show_progress)
        return searchers[path]

    def add(name: str, groups, instruction: str) -> None:
        out[name] = groups_to_dataset(groups, hard_negatives=s2.hard_negatives)
        prompts[name] = {"anchor": query_prompt(instruction, ins.query_template), "positive": ins.passage,
                         "negative": ins.passage}

    for task in s2.tasks:
        instruction = recipe.task_instruction(task)
        if task.kind == "beir":
            path = _path(recipe, task.path or recipe.data.path)
            data = load_beir(path, [task.split])
            groups = beir_groups(data, task.split, searcher_for(path, data), mining,
                                 max_queries=task.max_queries, seed=tr.seed, show_progress=show_progress)
        else:
            groups = subsample_groups(load_training_groups(_path(recipe, task.path)), task.max_queries,
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
            path = _path(recipe, source.corpus or recipe.data.path)
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
            data = load_beir(_path(recipe, recipe.data.path), [])
            task_gen = FakeTaskGenerator([(data.corpus[d]["title"] or d, data.corpus[d]["text"])
                                          for d in data.doc_ids], seed=tr.seed)
        else:
            task_gen = LLMTaskGenerator(chat_client(ts, device), per_call=ts.per_call,
                                        max_new_tokens=ts.max_new_tokens or 512)

        def positive_above_negative(groups):
            return filter_task_groups(groups, base_model(), batch_size=tr.encode_batch_size)

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
    """The :class:`~medadapt.bmretriever.synthetic.ChatClient` a synthetic-data section names."""
    if section.generator == "openai":
        return OpenAICompatibleClient(section.model, base_url=section.endpoint,
                                      api_key_env=section.api_key_env, temperature=section.temperature)
    return TransformersChatClient(section.model, device=device, temperature=section.temperature)
