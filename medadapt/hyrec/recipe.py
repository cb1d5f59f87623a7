"""The system's ``train`` / ``evaluate`` / ``plan`` for HyReC recipes (``kind: hyrec``, sections in
:mod:`medadapt.hyrec.sections`, docs/hyrec.md). The paper's three stages (Appendix A) run in order in one
training loop, resumable across every boundary: ``pretrain`` (RetroMAE) -> ``prefinetune`` -> the main
fine-tuning (``training``, in self-mining rounds with ``negatives.refresh_every``). Metrics and
``eval.expected`` are ``<mode>/<metric>`` (``hybrid/ndcg@10``).
"""

from __future__ import annotations

import json
import time
import weakref
from collections.abc import Callable
from pathlib import Path

import medadapt.hyrec.train as hyrec_train
from medadapt.cache import backbone_view
from medadapt.data import load_beir
from medadapt.data.jsonl import field, iter_jsonl
from medadapt.errors import ConfigError, DataError
from medadapt.eval.metrics import evaluate_run
from medadapt.hyrec.data import (
    CachedDenseInputs,
    SharedStateCache,
    build_examples,
    filter_pairs,
    load_pairs,
    remine_negatives,
    score_pairs,
    share_miner_encoding,
)
from medadapt.hyrec.evaluate import evaluate_hyrec
from medadapt.hyrec.model import HyReCConfig, HyReCModel
from medadapt.hyrec.sections import (  # noqa: F401 - re-exported: the sections are the Python API's configs
    HyReCDataSection,
    HyReCEvalSection,
    HyReCLossSection,
    HyReCModelSection,
    HyReCRecipe,
    HyReCTrainingSection,
    NegativesSection,
    PrefinetuneSection,
    PretrainSection,
)
from medadapt.io import atomic_write_json
from medadapt.models import load

__all__ = ["HyReCDataSection", "HyReCEvalSection", "HyReCLossSection", "HyReCModelSection", "HyReCRecipe",
           "HyReCTrainingSection", "NegativesSection", "PrefinetuneSection", "PretrainSection", "evaluate",
           "evaluate_modes", "model_config", "train"]


def model_config(spec: HyReCRecipe):
    """The :class:`~medadapt.hyrec.model.HyReCConfig` of a recipe: the ``model`` section's architecture
    fields, ``union`` iff ``loss.union_weight > 0``."""
    import dataclasses

    fields = {f.name for f in dataclasses.fields(HyReCConfig)}
    return HyReCConfig(**spec.model.model_dump(include=fields), union=spec.loss.union_weight > 0)


# the SharedStateCache a model was trained with, for its evaluation (weak keys: it goes with the model)
_STATE_CACHES: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def train(recipe: HyReCRecipe, ctx):
    """Build the model and the examples (hard negatives and caches: the main process first, the others read
    what it wrote), train through ``ctx.train``, return the model; ``ctx.result.details`` gets
    ``train_examples``, ``n_terms`` and ``steps`` (and ``prefinetune``: pairs read / kept, steps; ``pretrain``:
    texts, steps, first and last loss). With a ``pretrain`` / ``prefinetune`` section, its stage runs first in
    the same loop (pretrain, then prefinetune) and the next stage continues from its weights."""
    tr, neg, m, cache = recipe.training, recipe.negatives, recipe.model, ctx.cache
    split = recipe.data.train_split
    t0 = time.perf_counter()
    pre, pt = recipe.prefinetune, recipe.pretrain
    pairs = load_pairs(ctx.resolve(pre.data), pre.split) if pre is not None else None  # fail before any load
    pt_splits = (pt.query_splits if pt.query_splits is not None else [split]) if pt is not None else []
    own = pt is not None and pt.data is None  # pre-training texts from the recipe's own data
    data = load_beir(ctx.resolve(recipe.data.path), sorted({split, *(pt_splits if own else [])}))
    pt_texts = _pretrain_texts(pt, data if own else None, pt_splits, ctx) if pt is not None else None
    train_texts = data.doc_texts() + [data.queries[q] for q in data.qrels[split]] if m.extend_vocab else []
    model = HyReCModel.from_backbone(m.backbone, model_config(recipe), extend_with=train_texts, seed=tr.seed,
                                     num_layers=m.num_layers, scratch=m.init == "scratch")
    model.to(ctx.device)
    ctx.log(f"HyReC: {m.backbone}{' (architecture only, weights from scratch)' if m.init == 'scratch' else ''}, "
            f"{model._n_shared} shared + {len(model.lexicon)} lexicon + "
            f"{m.branch_layers} dense layers ({m.variant}), {model.vocab_size} tokenizer terms")
    state_cache = None
    if tr.state_cache != "off":
        state_cache = SharedStateCache(cache if tr.state_cache == "disk" else None)
    view = backbone_view(model.st) if tr.dense_inputs == "cache" else None
    cached_dense = None

    def dense_inputs(texts, role):  # the frozen dense encoder's pooled inputs (dense_inputs: cache / states)
        if cached_dense is not None:
            return cached_dense(texts, role)
        return state_cache.pooled(model, list(texts), role)

    miner = share_miner_encoding(ctx, data, neg.source, neg.num, neg.miner)  # >1 process: shared corpus encode
    with ctx.accelerator.main_process_first():  # mining and cache fills: the others then read the caches
        examples = build_examples(data, split, negatives=neg.source if neg.num else "none", window=neg.window,
                                  num_negatives=max(neg.num, 1), max_queries=recipe.data.max_train_examples,
                                  miner_model=miner, language=m.language, cache=cache,
                                  seed=tr.seed, show_progress=ctx.show_progress)
        docs = sorted({t for e in examples for t in [e.positive, *e.negatives[: neg.num]]})
        if state_cache is not None:
            lex, pooled = not tr.train_lexicon_encoder, tr.dense_inputs == "states"
            state_cache.warm(model, [e.query for e in examples], "query", lexicon=lex, pooled=pooled,
                             show_progress=ctx.show_progress)
            state_cache.warm(model, docs, "document", lexicon=lex, pooled=pooled, show_progress=ctx.show_progress)
        if view is not None:  # read once here; training steps look their rows up in memory
            cached_dense = CachedDenseInputs(cache, view, [e.query for e in examples], docs).fill(ctx.show_progress)
        pre_examples = _prefinetune_examples(pre, pairs, ctx) if pre is not None else None
    del miner  # mining is done: a miner loaded here leaves the device before training
    ctx.result.encode_seconds += time.perf_counter() - t0
    ctx.result.details.update(train_examples=len(examples), n_terms=model.n_terms)
    ctx.log(f"training on {len(examples)} examples")
    dense_fn = None if tr.dense_inputs == "model" else dense_inputs
    world = ctx.accelerator.num_processes

    def batch(section, scope: str = tr.batch_size_scope):  # per_device: global batch = batch_size x processes
        if scope != "per_device":
            return section
        ctx.log(f"batch_size {section.batch_size} per device x {world} process(es): global batch "
                f"{section.batch_size * world}")
        return section.model_copy(update={"batch_size": section.batch_size * world})

    stages = []
    if pre_examples is not None:  # in-batch negatives only; its own optimiser and schedule
        ctx.log(f"preliminary fine-tuning on {len(pre_examples)} of {len(pairs)} pairs")
        stages.append(hyrec_train.hyrec_stage(model, pre_examples, batch(pre.training(tr)), recipe.loss,
                                              negatives=0, state_cache=state_cache, dense_inputs=dense_fn,
                                              name="prefinetune"))
    main = hyrec_train.hyrec_stage(model, examples, batch(tr), recipe.loss, negatives=neg.num,
                                   state_cache=state_cache, dense_inputs=dense_fn)
    if neg.refresh_every is None:
        stages.append(main)
    else:  # ANCE-style self-mining: the main stage in rounds, each after the first re-mines with the model
        every = neg.refresh_every
        if neg.refresh_unit == "epochs":
            every *= -(-len(examples) // main.optim.effective_batch_size)
        rounds = hyrec_train.refreshed_stages(main, every, _self_mining(recipe, ctx, model, data, examples),
                                              tr.seed)
        ctx.log(f"self-mining: {len(rounds) - 1} refresh(es) of the negatives, every {every} steps")
        ctx.result.details["self_mining"] = {"every_steps": every, "rounds": len(rounds), "changed": {}}
        stages += rounds
    run_model = model
    if pt_texts is not None:  # RetroMAE first: the loop trains the model plus the decoder and MLM head
        ctx.log(f"RetroMAE pre-training on {len(pt_texts)} texts")
        run_model, pt_stage = hyrec_train.pretrain_stage(model, pt_texts, batch(pt, pt.batch_size_scope), tr,
                                                           name="pretrain")
        stages.insert(0, pt_stage)
    res = ctx.train(run_model, stages)
    ctx.result.details["steps"] = res.steps
    if pre_examples is not None:
        ctx.result.details["prefinetune"]["steps"] = res.stage_steps.get("prefinetune", 0)
    if pt_texts is not None:
        rows = [r["loss"] for r in res.loss_history if r.get("stage") == "pretrain"]
        ctx.result.details["pretrain"] = {"texts": len(pt_texts), "steps": res.stage_steps.get("pretrain", 0),
                                          "first_loss": rows[0] if rows else None,
                                          "last_loss": rows[-1] if rows else None}
        del run_model, pt_stage  # the decoder and MLM head are not part of the model
    model.eval()
    if state_cache is not None:
        _STATE_CACHES[model] = state_cache
    return model


def _self_mining(recipe: HyReCRecipe, ctx, model, data, examples: list) -> Callable[[int], None]:
    """``refresh(r)``: round ``r``'s negatives for every example, mined by the model being trained
    (:func:`~medadapt.hyrec.data.remine_negatives`; the main process mines, the others read) and kept in
    ``<checkpoints>/self-mining/round-<r>.json`` with the run's fingerprint, so a resume inside round ``r``
    reuses them instead of mining with the weights it resumed from. The fraction of examples whose
    negatives changed goes to ``details["self_mining"]["changed"]``."""
    neg = recipe.negatives

    def refresh(r: int) -> None:
        path = ctx.checkpoint_dir / "self-mining" / f"round-{r}.json"
        with ctx.accelerator.main_process_first():
            saved = json.loads(path.read_text(encoding="utf-8")) if path.is_file() else {}
            negatives = saved.get("negatives") if saved.get("fingerprint") == ctx.fingerprint else None
            if negatives is None or len(negatives) != len(examples):
                negatives = remine_negatives(examples, data, recipe.data.train_split, model, window=neg.window,
                                             num_negatives=neg.num, seed=recipe.training.seed + r,
                                             show_progress=ctx.show_progress)
                if ctx.is_main:
                    atomic_write_json(path, {"fingerprint": ctx.fingerprint, "round": r, "negatives": negatives})
        changed = sum(e.negatives[: neg.num] != n[: neg.num] for e, n in zip(examples, negatives))
        for e, n in zip(examples, negatives):
            e.negatives = n
        ctx.result.details["self_mining"]["changed"][str(r)] = changed / len(examples)
        ctx.log(f"self-mining round {r}: the model's own negatives ({changed} of {len(examples)} examples changed)")

    return refresh


def _prefinetune_examples(pre: PrefinetuneSection, pairs: list[tuple[str, str]], ctx) -> list:
    """The preliminary fine-tuning's examples: ``pairs`` scored by ``pre.scorer`` (through the run's
    EmbeddingCache) and kept at cosine ``>= pre.min_score``; records the counts in
    ``ctx.result.details["prefinetune"]``."""
    scores = None
    if pre.scorer is not None:
        scorer = load(pre.scorer, device=ctx.device)
        scores = score_pairs(scorer, pairs, cache=ctx.cache, batch_size=pre.score_batch_size,
                             show_progress=ctx.show_progress)
        del scorer
    kept = filter_pairs(pairs, scores, pre.min_score, max_pairs=pre.max_pairs, seed=ctx.recipe.training.seed)
    n_pass = len(pairs) if scores is None else sum(s >= pre.min_score for s in scores)
    ctx.result.details["prefinetune"] = {"pairs": len(pairs), "passed_filter": n_pass, "train_examples": len(kept),
                                         "scorer": pre.scorer, "min_score": pre.min_score}
    return kept


def _pretrain_texts(pt: PretrainSection, data, splits: list[str], ctx) -> list[str]:
    """The pre-training texts (see :class:`PretrainSection`): distinct, shuffled with the run's seed, capped
    at ``max_texts``. ``data``: the recipe's loaded BEIR data when ``pt.data`` is unset."""
    import random

    texts: list[str] = []
    if data is None:
        path = Path(ctx.resolve(pt.data))
        if path.is_dir():
            data = load_beir(path, splits or None)
        elif path.is_file():
            if pt.query_splits:
                raise ConfigError(f"pretrain.query_splits needs a BEIR folder as pretrain.data, not a file "
                                  f"({path})")
            texts = [field(obj, "text", str, path, n) for n, obj in iter_jsonl(path, "pre-training texts")]
        else:
            raise DataError(f"pre-training texts not found: {path} (a BEIR folder or a JSONL file of "
                            "{\"text\": ...} lines)")
    if data is not None:
        for s in splits:
            texts += list(data.split_queries(s).values())
        if pt.include_corpus:
            texts += data.doc_texts()
    texts = [t for t in dict.fromkeys(texts) if t.strip()]
    if not texts:
        raise DataError(f"pretrain: no texts ({pt.data or 'data.path'}: no corpus document or query)")
    random.Random(ctx.recipe.training.seed).shuffle(texts)
    return texts[: pt.max_texts] if pt.max_texts else texts


def evaluate(recipe: HyReCRecipe, model, ctx) -> dict[str, float]:
    """``<mode>/<metric>`` for every mode of ``eval.modes`` on ``eval.data`` (default ``data.path``), split
    ``eval.split``; the per-mode dicts also go to ``ctx.result.details["mode_metrics"]``."""
    ev = recipe.eval
    data = load_beir(ctx.resolve(ev.data or recipe.data.path), [ev.split])
    state_cache = _STATE_CACHES.get(model)
    cached_lexicon = state_cache is not None and not recipe.training.train_lexicon_encoder
    modes = evaluate_modes(model, data, ev, cache=ctx.cache, state_cache=state_cache,
                           show_progress=ctx.show_progress, cached_lexicon=cached_lexicon)
    ctx.result.details["mode_metrics"] = modes
    return {f"{m}/{k}": v for m, vals in modes.items() for k, v in vals.items()}


def evaluate_modes(model, data, ev: HyReCEvalSection, *, cache=None, state_cache=None, show_progress=True,
                   cached_lexicon: bool = False) -> dict[str, dict[str, float]]:
    """Every mode of ``ev.modes`` from one encoding pass (hybrid computes the lexical and dense runs too)."""
    modes = ev.modes
    mode = "hybrid" if "hybrid" in modes or {"lexical", "dense"} <= set(modes) else modes[0]
    res, runs = evaluate_hyrec(model, data, ev.split, mode, ev.metrics, cache=cache, state_cache=state_cache,
                               dense_source=ev.dense_source, fusion=ev.fusion, batch_size=ev.batch_size,
                               show_progress=show_progress, return_runs=True, cached_lexicon=cached_lexicon)
    out = {}
    for m in modes:
        vals = evaluate_run(data.qrels[ev.split], runs[m], ev.metrics)
        if m != "dense" and "q_terms" in res:
            vals.update({"q_terms": res["q_terms"], "d_terms": res["d_terms"]})
        out[m] = vals
    return out
