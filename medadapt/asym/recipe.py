"""CARE recipes: typed YAML schema (``kind: care``) and :func:`run_care_recipe`.

A CARE recipe describes the two towers, how they are joined, and the three training phases::

    kind: care
    name: care-minilm
    data:     {path: ../shared/data/medquad}
    document: {kind: sentence_transformer, model: minilm}               # or kind: decoder (Qwen3, LoRA, MRL)
    query:    {kind: pruned, layers: 2}                                  # or sentence_transformer / static
    architecture: {projection: false, truncate_to: auto}
    init:     {query: null, document: null}                              # independent initialisation (skip)
    stage1:   {epochs: 1, batch_size: 64, lr: 1.0e-4, mse_weight: 1.0}   # query alignment (eq. 3)
    stage2:   {epochs: 1, train_document: true, negatives: 7}            # joint fine-tuning (eq. 4)
    training: {seed: 42, mixed_precision: bf16}
    eval:     {split: test, metrics: [ndcg@10], expected: {ndcg@10: 0.55}}

Every section forbids unknown keys; discriminated sections (``document.kind``, ``query.kind``) list their
valid kinds in the error. ``EvalSection`` and ``LoraSection`` are reused from
:mod:`medadapt.recipes.schema`. Overrides use the same ``section.field=value`` syntax as
``medadapt train --set``.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any, Literal, Union

from pydantic import Field, model_validator

from medadapt.errors import ConfigError
from medadapt.recipes.schema import EvalSection, LoraSection, Section
from medadapt.training.runner import RunResult

__all__ = [
    "CARE_SCHEMA_VERSION",
    "CareRecipe",
    "CareRunResult",
    "is_care_recipe",
    "load_care_recipe",
    "run_care_recipe",
]

CARE_SCHEMA_VERSION = 1


class LoopSection(Section):
    """Optimisation of one phase (:class:`~medadapt.asym.loop.LoopConfig`); CARE Table 17 uses lr 1e-4 and
    warm-up 0.05 everywhere."""

    epochs: int = Field(1, ge=0)
    max_steps: int | None = Field(None, ge=1)
    batch_size: int = Field(32, ge=1)
    lr: float = Field(1e-4, gt=0)
    weight_decay: float = Field(0.0, ge=0)
    warmup_ratio: float = Field(0.05, ge=0, lt=1)
    scheduler: Literal["cosine", "linear", "constant"] = "cosine"
    max_grad_norm: float | None = Field(1.0, gt=0)

    def to_loop(self, seed: int):
        from medadapt.asym.loop import LoopConfig

        fields = {k: getattr(self, k) for k in LoopSection.model_fields}
        return LoopConfig(seed=seed, **fields)


class CareDataSection(Section):
    kind: Literal["beir"] = "beir"
    path: str = Field(..., description="BEIR folder (corpus.jsonl, queries.jsonl, qrels/)")


class DocumentSection(Section):
    """The large, offline document tower.

    ``kind: sentence_transformer`` loads any ST model (alias, folder, hub id); ``kind: decoder`` wraps a
    decoder LLM (``AutoModel``: Qwen2/Qwen3/Llama/Pythia/Gemma) with EOS appending and last-token pooling.
    """

    kind: Literal["sentence_transformer", "decoder"] = "sentence_transformer"
    model: str
    max_seq_length: int | None = Field(None, ge=8)
    prompts: dict[str, str] = Field(default_factory=dict, description="e.g. {query: 'Instruct: ...\\nQuery: '}")
    padding_side: Literal["left", "right"] = "left"
    torch_dtype: Literal["float32", "bfloat16", "float16"] | None = None
    lora: LoraSection | None = None
    mrl_dims: list[int] = Field(default_factory=list, description="nested dims of the MRL loss (init stage)")
    gradient_checkpointing: bool = False

    @model_validator(mode="after")
    def _check(self) -> "DocumentSection":
        if any(d < 1 for d in self.mrl_dims) or len(set(self.mrl_dims)) != len(self.mrl_dims):
            raise ValueError("mrl_dims must be distinct positive integers")
        return self


class StQuerySection(Section):
    """Any sentence-transformers model as the query tower (CARE: gte-multilingual-base)."""

    kind: Literal["sentence_transformer"] = "sentence_transformer"
    model: str
    max_seq_length: int | None = Field(None, ge=8)
    prompts: dict[str, str] = Field(default_factory=dict)


class PrunedQuerySection(Section):
    """The first ``layers`` layers of the document tower (KALE-style initialisation)."""

    kind: Literal["pruned"] = "pruned"
    layers: int = Field(..., ge=1)
    max_seq_length: int | None = Field(None, ge=8)
    prompts: dict[str, str] = Field(default_factory=dict)


class StaticQuerySection(Section):
    """A ``StaticEmbedding`` distilled from the document tower (:func:`~medadapt.asym.static_from_document`)."""

    kind: Literal["static"] = "static"
    sif_a: float | None = Field(1e-3, gt=0)
    only_seen_tokens: bool = True
    prompts: dict[str, str] = Field(default_factory=dict)


QuerySection = Annotated[Union[StQuerySection, PrunedQuerySection, StaticQuerySection],
                         Field(discriminator="kind")]


class ArchitectureSection(Section):
    """How the towers meet: MRL truncation of the document embedding (default) or a linear projection of the
    query embedding (HotelMatch ablation)."""

    projection: bool = False
    truncate_to: int | Literal["auto"] | None = "auto"


class InitSection(Section):
    """Independent initialisation (Appendix C.1): symmetric InfoNCE per tower; ``null`` skips a tower."""

    query: LoopSection | None = None
    document: LoopSection | None = None
    split: str = "train"
    max_queries: int | None = Field(None, ge=1)
    negatives: int = Field(1, ge=0)
    temperature: float = Field(0.05, gt=0)
    max_length: int | None = Field(None, ge=8)


class Stage1Section(LoopSection):
    """Stage I, query alignment (eq. 1-3) on unlabeled texts; the document tower is frozen."""

    enabled: bool = True
    query_splits: list[str] = Field(default_factory=lambda: ["train"])
    include_corpus: bool = True
    max_texts: int | None = Field(None, ge=1)
    max_corpus_texts: int | None = Field(None, ge=1, description="random subset of corpus documents")
    contrastive_weight: float = Field(1.0, ge=0)
    mse_weight: float = Field(1.0, ge=0)
    temperature: float = Field(0.05, gt=0)
    max_length: int | None = Field(None, ge=8, description="student max tokens per text")

    @model_validator(mode="after")
    def _weights(self) -> "Stage1Section":
        if self.contrastive_weight == 0 and self.mse_weight == 0:
            raise ValueError("contrastive_weight and mse_weight cannot both be 0")
        return self


class Stage2Section(LoopSection):
    """Stage II, joint fine-tuning (eq. 4) on labelled pairs with mined hard negatives.

    ``train_document: false`` keeps the document tower frozen (its cached corpus stays valid): the CPU
    shortcut, which is *not* the paper's stage II."""

    enabled: bool = True
    split: str = "train"
    max_queries: int | None = Field(None, ge=1)
    train_document: bool = True
    negatives: int = Field(7, ge=0)
    skip_top: int = Field(3, ge=0, description="mined negatives start after this many top-ranked documents")
    depth: int = Field(50, ge=1)
    temperature: float = Field(0.05, gt=0)
    query_max_length: int | None = Field(None, ge=8)
    document_max_length: int | None = Field(None, ge=8)


class CareTrainingSection(Section):
    seed: int = 42
    mixed_precision: Literal["no", "fp16", "bf16"] = "no"
    device: str | None = None
    checkpoint_every_steps: int | None = Field(None, ge=1)
    encode_batch_size: int = Field(64, ge=1)
    merge_lora_on_save: bool = Field(True, description="fold the document LoRA into the weights before saving; "
                                     "false saves an adapter folder that needs the base model to load")


class CareRecipe(Section):
    """A CARE recipe (see module docstring)."""

    kind: Literal["care"] = "care"
    name: str
    schema_version: Literal[1] = CARE_SCHEMA_VERSION
    description: str = ""
    data: CareDataSection
    document: DocumentSection
    query: QuerySection
    architecture: ArchitectureSection = Field(default_factory=ArchitectureSection)
    init: InitSection = Field(default_factory=InitSection)
    stage1: Stage1Section = Field(default_factory=Stage1Section)
    stage2: Stage2Section = Field(default_factory=Stage2Section)
    training: CareTrainingSection = Field(default_factory=CareTrainingSection)
    eval: EvalSection = Field(default_factory=EvalSection)


# ---------------------------------------------------------------------------------------------- loading
def is_care_recipe(path: str | Path) -> bool:
    """True if the YAML file at ``path`` declares ``kind: care``."""
    from medadapt.recipes.kinds import recipe_kind

    try:
        return recipe_kind(path) == "care"
    except ConfigError:
        return False


def load_care_recipe(path_or_data: str | Path | dict, overrides: list[str] | None = None) -> CareRecipe:
    """Read (a file or a dict), apply ``section.field=value`` overrides, validate."""
    from medadapt.recipes.loader import load_kind_recipe

    return load_kind_recipe(path_or_data, overrides, CareRecipe, "care", "CARE")


# ---------------------------------------------------------------------------------------------- running
@dataclass
class CareRunResult(RunResult):
    """:class:`~medadapt.training.runner.RunResult` plus per-phase results (``stages``: name -> steps,
    seconds, first/last loss) and the model's query / document routes."""

    stages: dict[str, dict[str, Any]] = field(default_factory=dict)


def _dtype(name: str | None):
    import torch

    return None if name is None else getattr(torch, name)


def build_document_tower(spec: DocumentSection, device: str | None = None):
    """The standalone (symmetric) document tower: ST modules + ``Normalize``, with ``spec.prompts``."""
    from sentence_transformers import SentenceTransformer
    from sentence_transformers.base.modules import Normalize

    from medadapt.asym.decoder import decoder_tower_modules
    from medadapt.models import load, resolve_model_path

    if spec.kind == "decoder":
        kwargs = {"dtype": _dtype(spec.torch_dtype)} if spec.torch_dtype else {}
        modules = decoder_tower_modules(resolve_model_path(spec.model), spec.max_seq_length, spec.padding_side,
                                        model_kwargs=kwargs)
        model = SentenceTransformer(modules=[*modules, Normalize()], device=device, prompts=dict(spec.prompts))
    else:
        model = load(spec.model, device=device)
        if spec.max_seq_length:
            model.max_seq_length = spec.max_seq_length
        if spec.prompts:
            model.prompts = {**(model.prompts or {}), **spec.prompts}
    return model


def build_query_tower(spec, document, texts: list[str] | None = None, device: str | None = None):
    """The query tower for ``spec`` (sentence_transformer / pruned copy / static distillation)."""
    from sentence_transformers import SentenceTransformer
    from sentence_transformers.base.modules import Normalize

    from medadapt.asym.model import strip_normalize
    from medadapt.asym.pruning import prune_layers
    from medadapt.asym.static import static_from_document
    from medadapt.models import load

    if spec.kind == "sentence_transformer":
        model = load(spec.model, device=device)
    elif spec.kind == "pruned":
        model = prune_layers(document, spec.layers)
    else:
        static = static_from_document(document, texts, sif_a=spec.sif_a, only_seen_tokens=spec.only_seen_tokens)
        model = SentenceTransformer(modules=[static, Normalize()], device=device)
    if getattr(spec, "max_seq_length", None):
        model.max_seq_length = spec.max_seq_length
    model.prompts = dict(spec.prompts)
    if not isinstance(list(model._modules.values())[-1], Normalize):
        model = SentenceTransformer(modules=[*strip_normalize(model._modules.values()), Normalize()],
                                    device=device, prompts=dict(spec.prompts))
    return model


def _summary(res) -> dict[str, Any]:
    hist = res.loss_history
    return {"steps": res.steps, "seconds": round(res.seconds, 2),
            "first_loss": hist[0]["loss"] if hist else None, "last_loss": hist[-1]["loss"] if hist else None}


def run_care_recipe(
    path_or_recipe: str | Path | CareRecipe,
    output_dir: str | Path,
    overrides: list[str] | None = None,
    *,
    cache=None,
    show_progress: bool = True,
    evaluate: bool = True,
    log: Callable[[str], None] = print,
) -> CareRunResult:
    """Run a CARE recipe end to end into ``output_dir``; returns a :class:`CareRunResult`.

    Steps: build the document tower -> (init it, symmetric InfoNCE + MRL) -> build the query tower ->
    (init it) -> assemble the Router model -> stage I (teacher embeddings from the EmbeddingCache) ->
    stage II (LoRA on the document route when ``document.lora`` is set and ``stage2.train_document``) ->
    merge LoRA -> save (atomic; ``recipe.yaml``, ``train_log.json``) -> evaluate (``metrics.json``).
    Each phase checkpoints into ``output_dir/checkpoints/<phase>`` and a re-run resumes.

    Args:
        path_or_recipe: a recipe file, or a validated :class:`CareRecipe`.
        output_dir: model folder to write.
        overrides: ``section.field=value`` strings (only with a path).
    """
    import torch
    from accelerate import Accelerator

    from medadapt.asym.alignment_loss import QueryAlignmentLoss
    from medadapt.asym.data import mined_pairs
    from medadapt.asym.lora import DocumentLoraConfig, attach_document_lora, merge_document_lora
    from medadapt.asym.model import build_asymmetric_model
    from medadapt.asym.stages import align_queries, init_tower, joint_finetune, teacher_targets
    from medadapt.cache import EmbeddingCache
    from medadapt.data import load_beir
    from medadapt.losses import AsymInfoNCELoss, InfoNCELoss, MatryoshkaLoss
    from medadapt.recipes.loader import resolve_path
    from medadapt.training.checkpoint import CheckpointConfig
    from medadapt.training.runner import _save_model_atomically

    recipe_path = None
    if isinstance(path_or_recipe, CareRecipe):
        if overrides:
            raise ConfigError("overrides apply to a recipe file; pass a path or edit the CareRecipe")
        recipe = path_or_recipe
    else:
        recipe_path = Path(path_or_recipe)
        recipe = load_care_recipe(recipe_path, overrides)
    output_dir = Path(output_dir)
    cache = cache if cache is not None else EmbeddingCache()
    tr = recipe.training
    want_cpu = tr.device == "cpu" or not torch.cuda.is_available()
    accelerator = Accelerator(cpu=want_cpu, mixed_precision=tr.mixed_precision)
    if not accelerator.is_main_process:  # under `accelerate launch`, only the main process reports
        log, show_progress = (lambda _m: None), False
    device = str(accelerator.device)
    torch.manual_seed(tr.seed)
    result = CareRunResult(output_dir=output_dir)
    data_path = resolve_path(recipe.data.path, recipe_path)
    splits = set()
    if recipe.stage1.enabled:
        splits |= set(recipe.stage1.query_splits)
    if recipe.stage2.enabled:
        splits.add(recipe.stage2.split)
    if recipe.init.query or recipe.init.document:
        splits.add(recipe.init.split)
    data = load_beir(data_path, sorted(splits) or None)
    doc_texts = data.doc_texts()
    bs = tr.encode_batch_size

    def ckpt(phase: str) -> CheckpointConfig:
        return CheckpointConfig(output_dir / "checkpoints" / phase, every_steps=tr.checkpoint_every_steps)

    def progress(name, step, total, record):
        if show_progress and (step == total or step % 50 == 0):
            parts = ", ".join(f"{k}={v:.4f}" for k, v in record.items() if k not in ("step", "epoch", "lr"))
            log(f"[{name}] step {step}/{total}: {parts}")

    run_kw = {"accelerator": accelerator, "progress": progress}
    t_start = time.perf_counter()

    # ---- document tower (+ independent initialisation)
    document = build_document_tower(recipe.document, device)
    lora_cfg = None
    if recipe.document.lora is not None:
        lo = recipe.document.lora
        lora_cfg = DocumentLoraConfig(r=lo.r, alpha=lo.alpha, dropout=lo.dropout,
                                      target_modules=lo.target_modules)
    init = recipe.init
    init_pairs = None
    if init.query or init.document:
        with accelerator.main_process_first():  # the main process fills the cache, the others read it
            init_pairs = mined_pairs(data, init.split, init.max_queries, init.negatives, recipe.stage2.skip_top,
                                     recipe.stage2.depth, document, cache, bs, tr.seed)
    if init.document:
        if lora_cfg is not None:
            from peft import get_peft_model

            transformer = document[0]
            transformer.model = get_peft_model(transformer.model, lora_cfg.to_peft())
        base = InfoNCELoss(init.temperature)
        loss = MatryoshkaLoss(base, recipe.document.mrl_dims) if recipe.document.mrl_dims else base
        log("init: document tower (symmetric InfoNCE" + (" + MRL)" if recipe.document.mrl_dims else ")"))
        res = init_tower(document, init_pairs, doc_texts, init.document.to_loop(tr.seed), loss,
                         max_length=init.max_length, checkpoint=ckpt("init-document"), **run_kw)
        result.stages["init_document"] = _summary(res)
        if lora_cfg is not None:
            document[0].model = document[0].model.merge_and_unload()

    # ---- query tower (+ independent initialisation)
    stage1_items = None
    if recipe.stage1.enabled:
        s1 = recipe.stage1
        from medadapt.asym.data import self_contrastive_texts

        stage1_items = self_contrastive_texts(data, s1.query_splits, s1.include_corpus, s1.max_texts, tr.seed,
                                              s1.max_corpus_texts)
    distil_texts = doc_texts + [t for t, r in (stage1_items or []) if r == "query"]  # static: token table + SIF
    query = build_query_tower(recipe.query, document, distil_texts, device)
    if init.query:
        log("init: query tower (symmetric InfoNCE)")
        res = init_tower(query, init_pairs, doc_texts, init.query.to_loop(tr.seed),
                         InfoNCELoss(init.temperature), max_length=init.max_length,
                         checkpoint=ckpt("init-query"), **run_kw)
        result.stages["init_query"] = _summary(res)

    prompts = {}
    if "query" in recipe.query.prompts:
        prompts["query"] = recipe.query.prompts["query"]
    if "document" in recipe.document.prompts:
        prompts["document"] = recipe.document.prompts["document"]
    model = build_asymmetric_model(query, document, projection=recipe.architecture.projection,
                                   truncate_to=recipe.architecture.truncate_to, prompts=prompts, device=device)
    dim = model.get_embedding_dimension()

    # ---- stage I: query alignment against cached teacher embeddings
    if recipe.stage1.enabled:
        s1 = recipe.stage1
        t0 = time.perf_counter()
        with accelerator.main_process_first():
            teacher = teacher_targets(document, stage1_items, cache, dim=dim, batch_size=bs,
                                      show_progress=show_progress)
        result.encode_seconds += time.perf_counter() - t0
        log(f"stage I: aligning the query tower on {len(stage1_items)} texts")
        res = align_queries(model, [t for t, _ in stage1_items], teacher, s1.to_loop(tr.seed),
                            QueryAlignmentLoss(s1.temperature, s1.contrastive_weight, s1.mse_weight),
                            max_length=s1.max_length, checkpoint=ckpt("stage1"), **run_kw)
        result.stages["stage1"] = _summary(res)
        result.loss_history += res.loss_history

    # ---- stage II: joint fine-tuning
    if recipe.stage2.enabled:
        s2 = recipe.stage2
        t0 = time.perf_counter()
        with accelerator.main_process_first():
            pairs = mined_pairs(data, s2.split, s2.max_queries, s2.negatives, s2.skip_top, s2.depth, document,
                                cache, bs, tr.seed)
        doc_table = None
        if s2.train_document:
            if lora_cfg is not None:
                attach_document_lora(model, lora_cfg,
                                     gradient_checkpointing=recipe.document.gradient_checkpointing)
        else:
            from medadapt.asym.model import tower

            with accelerator.main_process_first():
                doc_table = torch.from_numpy(cache.encode(tower(model, "document"), doc_texts, role="document",
                                                          batch_size=bs, show_progress=show_progress))
        result.encode_seconds += time.perf_counter() - t0
        how = "frozen"
        if s2.train_document:
            how = "trainable via LoRA" if lora_cfg is not None else "fully trainable"
        log(f"stage II: joint fine-tuning on {len(pairs)} pairs (document tower {how})")
        res = joint_finetune(model, pairs, doc_texts, s2.to_loop(tr.seed), AsymInfoNCELoss(s2.temperature),
                             train_document=s2.train_document, doc_table=doc_table,
                             query_max_length=s2.query_max_length, doc_max_length=s2.document_max_length,
                             checkpoint=ckpt("stage2"), **run_kw)
        result.stages["stage2"] = _summary(res)
        result.loss_history += res.loss_history
    if tr.merge_lora_on_save:
        merge_document_lora(model)
    result.train_seconds = time.perf_counter() - t_start - result.encode_seconds

    if accelerator.is_main_process:
        _save_model_atomically(model, output_dir)
        result.write_run_files(output_dir, recipe, stages=result.stages)
    accelerator.wait_for_everyone()
    if evaluate and accelerator.is_main_process:
        from medadapt.asym.evaluate import evaluate_asymmetric

        ev = recipe.eval
        eval_path = data_path if ev.data is None else resolve_path(ev.data, recipe_path)
        eval_data = load_beir(eval_path, [ev.split])
        result.record_metrics(evaluate_asymmetric(model, eval_data, ev.split, ev.metrics, cache=cache,
                                                  batch_size=bs, show_progress=show_progress), ev, output_dir)
    return result
