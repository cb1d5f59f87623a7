"""HyReC recipes: typed YAML schema (``kind: hyrec``) and :func:`run_hyrec_recipe`.

::

    kind: hyrec
    name: hyrec-small
    data:      {path: ../shared/data/zh-med-qa, train_split: train}
    model:     {backbone: BAAI/bge-small-zh-v1.5, branch_layers: 1, variant: full, pooling: cls, language: zh}
    negatives: {source: dense, window: [20, 100], num: 3}
    loss:      {temperature: 0.05, lexical_weight: 1, dense_weight: 1, union_weight: 1}
    training:  {epochs: 5, batch_size: 64, lr: 5.0e-5}
    eval:      {split: test, modes: [lexical, dense, hybrid], metrics: [ndcg@10]}

Every section forbids unknown keys. Overrides use ``section.field=value`` (``medadapt train --set``).
``loss.union_weight: 0`` trains without the semantic union (no union loss, no words in the training-time
lexical score) and turns bagging off (the paper's "w/o SU").
Evaluation metrics are reported as ``<mode>/<metric>`` (``hybrid/ndcg@10``), and so are ``eval.expected``.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from pydantic import Field, field_validator

from medadapt.errors import ConfigError
from medadapt.recipes.schema import EvalSection, Section
from medadapt.training.runner import RunResult

__all__ = ["HyReCRecipe", "HyReCRunResult", "load_hyrec_recipe", "run_hyrec_recipe", "HYREC_SCHEMA_VERSION"]

HYREC_SCHEMA_VERSION = 1


class HyReCDataSection(Section):
    kind: Literal["beir"] = "beir"
    path: str = Field(..., description="BEIR folder or builtin dataset name")
    train_split: str = "train"
    max_train_examples: int | None = Field(None, ge=1, description="random subset of (query, positive) pairs")


class HyReCModelSection(Section):
    """Backbone and GLAE split (small = 1+1+1 layers, base = 5+7+7 in the paper)."""

    backbone: str
    branch_layers: int = Field(1, ge=1, description="N: layers of the lexicon and of the dense encoder")
    variant: Literal["full", "frozen"] = "full"
    pooling: Literal["cls", "mean"] = "cls"
    language: Literal["zh", "en"] = "zh"
    extend_vocab: bool = Field(False, description="add the CJK characters of corpus + training queries the "
                               "tokenizer maps to [UNK] as new tokens")
    query_max_length: int = Field(64, ge=4)
    passage_max_length: int = Field(256, ge=4)
    dense_max_length: int | None = Field(None, ge=4)
    n_word_buckets: int = Field(2**20, ge=1)
    keep_subterms: bool = True
    min_union: float = Field(0.0, ge=0, le=1)
    union_source: Literal["learned", "labels"] = "learned"  # bag words by the union head or by jieba + regex
    union_context: int = Field(0, ge=0, description="0: linear union projector (eq. 4); k > 0: MLP over a "
                               "window of 2k+1 lexicon states (not in the paper; for frozen lexicon encoders)")
    dense_weight: float = Field(1.0, ge=0)
    num_layers: int | None = Field(None, ge=1, description="keep only the backbone's first layers (CPU)")
    lexicon_layers: int | None = Field(None, ge=1,
                                       description="lexicon encoder depth (default branch_layers)")
    term_bias: bool = Field(False,
                            description="learned per-term bias in the weight projector (not in the paper)")
    device: str | None = None


class NegativesSection(Section):
    """Hard negatives from ANN ranks ``window`` (Appendix B: 20-100) of a first-stage retriever."""

    source: Literal["dense", "bm25", "none"] = "dense"
    miner: str = Field("minilm", description="embedder for source: dense")
    window: tuple[int, int] = (20, 100)
    num: int = Field(3, ge=0)


class HyReCLossSection(Section):
    temperature: float = Field(0.05, gt=0)
    lexical_weight: float = Field(1.0, ge=0)
    dense_weight: float = Field(1.0, ge=0)
    union_weight: float = Field(1.0, ge=0)


class HyReCTrainingSection(Section):
    epochs: int = Field(1, ge=1)
    max_steps: int | None = Field(None, ge=1)
    batch_size: int = Field(32, ge=2)
    lr: float = Field(5e-5, gt=0)
    head_lr: float | None = Field(None, gt=0, description="projectors' learning rate (default: lr)")
    weight_decay: float = Field(0.0, ge=0)
    warmup_ratio: float = Field(0.05, ge=0, lt=1)
    max_grad_norm: float | None = Field(1.0, gt=0)
    seed: int = 42
    mixed_precision: Literal["no", "fp16", "bf16"] = "no"
    train_dense_encoder: bool = True
    train_lexicon_encoder: bool = Field(True, description="false (frozen variant + state cache): only the "
                                        "projectors train, on cached lexicon-encoder states")
    state_cache: Literal["off", "memory", "disk"] = Field(
        "off", description="frozen variant: cache the sharing backbone's token states")
    dense_inputs: Literal["model", "cache", "states"] = Field(
        "model", description="frozen dense encoder only: pooled dense inputs from the EmbeddingCache (cache) "
        "or computed once from the shared-state cache (states)")
    lexical_words: Literal["none", "labels", "predicted"] = Field(
        "predicted", description="words scored with the tokens in the training-time lexical score (eq. 10): "
        "the union head's arg-max (as bagged at inference), the labelling tool's, or none (ignored when "
        "loss.union_weight is 0)")
    checkpoint_every_steps: int | None = Field(None, ge=1)
    log_every: int = Field(10, ge=1)


class HyReCEvalSection(EvalSection):
    modes: list[Literal["lexical", "dense", "hybrid"]] = Field(
        default_factory=lambda: ["lexical", "dense", "hybrid"])
    dense_source: Literal["model", "cache", "states"] = "model"
    fusion: Literal["nm", "minmax"] = "nm"
    batch_size: int = Field(32, ge=1)

    @field_validator("modes")
    @classmethod
    def _nonempty(cls, v):
        if not v:
            raise ValueError("modes must name at least one of lexical, dense, hybrid")
        return list(dict.fromkeys(v))


class HyReCRecipe(Section):
    kind: Literal["hyrec"] = "hyrec"
    name: str
    schema_version: Literal[1] = HYREC_SCHEMA_VERSION
    description: str = ""
    data: HyReCDataSection
    model: HyReCModelSection
    negatives: NegativesSection = Field(default_factory=NegativesSection)
    loss: HyReCLossSection = Field(default_factory=HyReCLossSection)
    training: HyReCTrainingSection = Field(default_factory=HyReCTrainingSection)
    eval: HyReCEvalSection = Field(default_factory=HyReCEvalSection)


def load_hyrec_recipe(path_or_data: str | Path | dict, overrides: list[str] | None = None) -> HyReCRecipe:
    """Read (a file or a dict), apply ``section.field=value`` overrides, validate."""
    from medadapt.recipes.loader import load_kind_recipe

    return load_kind_recipe(path_or_data, overrides, HyReCRecipe, "hyrec", "HyReC")


@dataclass
class HyReCRunResult(RunResult):
    """:class:`~medadapt.training.runner.RunResult` plus ``train_examples`` and the model's ``n_terms``."""

    train_examples: int = 0
    n_terms: int = 0
    mode_metrics: dict[str, dict[str, float]] = field(default_factory=dict)


def model_config(spec: HyReCRecipe):
    from medadapt.hyrec.model import HyReCConfig

    m = spec.model
    return HyReCConfig(branch_layers=m.branch_layers, variant=m.variant, pooling=m.pooling,
                       union=spec.loss.union_weight > 0, n_word_buckets=m.n_word_buckets,
                       keep_subterms=m.keep_subterms, min_union=m.min_union,
                       query_max_length=m.query_max_length, passage_max_length=m.passage_max_length,
                       dense_weight=m.dense_weight, language=m.language,
                       dense_max_length=m.dense_max_length, lexicon_layers=m.lexicon_layers,
                       term_bias=m.term_bias, union_source=m.union_source, union_context=m.union_context)


def run_hyrec_recipe(path_or_recipe: str | Path | HyReCRecipe, output_dir: str | Path,
                     overrides: list[str] | None = None, *, cache=None, show_progress: bool = True,
                     evaluate: bool = True,
                     log: Callable[[str], None] = print, recipe_path: str | Path | None = None,
                     state_cache=None, **_: Any) -> HyReCRunResult:
    """Build, train, save and evaluate a HyReC model as the recipe says; returns a :class:`HyReCRunResult`.

    Output folder: the model (:meth:`HyReCModel.save`), ``recipe.yaml``, ``train_log.json``, ``metrics.json``.
    Checkpoints go to ``output_dir/checkpoints`` and a re-run resumes.
    """
    import torch
    from accelerate import Accelerator

    from medadapt.cache import EmbeddingCache, backbone_view
    from medadapt.data import load_beir
    from medadapt.hyrec.data import SharedStateCache, build_examples
    from medadapt.hyrec.model import HyReCModel
    from medadapt.hyrec.train import HyReCTrainConfig, train_hyrec
    from medadapt.losses.hyrec import HyReCLoss
    from medadapt.recipes.loader import resolve_path
    from medadapt.training.checkpoint import CheckpointConfig

    if isinstance(path_or_recipe, HyReCRecipe):
        if overrides:
            raise ConfigError("overrides apply to a recipe file; pass a path or edit the HyReCRecipe")
        spec = path_or_recipe
    else:
        recipe_path = Path(path_or_recipe)
        spec = load_hyrec_recipe(recipe_path, overrides)
    output_dir = Path(output_dir)
    cache = cache if cache is not None else EmbeddingCache()
    tr = spec.training
    if tr.state_cache != "off" and spec.model.variant != "frozen":
        raise ConfigError("training.state_cache needs model.variant: frozen")
    if tr.dense_inputs != "model" and (tr.train_dense_encoder or spec.model.variant != "frozen"):
        raise ConfigError(f"training.dense_inputs: {tr.dense_inputs} needs model.variant: frozen and "
                          "train_dense_encoder: false")
    if not tr.train_lexicon_encoder and (tr.state_cache == "off" or tr.dense_inputs == "model"):
        raise ConfigError("training.train_lexicon_encoder: false needs a state_cache and "
                          "dense_inputs: cache or states")
    if (tr.dense_inputs == "states" or spec.eval.dense_source == "states") and tr.state_cache == "off":
        raise ConfigError("dense inputs from 'states' need training.state_cache: memory or disk")
    want_cpu = spec.model.device == "cpu" or not torch.cuda.is_available()
    accelerator = Accelerator(cpu=want_cpu, mixed_precision=tr.mixed_precision)
    torch.manual_seed(tr.seed)
    result = HyReCRunResult(output_dir=output_dir)
    data_path = resolve_path(spec.data.path, recipe_path)
    data = load_beir(data_path, [spec.data.train_split])

    t0 = time.perf_counter()
    train_texts = []
    if spec.model.extend_vocab:
        train_texts = data.doc_texts() + [data.queries[q] for q in data.qrels[spec.data.train_split]]
    model = HyReCModel.from_backbone(spec.model.backbone, model_config(spec), extend_with=train_texts,
                                     seed=tr.seed, num_layers=spec.model.num_layers)
    model.to(accelerator.device)
    log(f"HyReC: {spec.model.backbone}, {model._n_shared} shared + {len(model.lexicon)} lexicon + "
        f"{spec.model.branch_layers} dense layers ({spec.model.variant}), {model.vocab_size} tokenizer terms")
    neg = spec.negatives
    examples = build_examples(data, spec.data.train_split, negatives=neg.source if neg.num else "none",
                              window=neg.window, num_negatives=max(neg.num, 1),
                              max_queries=spec.data.max_train_examples,
                              miner_model=neg.miner, language=spec.model.language, cache=cache, seed=tr.seed,
                              show_progress=show_progress)
    result.train_examples = len(examples)
    if state_cache is None and tr.state_cache != "off":
        state_cache = SharedStateCache(SharedStateCache.default_root() if tr.state_cache == "disk" else None)
    if state_cache is not None:
        lex, pooled = not tr.train_lexicon_encoder, tr.dense_inputs == "states"
        state_cache.warm(model, [e.query for e in examples], "query", lexicon=lex, pooled=pooled,
                         show_progress=show_progress)
        docs = sorted({t for e in examples for t in [e.positive, *e.negatives[: neg.num]]})
        state_cache.warm(model, docs, "document", lexicon=lex, pooled=pooled, show_progress=show_progress)
    dense_inputs = None
    if tr.dense_inputs == "cache":
        view = backbone_view(model.st)

        def dense_inputs(texts, role):
            return torch.from_numpy(cache.encode(view, list(texts), role=role, show_progress=False))

    elif tr.dense_inputs == "states":
        def dense_inputs(texts, role):
            return state_cache.pooled(model, list(texts), role)

    if tr.dense_inputs == "cache":
        # encode every training text into the cache once, with a progress bar
        dense_inputs([e.query for e in examples], "query")
        cache.encode(view, list({t for e in examples for t in [e.positive, *e.negatives]}), role="document",
                     show_progress=show_progress)
    result.encode_seconds = time.perf_counter() - t0
    log(f"training on {len(examples)} examples")
    lo = spec.loss
    loss = HyReCLoss(lo.temperature, lo.lexical_weight, lo.dense_weight, lo.union_weight)
    cfg = HyReCTrainConfig(epochs=tr.epochs, max_steps=tr.max_steps, batch_size=tr.batch_size,
                           negatives=neg.num, lr=tr.lr, head_lr=tr.head_lr,
                           weight_decay=tr.weight_decay,
                           warmup_ratio=tr.warmup_ratio, max_grad_norm=tr.max_grad_norm, seed=tr.seed,
                           train_dense_encoder=tr.train_dense_encoder,
                           train_lexicon_encoder=tr.train_lexicon_encoder,
                           lexical_words=tr.lexical_words if lo.union_weight > 0 else "none",
                           log_every=tr.log_every)

    def progress(step, total, record):
        if show_progress:
            parts = ", ".join(f"{k}={v:.4f}" for k, v in record.items() if k not in ("step", "lr"))
            log(f"[hyrec] step {step}/{total}: {parts}")

    res = train_hyrec(model, examples, cfg, loss, accelerator=accelerator, state_cache=state_cache,
                      dense_inputs=dense_inputs, progress=progress if show_progress else None,
                      checkpoint=CheckpointConfig(output_dir / "checkpoints",
                                                  every_steps=tr.checkpoint_every_steps))
    result.loss_history = res.loss_history
    result.train_seconds = res.seconds
    result.n_terms = model.n_terms
    if accelerator.is_main_process:
        model.save(output_dir)
        result.write_run_files(output_dir, spec, train_examples=len(examples), steps=res.steps)
    accelerator.wait_for_everyone()
    if evaluate and accelerator.is_main_process:
        ev = spec.eval
        eval_path = data_path if ev.data is None else resolve_path(ev.data, recipe_path)
        result.mode_metrics = evaluate_modes(model, load_beir(eval_path, [ev.split]), ev, cache=cache,
                                             state_cache=state_cache, show_progress=show_progress,
                                             cached_lexicon=(state_cache is not None
                                                             and not tr.train_lexicon_encoder))
        result.record_metrics({f"{m}/{k}": v for m, vals in result.mode_metrics.items() for k, v in vals.items()},
                              ev, output_dir)
    return result


def evaluate_modes(model, data, ev: HyReCEvalSection, *, cache=None, state_cache=None, show_progress=True,
                   cached_lexicon: bool = False) -> dict[str, dict[str, float]]:
    """Every mode of ``ev.modes`` from one encoding pass (hybrid computes the lexical and dense runs too)."""
    from medadapt.eval.metrics import evaluate_run
    from medadapt.hyrec.evaluate import evaluate_hyrec

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
