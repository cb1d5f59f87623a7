"""CARE recipes: the typed YAML schema (``kind: care``) and the system's ``train`` / ``evaluate`` for the
one runner (:func:`medadapt.recipes.run_recipe`, ``medadapt train``).

A CARE recipe describes the two towers, how they are joined, and the three training phases::

    kind: care
    name: care-minilm
    data:     {path: ../shared/data/medquad, train_split: train}
    document: {kind: sentence_transformer, model: minilm}               # or kind: decoder (Qwen3, LoRA, MRL)
    query:    {kind: pruned, layers: 2}                                  # or sentence_transformer / static
    architecture: {projection: false, truncate_to: auto}
    init:     {query: null, document: null}                              # independent initialisation (skip)
    stage1:   {epochs: 1, batch_size: 64, lr: 1.0e-4, mse_weight: 1.0}   # query alignment (eq. 3)
    stage2:   {epochs: 1, train_document: true, negatives: 7}            # joint fine-tuning (eq. 4)
    training: {seed: 42, mixed_precision: bf16}
    eval:     {split: test, metrics: [ndcg@10], expected: {ndcg@10: 0.55}}

:class:`CareRecipe` extends :class:`~medadapt.recipes.base.RecipeBase`; every phase's optimisation is a
:class:`~medadapt.asym.stages.CarePhaseSection` (the loop's ``OptimSection`` with CARE's Table-17
defaults). Every section forbids unknown keys; discriminated sections (``document.kind``, ``query.kind``)
list their valid kinds in the error. Importing this module registers the kind (entry point
``medadapt.recipe_kinds: care``).

Python API: the sections are the configs, so a recipe built in Python equals the YAML one::

    from medadapt.recipes import DataSection, run_recipe
    recipe = CareRecipe(name="care-x", data=DataSection(path="medmini"),
                        document=DocumentSection(model="minilm"), query=PrunedQuerySection(layers=2))
    result = run_recipe(recipe, "runs/care-x")     # checkpoints in runs/care-x.checkpoints/<phase>
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Annotated, Any, Literal, Union

from pydantic import Field, model_validator

from medadapt.asym.stages import CarePhaseSection
from medadapt.recipes.base import LoraSection, RecipeBase, RunSection, Section
from medadapt.recipes.registry import RecipeKind, register_kind

if TYPE_CHECKING:
    from medadapt.recipes.run import RunContext

__all__ = [
    "ArchitectureSection",
    "CarePhaseSection",
    "CareRecipe",
    "CareTrainingSection",
    "DocumentSection",
    "InitSection",
    "PrunedQuerySection",
    "StQuerySection",
    "Stage1Section",
    "Stage2Section",
    "StaticQuerySection",
    "build_document_tower",
    "build_query_tower",
    "evaluate",
    "train",
]


class DocumentSection(Section):
    """The large, offline document tower.

    ``kind: sentence_transformer`` loads any ST model (alias, folder, hub id); ``kind: decoder`` wraps a
    decoder LLM (``AutoModel``: Qwen2/Qwen3/Llama/Pythia/Gemma) with EOS appending and last-token pooling.
    ``lora`` trains the tower through a LoRA adapter (independent init and stage II; merged after each);
    ``gradient_checkpointing`` turns on activation checkpointing wherever the tower trains.
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
    """Independent initialisation (Appendix C.1): symmetric InfoNCE per tower; ``null`` skips a tower.
    ``split`` defaults to ``data.train_split``."""

    query: CarePhaseSection | None = None
    document: CarePhaseSection | None = None
    split: str | None = None
    max_queries: int | None = Field(None, ge=1)
    negatives: int = Field(1, ge=0)
    temperature: float = Field(0.05, gt=0)
    max_length: int | None = Field(None, ge=8)


class Stage1Section(CarePhaseSection):
    """Stage I, query alignment (eq. 1-3) on unlabeled texts; the document tower is frozen.
    ``query_splits`` defaults to ``[data.train_split]``."""

    enabled: bool = True
    query_splits: list[str] | None = None
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


class Stage2Section(CarePhaseSection):
    """Stage II, joint fine-tuning (eq. 4) on labelled pairs with mined hard negatives (``split`` defaults
    to ``data.train_split``).

    ``train_document: false`` keeps the document tower frozen (its cached corpus stays valid): the CPU
    shortcut, which is *not* the paper's stage II."""

    enabled: bool = True
    split: str | None = None
    max_queries: int | None = Field(None, ge=1)
    train_document: bool = True
    negatives: int = Field(7, ge=0)
    skip_top: int = Field(3, ge=0, description="mined negatives start after this many top-ranked documents")
    depth: int = Field(50, ge=1)
    temperature: float = Field(0.05, gt=0)
    query_max_length: int | None = Field(None, ge=8)
    document_max_length: int | None = Field(None, ge=8)


class CareTrainingSection(RunSection):
    """:class:`~medadapt.recipes.base.RunSection` plus what happens to the document LoRA on save."""

    merge_lora_on_save: bool = Field(True, description="fold the document LoRA into the weights before saving; "
                                     "false saves an adapter folder that needs the base model to load")


class CareRecipe(RecipeBase):
    """A CARE recipe (see module docstring)."""

    kind: Literal["care"] = "care"
    document: DocumentSection
    query: QuerySection
    architecture: ArchitectureSection = Field(default_factory=ArchitectureSection)
    init: InitSection = Field(default_factory=InitSection)
    stage1: Stage1Section = Field(default_factory=Stage1Section)
    stage2: Stage2Section = Field(default_factory=Stage2Section)
    training: CareTrainingSection = Field(default_factory=CareTrainingSection)

    def init_split(self) -> str:
        """The split of the independent initialisation (``init.split`` or ``data.train_split``)."""
        return self.init.split or self.data.train_split

    def stage1_splits(self) -> list[str]:
        """The query splits of stage I (``stage1.query_splits`` or ``[data.train_split]``)."""
        return list(self.stage1.query_splits) if self.stage1.query_splits is not None else [self.data.train_split]

    def stage2_split(self) -> str:
        """The split of stage II (``stage2.split`` or ``data.train_split``)."""
        return self.stage2.split or self.data.train_split


# ---------------------------------------------------------------------------------------------- towers
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


# ---------------------------------------------------------------------------------------------- running
def _summary(res) -> dict[str, Any]:
    hist = res.loss_history
    return {"steps": res.steps, "seconds": round(res.seconds, 2),
            "first_loss": hist[0]["loss"] if hist else None, "last_loss": hist[-1]["loss"] if hist else None}


def train(recipe: CareRecipe, ctx: RunContext):
    """Train what a CARE recipe describes; returns the asymmetric model (saved by the runner).

    Steps: build the document tower -> (init it: symmetric InfoNCE + MRL, through LoRA when
    ``document.lora``) -> build the query tower -> (init it) -> assemble the Router model -> stage I
    (teacher embeddings from the EmbeddingCache) -> stage II (LoRA on the document route when
    ``document.lora`` is set and ``stage2.train_document``) -> merge LoRA (``training.merge_lora_on_save``).
    Each phase runs through ``ctx.train`` (the one loop) and checkpoints into
    ``ctx.checkpoint_dir/<phase>`` (``init_document``, ``init_query``, ``stage1``, ``stage2``); a re-run
    resumes. Per-phase summaries (steps, seconds, first / last loss) go to
    ``ctx.result.details["stages"]``.
    """
    import torch

    from medadapt.asym.alignment_loss import QueryAlignmentLoss
    from medadapt.asym.data import mined_pairs, self_contrastive_texts
    from medadapt.asym.lora import attach_document_lora, merge_document_lora
    from medadapt.asym.model import build_asymmetric_model, tower
    from medadapt.asym.stages import align_stage, init_stage, joint_stage, teacher_targets, trainable_only
    from medadapt.data import load_beir
    from medadapt.losses import AsymInfoNCELoss, InfoNCELoss, MatryoshkaLoss
    from medadapt.training.lora import attach_lora, merge_lora

    tr, acc, cache, log = recipe.training, ctx.accelerator, ctx.cache, ctx.log
    device, bs = ctx.device, tr.encode_batch_size
    show = ctx.show_progress and ctx.is_main
    stages: dict[str, Any] = ctx.result.details.setdefault("stages", {})

    def run(model, stage) -> None:
        with trainable_only(model, stage.params):
            res = ctx.train(model, [stage], name=stage.name)
        stages[stage.name] = _summary(res)

    splits: set[str] = set()
    if recipe.stage1.enabled:
        splits |= set(recipe.stage1_splits())
    if recipe.stage2.enabled:
        splits.add(recipe.stage2_split())
    if recipe.init.query or recipe.init.document:
        splits.add(recipe.init_split())
    data = load_beir(ctx.resolve(recipe.data.path), sorted(splits) or None)
    doc_texts = data.doc_texts()

    # ---- document tower (+ independent initialisation)
    document = build_document_tower(recipe.document, device)
    lora = recipe.document.lora
    init = recipe.init
    init_pairs = None
    if init.query or init.document:
        t0 = time.perf_counter()
        with acc.main_process_first():  # the main process fills the cache, the others read it
            init_pairs = mined_pairs(data, recipe.init_split(), init.max_queries, init.negatives,
                                     recipe.stage2.skip_top, recipe.stage2.depth, document, cache, bs, tr.seed)
        ctx.result.encode_seconds += time.perf_counter() - t0
    if init.document:
        if lora is not None:
            attach_lora(document, lora, gradient_checkpointing=recipe.document.gradient_checkpointing)
        base = InfoNCELoss(init.temperature)
        loss = MatryoshkaLoss(base, recipe.document.mrl_dims) if recipe.document.mrl_dims else base
        log("init: document tower (symmetric InfoNCE" + (" + MRL)" if recipe.document.mrl_dims else ")"))
        run(document, init_stage(document, init_pairs, doc_texts, init.document, loss, max_length=init.max_length,
                                 name="init_document"))
        merge_lora(document)

    # ---- query tower (+ independent initialisation)
    stage1_items = None
    if recipe.stage1.enabled:
        s1 = recipe.stage1
        stage1_items = self_contrastive_texts(data, recipe.stage1_splits(), s1.include_corpus, s1.max_texts,
                                              tr.seed, s1.max_corpus_texts)
    distil_texts = doc_texts + [t for t, r in (stage1_items or []) if r == "query"]  # static: token table + SIF
    query = build_query_tower(recipe.query, document, distil_texts, device)
    if init.query:
        log("init: query tower (symmetric InfoNCE)")
        run(query, init_stage(query, init_pairs, doc_texts, init.query, InfoNCELoss(init.temperature),
                              max_length=init.max_length, name="init_query"))

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
        with acc.main_process_first():
            teacher = teacher_targets(document, stage1_items, cache, dim=dim, batch_size=bs, show_progress=show)
        ctx.result.encode_seconds += time.perf_counter() - t0
        log(f"stage I: aligning the query tower on {len(stage1_items)} texts")
        run(model, align_stage(model, [t for t, _ in stage1_items], teacher, s1,
                               QueryAlignmentLoss(s1.temperature, s1.contrastive_weight, s1.mse_weight),
                               max_length=s1.max_length, name="stage1"))

    # ---- stage II: joint fine-tuning
    if recipe.stage2.enabled:
        s2 = recipe.stage2
        t0 = time.perf_counter()
        with acc.main_process_first():
            pairs = mined_pairs(data, recipe.stage2_split(), s2.max_queries, s2.negatives, s2.skip_top, s2.depth,
                                document, cache, bs, tr.seed)
        doc_table = None
        if s2.train_document:
            if lora is not None:
                attach_document_lora(model, lora, gradient_checkpointing=recipe.document.gradient_checkpointing)
        else:
            with acc.main_process_first():
                doc_table = torch.from_numpy(cache.encode(tower(model, "document"), doc_texts, role="document",
                                                          batch_size=bs, show_progress=show))
        ctx.result.encode_seconds += time.perf_counter() - t0
        how = "frozen"
        if s2.train_document:
            how = "trainable via LoRA" if lora is not None else "fully trainable"
        log(f"stage II: joint fine-tuning on {len(pairs)} pairs (document tower {how})")
        run(model, joint_stage(model, pairs, doc_texts, s2, AsymInfoNCELoss(s2.temperature),
                               train_document=s2.train_document, doc_table=doc_table,
                               query_max_length=s2.query_max_length, doc_max_length=s2.document_max_length,
                               name="stage2"))
    if tr.merge_lora_on_save:
        merge_document_lora(model)
    return model


def evaluate(recipe: CareRecipe, model, ctx: RunContext) -> dict[str, float]:
    """:func:`~medadapt.asym.evaluate_asymmetric` on ``eval.data`` (default ``data.path``), split
    ``eval.split``: the model as it is served, the corpus through the document route *via the embedding
    cache* (keyed by the document route's own modules, so a frozen document tower cached as a standalone
    model costs no re-encode, unlike the whole-model key of ``evaluate_dense``), queries through the query
    route (not cached)."""
    from medadapt.asym.evaluate import evaluate_asymmetric
    from medadapt.data import load_beir

    ev = recipe.eval
    data = load_beir(ctx.resolve(ev.data or recipe.data.path), [ev.split])
    return evaluate_asymmetric(model, data, ev.split, ev.metrics, cache=ctx.cache,
                               batch_size=recipe.training.encode_batch_size, show_progress=ctx.show_progress)


register_kind(RecipeKind("care", CareRecipe, train, evaluate,
                         summary="CARE asymmetric retrieval: small query tower aligned to a large document tower"))
