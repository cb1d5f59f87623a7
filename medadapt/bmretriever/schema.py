"""BMRetriever recipes: the typed YAML schema (``kind: bmretriever``).

A recipe names the backbone, the instruction tables, and the two stages::

    kind: bmretriever
    name: bmretriever-410m
    data:   {path: ../shared/data/medquad}                     # BEIR folder: stage II tasks default here, eval
    model:  {kind: decoder, name: EleutherAI/pythia-410m, max_seq_length: 512, torch_dtype: bfloat16,
             lora: {r: 16, alpha: 32}, gradient_checkpointing: true}
    instructions: {...}                                        # Appendix B, Tables 9-10 (defaults built in)
    stage1: {sources: [{path: pubmed.jsonl}], epochs: 2, batch_size: 256, lr: 5.0e-5, warmup_steps: 100}
    stage2: {tasks: [{name: medquad, split: train}], base_retriever: minilm, epochs: 1, lr: 5.0e-5}
    training: {seed: 42, mixed_precision: bf16}
    eval:   {split: test, metrics: [ndcg@10], instruction: "Given a question, ..."}

Every section forbids unknown keys. ``LoraSection`` and ``EvalSection`` come from
:mod:`medadapt.recipes.schema`, hard-negative mining is :class:`medadapt.curation.MiningConfig`.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field, PrivateAttr, model_validator

from medadapt.bmretriever.instructions import (
    EVAL_INSTRUCTIONS,
    FINETUNE_INSTRUCTIONS,
    PASSAGE_PROMPT,
    PRETRAIN_QUERY_PROMPT,
    QUERY_TEMPLATE,
    SYNTHETIC_INSTRUCTIONS,
)
from medadapt.curation.mining_config import MiningConfig
from medadapt.recipes.schema import EvalSection, LoraSection, Section

__all__ = [
    "BMRETRIEVER_SCHEMA_VERSION",
    "BmRetrieverRecipe",
    "CorpusSourceSection",
    "InstructionsSection",
    "RetrieverModelSection",
    "Stage1Section",
    "Stage2Section",
    "SyntheticSection",
    "TaskSection",
]

BMRETRIEVER_SCHEMA_VERSION = 1


class BmDataSection(Section):
    kind: Literal["beir"] = "beir"
    path: str = Field(..., description="BEIR folder: default stage I corpus, stage II tasks and evaluation")


class RetrieverModelSection(Section):
    """The encoder (:func:`~medadapt.bmretriever.model.build_retriever`)."""

    kind: Literal["decoder", "sentence_transformer"] = "decoder"
    name: str = Field(..., description="hub id, folder or alias (minilm)")
    max_seq_length: int | None = Field(512, ge=8)
    padding_side: Literal["left", "right"] = "right"
    torch_dtype: Literal["float32", "bfloat16", "float16"] | None = None
    normalize: bool = Field(False, description="L2-normalise embeddings (dot becomes cosine); paper: false")
    lora: LoraSection | None = Field(default_factory=LoraSection, description="Appendix D: r=16, alpha=32")
    gradient_checkpointing: bool = False


class InstructionsSection(Section):
    """Appendix B as data: pre-training prompts, Table 9 (fine-tuning) and Table 10 (evaluation)
    instructions."""

    pretrain_query: str = PRETRAIN_QUERY_PROMPT
    passage: str = PASSAGE_PROMPT
    query_template: str = QUERY_TEMPLATE
    finetune: dict[str, str] = Field(default_factory=lambda: dict(FINETUNE_INSTRUCTIONS))
    synthetic: dict[str, str] = Field(default_factory=lambda: dict(SYNTHETIC_INSTRUCTIONS))
    eval: dict[str, str] = Field(default_factory=lambda: dict(EVAL_INSTRUCTIONS))

    @model_validator(mode="after")
    def _template(self) -> "InstructionsSection":
        if "{instruction}" not in self.query_template:
            raise ValueError("query_template must contain '{instruction}'")
        return self


class LoopSection(Section):
    """Optimisation of one stage (:class:`~medadapt.bmretriever.trainer.StageConfig`); batch sizes are
    global."""

    enabled: bool = True
    epochs: float = Field(1.0, gt=0)
    max_steps: int | None = Field(None, ge=1)
    batch_size: int = Field(256, ge=2)
    lr: float = Field(5e-5, gt=0)
    weight_decay: float = Field(0.0, ge=0)
    warmup_steps: int = Field(100, ge=0)
    scheduler: Literal["linear", "cosine", "constant"] = "linear"
    max_grad_norm: float | None = Field(1.0, gt=0)
    temperature: float = Field(1.0, gt=0, description="τ of InfoNCE; the loss scale is 1/τ (paper: τ=1)")
    lora: bool = Field(True, description="train through model.lora (false: full fine-tuning of this stage)")
    no_duplicates: bool = Field(True, description="batches never repeat a text (a duplicate would be a false "
                                "in-batch negative)")


class CorpusSourceSection(Section):
    """A stage I corpus (:class:`~medadapt.bmretriever.pretrain_data.CorpusSource`)."""

    path: str = Field(..., description="JSONL file or BEIR folder (its corpus.jsonl)")
    mode: Literal["auto", "title", "crop"] = "auto"
    title_field: str = "title"
    text_field: str = "text"
    id_field: str = "_id"
    max_docs: int | None = Field(None, ge=1)


class Stage1Section(LoopSection):
    """Unsupervised contrastive pre-training (§3.2, eq. 2): in-batch negatives only.

    ``sources`` empty means the recipe's own BEIR corpus (``data.path``) in ``auto`` mode."""

    sources: list[CorpusSourceSection] = Field(default_factory=list)
    min_words: int = Field(8, ge=1, description="shortest crop span (untitled documents)")
    max_words: int = Field(64, ge=1, description="longest crop span")
    max_pairs: int | None = Field(None, ge=1, description="uniform subsample of the pairs")

    @model_validator(mode="after")
    def _spans(self) -> "Stage1Section":
        if self.max_words < self.min_words:
            raise ValueError("max_words must be >= min_words")
        return self


class TaskSection(Section):
    """A labelled stage II task: a BEIR split (negatives mined) or a FlagEmbedding JSONL of groups."""

    name: str
    kind: Literal["beir", "groups"] = "beir"
    path: str | None = Field(None, description="beir: folder (default data.path); groups: JSONL file")
    split: str = "train"
    instruction: str | None = Field(None, description="query instruction (default instructions.finetune[name])")
    max_queries: int | None = Field(None, ge=1)

    @model_validator(mode="after")
    def _path(self) -> "TaskSection":
        if self.kind == "groups" and not self.path:
            raise ValueError(f"task {self.name!r}: kind 'groups' needs a path")
        return self


class SyntheticSection(Section):
    """Instance-level synthetic queries (§3.3) for passages of ``data.path``, consistency-filtered (top-k)."""

    name: str = "synthetic"
    generator: Literal["fake", "transformers"] = "fake"
    model: str | None = Field(None, description="text-generation model (generator: transformers)")
    instruction: str = "pubmed"
    passages: int = Field(100, ge=1, description="corpus passages sampled for generation")
    top_k: int = Field(3, ge=1, description="keep a pair when its passage is in the base retriever's top k")
    noise: float = Field(0.0, ge=0, le=1, description="fake generator only: share of off-topic queries")

    @model_validator(mode="after")
    def _model(self) -> "SyntheticSection":
        if self.generator == "transformers" and not self.model:
            raise ValueError("generator 'transformers' needs a model")
        return self


class Stage2Section(LoopSection):
    """Instruction fine-tuning (§3.3, eq. 3): in-batch + hard negatives."""

    tasks: list[TaskSection] = Field(default_factory=list)
    base_retriever: str = Field("minilm", description="model that mines negatives and filters synthetic pairs "
                                "(paper: E5-base)")
    mining: MiningConfig = Field(default_factory=lambda: MiningConfig.preset("bmretriever"))
    hard_negatives: bool = True
    synthetic: SyntheticSection | None = None

    @model_validator(mode="after")
    def _tasks(self) -> "Stage2Section":
        if self.enabled and not self.tasks and self.synthetic is None:
            raise ValueError("stage2 needs at least one task (or synthetic data)")
        names = [t.name for t in self.tasks] + ([self.synthetic.name] if self.synthetic else [])
        if len(set(names)) != len(names):
            raise ValueError(f"stage2 task names must be unique, got {names}")
        return self


class BmTrainingSection(Section):
    seed: int = 42
    mixed_precision: Literal["no", "fp16", "bf16"] = "no"
    device: str | None = Field(None, description="cpu forces the CPU; default: GPU when available")
    encode_batch_size: int = Field(64, ge=1)
    checkpoint_every_steps: int | None = Field(None, ge=1)
    logging_steps: int | None = Field(None, ge=1)


class BmEvalSection(EvalSection):
    """:class:`~medadapt.recipes.schema.EvalSection` plus the query instruction used at test time
    (default: that of the first stage II task)."""

    instruction: str | None = None


class BmRetrieverRecipe(Section):
    """A BMRetriever recipe (see module docstring)."""

    kind: Literal["bmretriever"] = "bmretriever"
    name: str
    schema_version: Literal[1] = BMRETRIEVER_SCHEMA_VERSION
    description: str = ""
    data: BmDataSection
    model: RetrieverModelSection
    instructions: InstructionsSection = Field(default_factory=InstructionsSection)
    stage1: Stage1Section = Field(default_factory=Stage1Section)
    stage2: Stage2Section = Field(default_factory=lambda: Stage2Section(enabled=False))
    training: BmTrainingSection = Field(default_factory=BmTrainingSection)
    eval: BmEvalSection = Field(default_factory=BmEvalSection)
    _source: str | None = PrivateAttr(None)  # the file it was loaded from (relative paths resolve against it)

    def task_instruction(self, task: TaskSection) -> str:
        """The instruction of a stage II task (explicit, or looked up by name in Table 9)."""
        if task.instruction is not None:
            return task.instruction
        if task.name not in self.instructions.finetune:
            raise ValueError(f"task {task.name!r} has no instruction and is not in instructions.finetune "
                             f"({', '.join(sorted(self.instructions.finetune))})")
        return self.instructions.finetune[task.name]

    @model_validator(mode="after")
    def _instructions(self) -> "BmRetrieverRecipe":
        if self.stage2.enabled:
            for task in self.stage2.tasks:
                self.task_instruction(task)
        return self
