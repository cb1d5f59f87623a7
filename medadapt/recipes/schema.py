"""Typed recipe schema: one pydantic model per YAML section, ``extra="forbid"`` everywhere.

A recipe file looks like::

    name: med-moe-embed
    model:    {backbone: minilm, freeze_backbone: true}
    data:     {path: ../shared/data/medquad, train_split: train, eval_split: dev}
    head:     {kind: none}
    loss:     {kind: infonce, temperature: 0.05}
    training: {epochs: 1, batch_size: 64, lr: 2.0e-5, seed: 42}
    eval:     {split: test, metrics: [ndcg@10, recall@100], expected: {ndcg@10: 0.57}}

Sections map one-to-one to library classes: ``head`` to a head config, ``loss`` to a loss class,
``training`` to the trainer's arguments. Sections with variants carry a ``kind`` discriminator; an
unknown kind is rejected with the list of valid ones.
"""

from __future__ import annotations

from typing import Annotated, Literal, Union

from pydantic import BaseModel, ConfigDict, Field, field_validator

SCHEMA_VERSION = 1


class Section(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_assignment=True)


class LoraSection(Section):
    """A PEFT LoRA adapter added with ``SentenceTransformer.add_adapter(LoraConfig(...))``."""

    kind: Literal["lora"] = "lora"
    r: int = Field(16, ge=1)
    alpha: int = Field(32, ge=1)
    dropout: float = Field(0.05, ge=0.0, lt=1.0)
    target_modules: list[str] | None = None


class ModelSection(Section):
    backbone: str = Field(..., description="alias (minilm), model folder, or hub id")
    max_seq_length: int | None = Field(None, ge=8)
    freeze_backbone: bool = True
    peft: LoraSection | None = None
    device: str | None = None


class DataSection(Section):
    kind: Literal["beir"] = "beir"
    path: str = Field(..., description="BEIR folder or builtin dataset name (medmini)")
    train_split: str = "train"
    eval_split: str | None = "dev"
    training_file: str | None = Field(None, description="FlagEmbedding JSONL with mined negatives")
    max_train_queries: int | None = Field(None, ge=1)


class NoHead(Section):
    """Train or evaluate the backbone alone."""

    kind: Literal["none"] = "none"


HeadSection = Annotated[Union[NoHead], Field(discriminator="kind")]


class InfoNCESection(Section):
    kind: Literal["infonce"] = "infonce"
    temperature: float = Field(0.05, gt=0)
    hard_negatives: int = Field(0, ge=0, description="hard negatives per query used from the data")


LossSection = Annotated[Union[InfoNCESection], Field(discriminator="kind")]


class TrainingSection(Section):
    epochs: float = Field(1.0, gt=0)
    batch_size: int = Field(64, ge=1)
    lr: float = Field(2e-5, gt=0)
    weight_decay: float = Field(0.0, ge=0)
    warmup_ratio: float = Field(0.0, ge=0, le=1)
    seed: int = 42
    mixed_precision: Literal["no", "fp16", "bf16"] = "no"
    gradient_accumulation_steps: int = Field(1, ge=1)
    checkpoint_every_steps: int | None = Field(None, ge=1)


class EvalSection(Section):
    split: str = "test"
    metrics: list[str] = Field(default_factory=lambda: ["ndcg@10", "recall@100", "mrr@10"])
    expected: dict[str, float] = Field(default_factory=dict, description="regression targets, metric -> value")
    tolerance: float = Field(0.005, ge=0)

    @field_validator("metrics")
    @classmethod
    def _known_metrics(cls, v: list[str]) -> list[str]:
        from medadapt.eval.metrics import parse_metric

        for m in v:
            parse_metric(m)
        return v


class Recipe(Section):
    name: str
    schema_version: Literal[1] = SCHEMA_VERSION
    description: str = ""
    model: ModelSection
    data: DataSection
    head: HeadSection = Field(default_factory=NoHead)
    loss: LossSection = Field(default_factory=InfoNCESection)
    training: TrainingSection = Field(default_factory=TrainingSection)
    eval: EvalSection = Field(default_factory=EvalSection)
