"""BMRetriever's recipe schema (``kind: bmretriever``): the backbone, the instruction tables (Appendix B) and
the two stages, each a :class:`BmStageSection` for :func:`~medadapt.bmretriever.train.contrastive_stage`.
Every setting: docs/bmretriever.md and docs/recipes.md.
"""

from __future__ import annotations

import math
from typing import Any, Literal

from pydantic import Field, model_validator

from medadapt.bmretriever.instructions import (
    EVAL_INSTRUCTIONS,
    FINETUNE_INSTRUCTIONS,
    PASSAGE_PROMPT,
    PRETRAIN_QUERY_PROMPT,
    QUERY_TEMPLATE,
    SYNTHETIC_INSTRUCTIONS,
    query_prompt,
)
from medadapt.curation.mining_config import MiningConfig
from medadapt.recipes.base import EvalSection, LoraSection, RecipeBase, RunSection, Section
from medadapt.training.config import OptimSection

__all__ = ["BmEvalSection", "BmRetrieverRecipe", "BmStageSection", "BmTrainingSection",
           "CorpusSourceSection", "InstructionsSection", "RetrieverModelSection", "Stage1Section",
           "Stage2Section", "SyntheticSection", "SyntheticSourceSection", "TaskSection",
           "TaskSyntheticSection"]


class RetrieverModelSection(Section):
    """The encoder (:func:`~medadapt.bmretriever.model.build_retriever`)."""

    kind: Literal["decoder", "sentence_transformer"] = "decoder"
    name: str = Field(..., description="hub id, folder or alias (minilm)")
    max_seq_length: int | None = Field(512, ge=8)
    padding_side: Literal["left", "right"] = "right"
    torch_dtype: Literal["float32", "bfloat16", "float16"] | None = None
    normalize: bool = Field(False, description="L2-normalise embeddings (dot becomes cosine); paper: false")
    lora: LoraSection | None = Field(default_factory=LoraSection, description="Appendix D: r=16, alpha=32 "
                                      "(the LoraSection defaults); null: full fine-tuning")
    gradient_checkpointing: bool = False


class InstructionsSection(Section):
    """Appendix B as data: pre-training prompts, Tables 9 (fine-tuning) and 10 (evaluation)."""

    pretrain_query: str = PRETRAIN_QUERY_PROMPT
    passage: str = PASSAGE_PROMPT
    query_template: str = QUERY_TEMPLATE
    finetune: dict[str, str] = Field(default_factory=lambda: dict(FINETUNE_INSTRUCTIONS))
    synthetic: dict[str, str] = Field(default_factory=lambda: dict(SYNTHETIC_INSTRUCTIONS))
    eval: dict[str, str] = Field(default_factory=lambda: dict(EVAL_INSTRUCTIONS))

    @model_validator(mode="after")
    def _template(self) -> InstructionsSection:
        if "{instruction}" not in self.query_template:
            raise ValueError("query_template must contain '{instruction}'")
        return self


class BmStageSection(OptimSection):
    """One stage's optimisation (Appendix D: AdamW, lr 5e-5, global batch 256, 100 warm-up steps, linear
    decay). ``epochs`` may be fractional; the warm-up is ``warmup_steps`` or ``warmup_ratio``, not both."""

    enabled: bool = True
    epochs: float = Field(1.0, gt=0)  # type: ignore[assignment]
    batch_size: int = Field(256, ge=2)
    lr: float = Field(5e-5, gt=0, le=10.0)
    warmup_ratio: float = Field(0.0, ge=0, lt=1)
    warmup_steps: int | None = Field(100, ge=0, description="linear warm-up steps (paper: 100); null: use "
                                     "warmup_ratio")
    scheduler: Literal["linear", "cosine", "constant"] = "linear"
    temperature: float = Field(1.0, gt=0, description="τ of InfoNCE; the loss scale is 1/τ (paper: τ=1)")
    lora: bool = Field(True, description="train through model.lora (false: full fine-tuning of this stage)")
    no_duplicates: bool = Field(True, description="batches never repeat a text (a duplicate would be a false "
                                "in-batch negative)")

    @model_validator(mode="before")
    @classmethod
    def _one_warmup(cls, data: Any) -> Any:
        if isinstance(data, dict) and data.get("warmup_ratio"):
            if data.get("warmup_steps"):
                raise ValueError("give warmup_steps or warmup_ratio, not both")
            data = {"warmup_steps": None, **data}
        return data

    @property
    def warmup(self) -> float:
        """Warm-up steps (an int), or a ratio of the stage's steps (a float in ``[0, 1)``)."""
        return self.warmup_steps if self.warmup_steps is not None else float(self.warmup_ratio)


class CorpusSourceSection(Section):
    """A stage I corpus (:class:`~medadapt.bmretriever.pretrain_data.CorpusSource`)."""

    path: str = Field(..., description="JSONL file or BEIR folder (its corpus.jsonl)")
    mode: Literal["auto", "title", "crop"] = "auto"
    title_field: str = "title"
    text_field: str = "text"
    id_field: str = "_id"
    max_docs: int | None = Field(None, ge=1)


class Stage1Section(BmStageSection):
    """Contrastive pre-training (§3.2, eq. 2), in-batch negatives; no ``sources``: ``data.path``, ``auto``."""

    sources: list[CorpusSourceSection] = Field(default_factory=list)
    min_words: int = Field(8, ge=1, description="shortest crop span (untitled documents)")
    max_words: int = Field(64, ge=1, description="longest crop span")
    max_pairs: int | None = Field(None, ge=1, description="uniform subsample of the pairs")

    @model_validator(mode="after")
    def _spans(self) -> Stage1Section:
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
    def _path(self) -> TaskSection:
        if self.kind == "groups" and not self.path:
            raise ValueError(f"task {self.name!r}: kind 'groups' needs a path")
        return self


class GeneratorFields(Section):
    """Which LLM writes synthetic data: ``fake`` (offline), ``transformers`` (local) or ``openai`` (any
    OpenAI-compatible endpoint; recipes name the key's environment variable, never the key)."""

    generator: Literal["fake", "transformers", "openai"] = "fake"
    model: str | None = Field(None, description="generator model (transformers: hub id or folder; openai: "
                              "the endpoint's model name)")
    endpoint: str = Field("https://api.openai.com/v1", description="openai: base URL of the endpoint")
    api_key_env: str = Field("OPENAI_API_KEY", pattern=r"^[A-Za-z_][A-Za-z0-9_]*$",
                             description="openai: environment variable holding the API key")
    max_new_tokens: int | None = Field(None, ge=1, description="reply length limit (default: 48 tokens per "
                                       "query, 512 per task-level reply)")
    temperature: float = Field(0.0, ge=0, le=2, description="sampling temperature (0: greedy decoding; the "
                               "paper gives none)")
    overgenerate: float = Field(1.2, ge=1, le=100, description="default generation cap: at most this many "
                                "times the examples to keep (the paper generated 500K queries to keep ~420K: "
                                "1.19)")

    @model_validator(mode="after")
    def _model(self):
        if self.generator != "fake" and not self.model:
            raise ValueError(f"generator {self.generator!r} needs a model")
        return self


class SyntheticSourceSection(Section):
    """One instance-level source (Appendix B.2: PubMed, Meadow): a query per passage of ``corpus``; its kept
    pairs are the stage II data set ``name``."""

    name: str = Field(..., description="stage II data set of this source's pairs")
    corpus: str | None = Field(None, description="BEIR folder whose passages get queries (default data.path)")
    instruction: str = Field("pubmed", description="an instructions.synthetic name or the instruction itself")
    passages: int = Field(100, ge=1, description="(query, passage) pairs to KEEP after consistency filtering")
    max_generated: int | None = Field(None, ge=1, description="most queries to generate (default: passages x "
                                      "the section's overgenerate, rounded up)")

    @model_validator(mode="after")
    def _cap(self) -> SyntheticSourceSection:
        if self.max_generated is not None and self.max_generated < self.passages:
            raise ValueError(f"source {self.name!r}: max_generated ({self.max_generated}) must be >= "
                             f"passages ({self.passages}), the pairs to keep")
        return self


class SyntheticSection(GeneratorFields):
    """Instance-level synthetic queries (§3.3), consistency-filtered (passage in the base retriever's top
    ``top_k``). The one-source shorthand ``{corpus, instruction, passages, name}`` reads as ``sources``."""

    sources: list[SyntheticSourceSection] = Field(
        default_factory=lambda: [SyntheticSourceSection(name="synthetic")], min_length=1)
    top_k: int = Field(3, ge=1, description="keep a pair when its passage is in the base retriever's top k")
    noise: float = Field(0.0, ge=0, le=1, description="fake generator only: share of off-topic queries")

    @model_validator(mode="before")
    @classmethod
    def _one_source(cls, data: Any) -> Any:
        if not isinstance(data, dict):
            return data
        legacy = {k: data[k] for k in ("name", "corpus", "instruction", "passages") if k in data}
        if "sources" in data:
            if legacy:
                raise ValueError(f"give sources, or {', '.join(legacy)} for one source, not both")
            return data
        rest = {k: v for k, v in data.items() if k not in legacy}
        return {**rest, "sources": [{"name": "synthetic", **legacy}]}

    @model_validator(mode="after")
    def _names(self) -> SyntheticSection:
        names = [s.name for s in self.sources]
        if len(set(names)) != len(names):
            raise ValueError(f"synthetic source names must be unique, got {names}")
        return self

    def cap(self, source: SyntheticSourceSection) -> int:
        """The most queries generated for ``source``."""
        return source.max_generated or math.ceil(source.passages * self.overgenerate)


class TaskSyntheticSection(GeneratorFields):
    """Task-level synthetic examples (§3.3, Appendix A.1; paper: ~200 tasks, 20,000 examples from GPT-4):
    brainstormed tasks, then (query, positive, hard negative) examples per task. The fake generator's
    topics are ``data.path``'s corpus."""

    name: str = "synthetic-task"
    tasks: int = Field(100, ge=1, description="distinct task instructions to brainstorm (paper: ~200)")
    examples_per_task: int = Field(1, ge=1, description="examples to KEEP per task (paper: 20,000 over ~200 "
                                   "tasks, ~100)")
    max_generated_per_task: int | None = Field(None, ge=1, description="most examples generated per task "
                                               "(default: examples_per_task x overgenerate, rounded up)")
    per_call: int = Field(20, ge=1, description="tasks asked for per brainstorm call (Listing 1: about 20)")
    filter: bool = Field(True, description="keep an example only when the base retriever scores its positive "
                         "above its negative (not in the paper)")

    @model_validator(mode="after")
    def _cap(self) -> TaskSyntheticSection:
        if self.max_generated_per_task is not None and self.max_generated_per_task < self.examples_per_task:
            raise ValueError(f"max_generated_per_task ({self.max_generated_per_task}) must be >= "
                             f"examples_per_task ({self.examples_per_task})")
        return self

    @property
    def cap_per_task(self) -> int:
        return self.max_generated_per_task or math.ceil(self.examples_per_task * self.overgenerate)


class Stage2Section(BmStageSection):
    """Instruction fine-tuning (§3.3, eq. 3): in-batch + hard negatives."""

    tasks: list[TaskSection] = Field(default_factory=list)
    base_retriever: str = Field("minilm", description="model that mines negatives and filters synthetic pairs "
                                "(paper: E5-base)")
    mining: MiningConfig = Field(default_factory=lambda: MiningConfig.preset("bmretriever"))
    hard_negatives: bool = True
    synthetic: SyntheticSection | None = None
    task_synthetic: TaskSyntheticSection | None = None

    @model_validator(mode="after")
    def _tasks(self) -> Stage2Section:
        if self.enabled and not self.tasks and self.synthetic is None and self.task_synthetic is None:
            raise ValueError("stage2 needs at least one task (or synthetic data)")
        names = [t.name for t in self.tasks]
        names += [s.name for s in self.synthetic.sources] if self.synthetic else []
        names += [self.task_synthetic.name] if self.task_synthetic else []
        if len(set(names)) != len(names):
            raise ValueError(f"stage2 task names must be unique, got {names}")
        return self


class BmTrainingSection(RunSection):
    logging_steps: int | None = Field(None, ge=1, description="the stage summary in train_log.json logs the "
                                      "loss every n steps, averaged (default: ~20 rows per stage); the run's "
                                      "loss_history has every step")


class BmEvalSection(EvalSection):
    instruction: str | None = Field(None, description="test-time query instruction: a Table 10 / 9 name or "
                                    "the instruction (default: the first stage II task's)")


class BmRetrieverRecipe(RecipeBase):
    """``data.path``: the default stage I corpus and ``beir`` task folder, and the evaluation data."""

    kind: Literal["bmretriever"] = "bmretriever"
    model: RetrieverModelSection
    instructions: InstructionsSection = Field(default_factory=InstructionsSection)
    stage1: Stage1Section = Field(default_factory=Stage1Section)
    stage2: Stage2Section = Field(default_factory=lambda: Stage2Section(enabled=False))
    training: BmTrainingSection = Field(default_factory=BmTrainingSection)
    eval: BmEvalSection = Field(default_factory=BmEvalSection)

    def task_instruction(self, task: TaskSection) -> str:
        """The instruction of a stage II task (explicit, or looked up by name in Table 9)."""
        if task.instruction is not None:
            return task.instruction
        if task.name not in self.instructions.finetune:
            raise ValueError(f"task {task.name!r} has no instruction and is not in instructions.finetune "
                             f"({', '.join(sorted(self.instructions.finetune))})")
        return self.instructions.finetune[task.name]

    def eval_query_prompt(self) -> str:
        """The saved model's query prompt (``eval.instruction``, else the pre-training query prompt)."""
        ins = self.instructions
        instruction = self.eval.instruction
        if instruction is None and self.stage2.tasks:
            instruction = self.task_instruction(self.stage2.tasks[0])
        if not instruction:
            return ins.pretrain_query
        instruction = ins.eval.get(instruction, ins.finetune.get(instruction, instruction))
        return query_prompt(instruction, ins.query_template)

    @model_validator(mode="after")
    def _instructions(self) -> BmRetrieverRecipe:
        if self.stage2.enabled:
            for task in self.stage2.tasks:
                self.task_instruction(task)
        return self
