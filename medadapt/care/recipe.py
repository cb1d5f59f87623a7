"""CARE recipes (``kind: care``, e.g. ``recipes/care-minilm.yaml``; see ``docs/care.md``): the schema of the
document and query towers, how they are joined (``architecture``) and the training phases (``init``;
``stage1``, query alignment, eq. 3; ``stage2``, joint fine-tuning, eq. 4), and the system's ``train`` /
``evaluate`` for the one runner (:func:`medadapt.recipes.run_recipe`). Every phase's optimisation is a
:class:`~medadapt.care.stages.CarePhaseSection`; the sections are the Python API's configs too (a
``CareRecipe`` built in Python equals the YAML). Importing this module registers the kind.
"""

from __future__ import annotations

import contextlib
import time
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Literal, Union

from pydantic import Field, field_validator, model_validator

import medadapt.training.lora as training_lora
from medadapt.adapters.compose import branch_kind, check_composition
from medadapt.care.alignment_loss import QueryAlignmentLoss
from medadapt.care.data import mined_pairs, self_contrastive_texts
from medadapt.care.evaluate import evaluate_asymmetric
from medadapt.care.lora import attach_document_lora, merge_document_lora
from medadapt.care.model import build_asymmetric_model, tower
from medadapt.care.pruning import prune_layers
from medadapt.care.stages import (
    AlignReplay,
    CarePhaseSection,
    align_stage,
    init_stage,
    joint_stage,
    teacher_targets,
    trainable_only,
    unsupervised_stage,
)
from medadapt.care.static import static_from_document
from medadapt.config import validate_each
from medadapt.data import load_beir
from medadapt.decoder import decoder_tower_modules, strip_normalize
from medadapt.losses import AsymInfoNCELoss, InfoNCELoss, LearnableTemperatureInfoNCELoss, MatryoshkaLoss
from medadapt.models import load, resolve_model_path
from medadapt.plan import LoraSpec, ModelSpec, PhaseSpec, PlanSpec, Usage, find_config
from medadapt.plan.memory import mlm_logit_bytes
from medadapt.recipes.base import LoraSection, RecipeBase, RunSection, Section
from medadapt.systems import load_paper
from medadapt.training.lora import attach_lora, merge_lora
from medadapt.training.retromae import RetroMAESection, retromae_stage

if TYPE_CHECKING:
    from medadapt.recipes.run import RunContext

__all__ = ["ArchitectureSection", "CarePhaseSection", "CareRecipe", "CareTrainingSection", "DocumentSection",
           "InitSection", "PrunedQuerySection", "QueryInitSection", "QueryPretrainSection",
           "QueryUnsupervisedSection", "StQuerySection", "Stage1Section", "Stage2Section",
           "StaticQuerySection", "build_document_tower", "build_query_tower", "evaluate", "train"]


class DocumentSection(Section):
    """The large, offline document tower: any ST model (``kind: sentence_transformer``: alias, folder, hub
    id) or a decoder LLM (``kind: decoder``: Qwen2/Qwen3/Llama/Pythia/Gemma, EOS + last-token pooling).
    ``lora`` trains it through a LoRA adapter (independent init and stage II; merged after each);
    ``gradient_checkpointing`` turns on activation checkpointing wherever the tower trains."""

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
    def _check(self) -> DocumentSection:
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
    """A ``StaticEmbedding`` distilled from the document tower (:func:`~medadapt.care.static_from_document`)."""

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


class _InitTexts(Section):
    """Which unlabeled texts a query-init pre-training step reads: the distinct queries of ``query_splits``
    (default ``[data.train_split]``; ``[]`` for none) and, with ``include_corpus``, every corpus document;
    shuffled and capped at ``max_texts``."""

    query_splits: list[str] | None = None
    include_corpus: bool = True
    max_texts: int | None = Field(None, ge=1)


class QueryPretrainSection(RetroMAESection, _InitTexts):
    """Query-init step 1 (Appendix C.1.1): RetroMAE masked-autoencoder pre-training of the query tower's
    encoder (:mod:`medadapt.training.retromae`; Table 17: lr 2e-4, warm-up 0, batch 384, 3 epochs)."""


class QueryUnsupervisedSection(CarePhaseSection, _InitTexts):
    """Query-init step 2 (Appendix C.1.1): unsupervised InfoNCE with a learnable temperature
    (:class:`~medadapt.losses.LearnableTemperatureInfoNCELoss`, initial value ``temperature``), in-batch
    negatives. ``positives: title_text`` pairs each titled corpus document's title with its content (the
    paper's title-content pairs); untitled documents and queries, and every text under ``dropout``, are
    paired with themselves (two dropout views, SimCSE). Table 17: lr 1e-4, batch 19,200, 3 epochs."""

    positives: Literal["title_text", "dropout"] = "title_text"
    temperature: float = Field(0.05, gt=0, description="initial temperature")
    min_temperature: float = Field(0.01, gt=0, description="lower clamp of the learned temperature")
    learn_temperature: bool = True
    max_length: int | None = Field(None, ge=8)

    @model_validator(mode="after")
    def _temps(self) -> QueryUnsupervisedSection:
        if self.min_temperature > self.temperature:
            raise ValueError(f"min_temperature ({self.min_temperature}) must not exceed temperature "
                             f"({self.temperature})")
        return self


class QueryInitSection(CarePhaseSection):
    """Independent initialisation of the query tower (Appendix C.1.1), up to three steps in order:
    ``pretrain`` (RetroMAE) -> ``unsupervised`` (learnable-temperature InfoNCE) -> supervised fine-tuning
    (InfoNCE on labelled pairs + mined negatives, this section's own optimisation fields; Table 17: batch
    640, 2 epochs). ``supervised: false`` skips the last step. The old flat form ``init.query: {epochs,
    batch_size, lr}`` is this section with no pre-training steps."""

    pretrain: QueryPretrainSection | None = None
    unsupervised: QueryUnsupervisedSection | None = None
    supervised: bool = True

    @model_validator(mode="after")
    def _some_step(self) -> QueryInitSection:
        if not self.supervised and self.pretrain is None and self.unsupervised is None:
            raise ValueError("no step left (supervised: false and no pretrain / unsupervised); "
                             "write init.query: null to skip the query tower's initialisation")
        return self


class InitSection(Section):
    """Independent initialisation (Appendix C.1): symmetric InfoNCE per tower (the query tower optionally
    after RetroMAE and unsupervised pre-training, :class:`QueryInitSection`); ``null`` skips a tower.
    ``split`` defaults to ``data.train_split``."""

    query: QueryInitSection | None = None
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
    corpus_units: Literal["documents", "sentences"] = Field(
        "documents", description="align on whole corpus documents, or on their distinct sentences (many more, "
        "query-length texts; the teacher embeds them as queries)")
    contrastive_weight: float = Field(1.0, ge=0)
    mse_weight: float = Field(1.0, ge=0)
    distill_weight: float = Field(0.0, ge=0, description=(
        "weight of ranking distillation: KL from the teacher's to the query tower's softmax over the frozen "
        "document tower's embeddings of the whole corpus, for every stage-I text (and replayed text in stage "
        "II); 0 = the paper's eq. 3 alone"))
    distill_temperature: float = Field(0.05, gt=0,
                                       description="softmax temperature of the ranking distillation")
    temperature: float = Field(0.05, gt=0)
    max_length: int | None = Field(None, ge=8, description="student max tokens per text")

    @model_validator(mode="after")
    def _weights(self) -> Stage1Section:
        if self.contrastive_weight == 0 and self.mse_weight == 0 and self.distill_weight == 0:
            raise ValueError("contrastive_weight, mse_weight and distill_weight cannot all be 0")
        return self


class Stage2Section(CarePhaseSection):
    """Stage II, joint fine-tuning (eq. 4) on labelled pairs with mined hard negatives (``split`` defaults
    to ``data.train_split``). ``train_document: false`` keeps the document tower frozen (its cached corpus
    stays valid): the CPU shortcut, which is *not* the paper's stage II."""

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
    align_weight: float = Field(0.0, ge=0, description=(
        "weight of stage I's alignment loss (eq. 3) kept on during stage II: each training pair also aligns "
        "one of stage I's texts to its frozen teacher embedding (needs stage1.enabled); 0 = the paper's "
        "stage II, eq. 4 alone"))


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
    branches: list[Any] = Field(default_factory=list, description="branches composed beside the two towers, "
                                "trained after them, e.g. [{kind: hyrec_lexical, ...}] on the document tower "
                                "(medadapt.adapters.compose)")

    @field_validator("branches", mode="before")
    @classmethod
    def _branch_sections(cls, value):
        """Each entry validated by its registered branch kind's section (``kind`` picks it)."""
        return validate_each(value or [], lambda entry: branch_kind(str(entry.get("kind"))).section, "branch")

    @model_validator(mode="after")
    def _branch_tower(self) -> CareRecipe:
        if self.branches and self.document.kind == "decoder":
            raise ValueError("branches: a branch reads the document tower's token states for queries and documents "
                             "alike and needs a BERT-like encoder there; document.kind: decoder (a decoder LLM "
                             "tower) cannot take one")
        if self.branches and self.document.lora is not None and not self.training.merge_lora_on_save:
            raise ValueError("branches: a branch reads the document tower's own layers; keep "
                             "training.merge_lora_on_save: true (an unmerged LoRA document tower cannot take one)")
        return self

    @model_validator(mode="after")
    def _stage2_alignment(self) -> CareRecipe:
        if self.stage2.enabled and self.stage2.align_weight > 0 and not self.stage1.enabled:
            raise ValueError("stage2.align_weight > 0 replays stage I's alignment texts during stage II; "
                             "it needs stage1.enabled: true")
        return self

    @model_validator(mode="before")
    @classmethod
    def _paper_query_tower(cls, data: Any) -> Any:
        """RetroMAE (``init.query.pretrain``) needs a transformer encoder query tower: checked before the fields,
        so that ``--paper`` (which turns the paper's query init on) on a pruned or static tower is this one
        error, not the static section's unknown-field errors."""
        if isinstance(data, dict):
            def get(node, key):
                return node.get(key) if isinstance(node, dict) else getattr(node, key, None)
            kind = get(data.get("query"), "kind")
            if kind in ("pruned", "static") and get(get(data.get("init"), "query"), "pretrain") is not None:
                raise ValueError(f"init.query.pretrain (RetroMAE, the paper's first query-init step, Appendix "
                                 f"C.1.1; --paper turns it on) needs a query tower of kind sentence_transformer "
                                 f"(a transformer encoder), not {kind!r}; a {kind} query tower is a CPU shortcut "
                                 f"outside the paper's pipeline")
        return data

    @model_validator(mode="after")
    def _query_init(self) -> CareRecipe:
        q = self.init.query
        if q is not None and q.pretrain is not None and self.query.kind != "sentence_transformer":
            raise ValueError(f"init.query.pretrain (RetroMAE) needs a query tower of kind sentence_transformer "
                             f"(a masked-LM encoder), not {self.query.kind!r}")
        if q is not None and q.unsupervised is not None and self.query.kind == "static":
            raise ValueError("init.query.unsupervised needs a transformer query tower, not 'static'")
        return self

    def init_split(self) -> str:
        """The split of the independent initialisation (``init.split`` or ``data.train_split``)."""
        return self.init.split or self.data.train_split

    def stage1_splits(self) -> list[str]:
        """The query splits of stage I (``stage1.query_splits`` or ``[data.train_split]``)."""
        return list(self.stage1.query_splits) if self.stage1.query_splits is not None else [self.data.train_split]

    def init_text_splits(self, section: _InitTexts) -> list[str]:
        """The query splits a query-init pre-training step reads (``query_splits`` or ``[data.train_split]``)."""
        return list(section.query_splits) if section.query_splits is not None else [self.data.train_split]

    def stage2_split(self) -> str:
        """The split of stage II (``stage2.split`` or ``data.train_split``)."""
        return self.stage2.split or self.data.train_split


# ---------------------------------------------------------------------------------------------- towers
def build_document_tower(spec: DocumentSection, device: str | None = None):
    """The standalone (symmetric) document tower: ST modules + ``Normalize``, with ``spec.prompts``."""
    import torch
    from sentence_transformers import SentenceTransformer
    from sentence_transformers.base.modules import Normalize

    if spec.kind == "decoder":
        kwargs = {"dtype": getattr(torch, spec.torch_dtype)} if spec.torch_dtype else {}
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
def train(recipe: CareRecipe, ctx: RunContext):
    """Train what a CARE recipe describes; returns the asymmetric model (saved by the runner): document
    tower (+ init, through LoRA when ``document.lora``) -> query tower (+ init: RetroMAE -> unsupervised InfoNCE
    with a learnable temperature -> supervised InfoNCE, each step when set) -> Router model -> stage I ->
    stage II -> merged LoRA. Each phase runs through ``ctx.train`` with its own checkpoint folder (a re-run
    resumes); its summary (steps, seconds, first / last loss) goes to ``ctx.result.details["stages"]``."""
    import torch

    tr, init, s1, s2, cache = recipe.training, recipe.init, recipe.stage1, recipe.stage2, ctx.cache
    device, bs, lora, arch = ctx.device, tr.encode_batch_size, recipe.document.lora, recipe.architecture
    checkpointing = recipe.document.gradient_checkpointing
    show = ctx.show_progress and ctx.is_main
    stages: dict[str, Any] = ctx.result.details.setdefault("stages", {})

    def run(model, stage) -> None:
        with trainable_only(model, stage.params):
            res = ctx.train(model, [stage], name=stage.name)
        hist = res.loss_history
        stages[stage.name] = {"steps": res.steps, "seconds": round(res.seconds, 2),
                              "first_loss": hist[0]["loss"] if hist else None,
                              "last_loss": hist[-1]["loss"] if hist else None,
                              "last_parts": {k: v for k, v in (hist[-1] if hist else {}).items()
                                             if k not in ("stage", "step", "epoch", "loss", "lr")}}

    @contextlib.contextmanager
    def encoding():  # encoding time; the main process goes first (it fills the cache, the others read it)
        t0 = time.perf_counter()
        with ctx.accelerator.main_process_first():
            yield
        ctx.result.encode_seconds += time.perf_counter() - t0

    q_init = init.query
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

    # ---- document tower (+ independent initialisation)
    document = build_document_tower(recipe.document, device)
    _check_branches(recipe, document)  # before anything trains
    init_pairs = None
    if supervised_init:
        if init.negatives:  # under a multi-process launch every process encodes a share first
            ctx.share_encoding(document, doc_texts, batch_size=bs)
        with encoding():
            init_pairs = mined_pairs(data, recipe.init_split(), init.max_queries, init.negatives, s2.skip_top,
                                     s2.depth, document, cache, bs, tr.seed)
    if init.document:
        if lora is not None:
            attach_lora(document, lora, gradient_checkpointing=checkpointing)
        elif checkpointing:
            training_lora.enable_gradient_checkpointing(document)  # through the module: tests spy on it
        base, mrl = InfoNCELoss(init.temperature), recipe.document.mrl_dims
        loss = MatryoshkaLoss(base, mrl) if mrl else base
        ctx.log("init: document tower (symmetric InfoNCE" + (" + MRL)" if mrl else ")"))
        run(document, init_stage(document, init_pairs, doc_texts, init.document, loss,
                                 max_length=init.max_length, name="init_document"))
        merge_lora(document)

    # ---- query tower (+ independent initialisation)
    stage1_items = []
    if s1.enabled:
        stage1_items = self_contrastive_texts(data, recipe.stage1_splits(), s1.include_corpus, s1.max_texts,
                                              tr.seed, s1.max_corpus_texts, s1.corpus_units)
    distil_texts = doc_texts + [t for t, r in stage1_items if r == "query"]  # static: token table + SIF
    query = build_query_tower(recipe.query, document, distil_texts, device)
    if q_init and q_init.pretrain:
        texts = [t for t, _ in _init_texts(data, recipe, q_init.pretrain, tr.seed)]
        ctx.log(f"init: query tower, RetroMAE pre-training on {len(texts)} texts")
        pretrainer, stage = retromae_stage(query, texts, q_init.pretrain, name="init_query_pretrain")
        run(pretrainer, stage)  # trains the query tower's encoder in place; the decoder is dropped here
        del pretrainer
    if q_init and q_init.unsupervised:
        un = q_init.unsupervised
        pairs = _unsupervised_pairs(data, recipe, un, tr.seed)
        loss = LearnableTemperatureInfoNCELoss(un.temperature, min_temperature=un.min_temperature,
                                               learnable=un.learn_temperature)
        ctx.log(f"init: query tower, unsupervised InfoNCE (learnable temperature) on {len(pairs)} pairs")
        module, stage = unsupervised_stage(query, pairs, un, loss, max_length=un.max_length,
                                           name="init_query_unsupervised")
        run(module, stage)
        stages["init_query_unsupervised"]["temperature"] = round(loss.temperature, 6)
    if q_init and q_init.supervised:
        ctx.log("init: query tower (symmetric InfoNCE)")
        run(query, init_stage(query, init_pairs, doc_texts, q_init, InfoNCELoss(init.temperature),
                              max_length=init.max_length, name="init_query"))

    towers = {"query": recipe.query, "document": recipe.document}
    prompts = {role: spec.prompts[role] for role, spec in towers.items() if role in spec.prompts}
    model = build_asymmetric_model(query, document, projection=arch.projection, truncate_to=arch.truncate_to,
                                   prompts=prompts, device=device)

    # ---- stage I: query alignment against cached teacher embeddings
    if s1.enabled:
        dim, documents = model.get_embedding_dimension(), None
        with encoding():
            teacher = teacher_targets(document, stage1_items, cache, dim=dim, batch_size=bs,
                                      show_progress=show)
            if s1.distill_weight > 0:  # the teacher's corpus, that the query tower learns to rank alike
                documents = teacher_targets(document, [(t, "document") for t in doc_texts], cache, dim=dim,
                                            batch_size=bs, show_progress=show)
        ranked = f" (ranking distillation over {len(doc_texts)} documents)" if documents is not None else ""
        ctx.log(f"stage I: aligning the query tower on {len(stage1_items)} texts{ranked}")
        align_loss = QueryAlignmentLoss(s1.temperature, s1.contrastive_weight, s1.mse_weight,  # no parameters
                                        documents=documents, distill_weight=s1.distill_weight,
                                        distill_temperature=s1.distill_temperature)
        run(model, align_stage(model, [t for t, _ in stage1_items], teacher, s1, align_loss,
                               max_length=s1.max_length, name="stage1"))

    # ---- stage II: joint fine-tuning
    if s2.enabled:
        doc_table = None
        if s2.negatives:
            ctx.share_encoding(document, doc_texts, batch_size=bs)
        if not s2.train_document:
            ctx.share_encoding(tower(model, "document"), doc_texts, batch_size=bs)
        with encoding():
            pairs = mined_pairs(data, recipe.stage2_split(), s2.max_queries, s2.negatives, s2.skip_top,
                                s2.depth, document, cache, bs, tr.seed)
            if s2.train_document and lora is not None:
                attach_document_lora(model, lora, gradient_checkpointing=checkpointing)
            elif not s2.train_document:
                table = cache.encode(tower(model, "document"), doc_texts, role="document", batch_size=bs,
                                     show_progress=show)
                doc_table = torch.from_numpy(table)
        how = "frozen"
        if s2.train_document:
            how = "trainable via LoRA" if lora is not None else "fully trainable"
        ctx.log(f"stage II: joint fine-tuning on {len(pairs)} pairs (document tower {how})")
        replay = None
        if s2.align_weight > 0:  # stage I's texts and teacher rows, kept aligned during stage II
            replay = AlignReplay([t for t, _ in stage1_items], teacher, align_loss, s2.align_weight,
                                 max_length=s1.max_length)
            ctx.log(f"stage II: replaying stage I's alignment on {len(stage1_items)} texts "
                    f"(weight {s2.align_weight:g})")
        run(model, joint_stage(model, pairs, doc_texts, s2, AsymInfoNCELoss(s2.temperature),
                               train_document=s2.train_document, doc_table=doc_table,
                               query_max_length=s2.query_max_length, doc_max_length=s2.document_max_length,
                               align=replay, name="stage2"))
    if tr.merge_lora_on_save:
        merge_document_lora(model)
    for section in recipe.branches:  # each branch wraps the model it is given (medadapt.adapters.compose)
        model = branch_kind(section.kind).build_and_train(model, section, recipe, ctx)
    return model


def _check_branches(recipe: CareRecipe, document) -> None:
    """The branches against :data:`medadapt.adapters.compose.ALLOWED` (base ``asymmetric``) and each branch
    kind's ``check`` on an asymmetric probe whose routes are both the built document tower (a branch reads
    that tower; the query tower does not exist yet)."""
    if not recipe.branches:
        return
    check_composition("asymmetric", [(b.kind, "branch") for b in recipe.branches])
    probe = build_asymmetric_model(document, document, truncate_to=None)
    for section in recipe.branches:
        kind = branch_kind(section.kind)
        if kind.check is not None:
            kind.check(probe, section, recipe)


def _init_texts(data, recipe: CareRecipe, section: _InitTexts, seed: int) -> list[tuple[str, str]]:
    """``[(text, role)]`` a query-init pre-training step reads (see :class:`_InitTexts`)."""
    return self_contrastive_texts(data, recipe.init_text_splits(section), section.include_corpus,
                                  section.max_texts, seed)


def _unsupervised_pairs(data, recipe: CareRecipe, section: QueryUnsupervisedSection,
                        seed: int) -> list[tuple[str, str]]:
    """Positive pairs of the unsupervised step: (title, content) of titled corpus documents under
    ``positives: title_text``, (text, text) for every other text (two dropout views)."""
    import random

    titled: dict[str, tuple[str, str]] = {}
    if section.positives == "title_text" and section.include_corpus:
        for doc in data.corpus.values():
            title = (doc.get("title") or "").strip()
            if title and doc["text"].strip():
                titled[f"{title} {doc['text']}".strip()] = (title, doc["text"])
    pairs = [titled.get(text, (text, text)) for text, _ in _init_texts(data, recipe, section, seed)]
    random.Random(seed).shuffle(pairs)
    return pairs


def evaluate(recipe: CareRecipe, model, ctx: RunContext) -> dict[str, float]:
    """:func:`~medadapt.care.evaluate_asymmetric` on ``eval.data`` (default ``data.path``), ``eval.split``:
    the corpus through the document route via the embedding cache, keyed by that route's own modules (so a
    frozen document tower cached as a standalone model costs no re-encode, unlike ``evaluate_dense``); a
    composed model (``branches``) is evaluated by its last branch (``lexical/``, ``dense/``, ``hybrid/``)."""
    if recipe.branches:
        return branch_kind(recipe.branches[-1].kind).evaluate(recipe, model, recipe.branches[-1], ctx)
    ev = recipe.eval
    data = load_beir(ctx.resolve(ev.data or recipe.data.path), [ev.split])
    return evaluate_asymmetric(model, data, ev.split, ev.metrics, cache=ctx.cache,
                               batch_size=recipe.training.encode_batch_size, show_progress=ctx.show_progress)


#: ``medadapt train --paper``: the paper's settings, with where it states each (``paper.yaml`` here).
PAPER = load_paper(Path(__file__).with_name("paper.yaml"))


def frozen_base(recipe: CareRecipe, ctx: RunContext):
    """The frozen base a CARE run is compared with (``eval.baseline``, ``eval.also``): the document tower as
    the recipe names it, untrained, as a symmetric model (both roles through it)."""
    return build_document_tower(recipe.document, device=ctx.device)


def plan_spec(recipe: CareRecipe):
    """What ``medadapt plan`` needs (:mod:`medadapt.plan`): the two towers and the phases that train them
    (init per tower, the query tower's RetroMAE / unsupervised steps when set, stage I with the document tower frozen, stage II); texts per example as each phase
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
