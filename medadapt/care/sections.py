"""The sections of a CARE recipe (``kind: care``, see ``docs/care.md``): the two towers, how they are joined
(``architecture``) and the phases (``init``; ``stage1``, query alignment, eq. 3; ``stage2``, joint fine-tuning,
eq. 4). They are the Python API's configs too (a ``CareRecipe`` built in Python equals the YAML)."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import Field, field_validator, model_validator

from medadapt.adapters.compose import branch_kind
from medadapt.config import validate_each
from medadapt.recipes.base import LoraSection, RecipeBase, RunSection, Section
from medadapt.training.config import OptimSection
from medadapt.training.retromae import RetroMAESection

__all__ = ["ArchitectureSection", "CarePhaseSection", "CareRecipe", "CareTrainingSection", "DocumentSection",
           "InitSection", "PrunedQuerySection", "QueryInitSection", "QueryPretrainSection",
           "QueryUnsupervisedSection", "StQuerySection", "Stage1Section", "Stage2Section",
           "StaticQuerySection"]


class CarePhaseSection(OptimSection):
    """Optimisation of one CARE phase. The loop's defaults are CARE's Table-17 settings (lr 1e-4, warm-up
    0.05); batch sizes are global (the paper's: 640 / 2,560 / 640)."""


class DocumentSection(Section):
    """The large, offline document tower: any ST model (``kind: sentence_transformer``) or a decoder LLM
    (``kind: decoder``: EOS + last-token pooling). ``lora`` trains it through a LoRA adapter, merged after
    each phase."""

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


QuerySection = Annotated[StQuerySection | PrunedQuerySection | StaticQuerySection,
                         Field(discriminator="kind")]


class ArchitectureSection(Section):
    """How the towers meet: MRL truncation of the document embedding (default) or a linear projection of the
    query embedding (HotelMatch ablation)."""

    projection: bool = False
    truncate_to: int | Literal["auto"] | None = "auto"


class _InitTexts(Section):
    """The texts a query-init pre-training step reads: the distinct queries of ``query_splits`` (default
    ``[data.train_split]``) and, with ``include_corpus``, the corpus; shuffled, capped at ``max_texts``."""

    query_splits: list[str] | None = None
    include_corpus: bool = True
    max_texts: int | None = Field(None, ge=1)


class QueryPretrainSection(RetroMAESection, _InitTexts):
    """Query-init step 1 (Appendix C.1.1): RetroMAE pre-training of the query tower's encoder (Table 17:
    lr 2e-4, warm-up 0, batch 384, 3 epochs)."""


class QueryUnsupervisedSection(CarePhaseSection, _InitTexts):
    """Query-init step 2 (Appendix C.1.1): InfoNCE with a learnable temperature, in-batch negatives.
    ``positives: title_text`` pairs a titled document's title with its content; every other text is paired
    with itself (two dropout views, SimCSE). Table 17: lr 1e-4, batch 19,200, 3 epochs."""

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
    """Independent initialisation of the query tower (Appendix C.1.1), in order: ``pretrain`` (RetroMAE),
    ``unsupervised``, then supervised InfoNCE with this section's optimisation (Table 17: batch 640, 2
    epochs; ``supervised: false`` skips it)."""

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
    """Independent initialisation (Appendix C.1): symmetric InfoNCE per tower; ``null`` skips a tower.
    ``split`` defaults to ``data.train_split``."""

    query: QueryInitSection | None = None
    document: CarePhaseSection | None = None
    split: str | None = None
    max_queries: int | None = Field(None, ge=1)
    negatives: int = Field(1, ge=0)
    temperature: float = Field(0.05, gt=0)
    max_length: int | None = Field(None, ge=8)


class Stage1Section(CarePhaseSection, _InitTexts):
    """Stage I, query alignment (eq. 1-3) on unlabeled texts (those of :class:`_InitTexts`), the document tower
    frozen."""

    enabled: bool = True
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
    """Stage II, joint fine-tuning (eq. 4) on labelled pairs with mined hard negatives. ``train_document:
    false`` keeps the document tower frozen (a CPU shortcut, *not* the paper's stage II)."""

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
        """RetroMAE needs a transformer encoder query tower: checked before the fields, so that ``--paper`` on a
        pruned or static tower is this one error, not the static section's unknown-field errors."""
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
        return self.init_text_splits(self.stage1)

    def init_text_splits(self, section: _InitTexts) -> list[str]:
        """The query splits ``section`` reads (its ``query_splits`` or ``[data.train_split]``)."""
        return list(section.query_splits) if section.query_splits is not None else [self.data.train_split]

    def stage2_split(self) -> str:
        """The split of stage II (``stage2.split`` or ``data.train_split``)."""
        return self.stage2.split or self.data.train_split
