"""Typed recipe schema: one pydantic model per YAML section, ``extra="forbid"`` everywhere.

A recipe file looks like::

    name: med-moe-embed
    model:    {backbone: minilm, freeze_backbone: true}
    data:     {path: ../shared/data/medquad, train_split: train}
    head:     {kind: moe, top_k: 2}
    loss:     {kind: infonce, temperature: 0.05}
    training: {epochs: 1, batch_size: 64, lr: 2.0e-5, seed: 42}
    eval:     {split: test, metrics: [ndcg@10, recall@100], expected: {ndcg@10: 0.57}}

Sections map one-to-one to library classes: ``head`` to a head config, ``loss`` to a loss class,
``training`` to the trainer's arguments. Sections with variants carry a ``kind`` discriminator; an
unknown kind is rejected with the list of valid ones.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal, Union

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from medadapt.curation.mining_config import MiningConfig

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
    encode_batch_size: int = Field(64, ge=1, description="batch size when encoding texts into the cache")
    max_seq_length: int | None = Field(None, ge=8)
    freeze_backbone: bool = True
    peft: LoraSection | None = None
    device: str | None = None


class DataSection(Section):
    kind: Literal["beir"] = "beir"
    path: str = Field(..., description="BEIR folder or builtin dataset name (medmini)")
    train_split: str = "train"
    training_file: str | None = Field(None, description="FlagEmbedding JSONL with mined negatives")
    max_train_queries: int | None = Field(None, ge=1)
    hard_negatives: MiningConfig | None = Field(
        None, description="mine hard negatives for each training query with the frozen backbone (dense)"
    )


class NoHead(Section):
    """Train or evaluate the backbone alone."""

    kind: Literal["none"] = "none"


class MoEHeadSection(Section):
    """A :class:`~medadapt.heads.MoEHead`; the fields are :class:`~medadapt.heads.MoEConfig`'s, minus
    ``dim`` (taken from the backbone) and the run-time ``routing`` mode (set by the training schedule)."""

    kind: Literal["moe"] = "moe"
    shared_experts: list[str] = Field(default_factory=lambda: ["mlp_swiglu"])
    routed_experts: list[str] = Field(default_factory=lambda: ["mlp_swiglu", "mlp_gelu", "kan", "mlp_kan"])
    top_k: int = Field(2, ge=0)
    expansion: int = Field(4, ge=1)
    alpha_init: float = 1.0
    residual: bool = True
    residual_scale: float = Field(1.0, ge=0, le=1, description="WiSE-FT interpolation at inference")
    zero_init_output: bool = True
    renormalize_top_k: bool = True
    gate_init_std: float = Field(0.02, ge=0)
    expert_options: dict[str, dict[str, Any]] = Field(default_factory=dict)

    def to_config(self, dim: int):
        from medadapt.heads import MoEConfig

        return MoEConfig(dim=dim, **self.model_dump(exclude={"kind"}))

    @model_validator(mode="after")
    def _valid_moe(self) -> "MoEHeadSection":
        from medadapt.errors import ConfigError

        try:
            self.to_config(dim=8)
        except ConfigError as exc:
            raise ValueError(str(exc)) from None
        return self


HeadSection = Annotated[Union[NoHead, MoEHeadSection], Field(discriminator="kind")]


class InfoNCESection(Section):
    """InfoNCE on cosine similarity with in-batch (and mined hard) negatives, plus the MoE
    load-balancing term (:class:`~medadapt.losses.InfoNCELoss`, :class:`~medadapt.losses.LoadBalanceLoss`)."""

    kind: Literal["infonce"] = "infonce"
    temperature: float = Field(0.05, gt=0)
    load_balance_weight: float = Field(0.01, ge=0)


LossSection = Annotated[Union[InfoNCESection], Field(discriminator="kind")]


class TrainingSection(Section):
    """Optimisation. For heads on a frozen backbone the schedule is Med-MoE-Embed's two steps:
    ``shared_epochs`` on the shared experts, ``random_routing_epochs`` of random-routing warm-up, then
    ``epochs`` with the learned gate (:class:`~medadapt.training.head_trainer.HeadTrainConfig`)."""

    epochs: int = Field(1, ge=0)
    shared_epochs: int = Field(0, ge=0)
    random_routing_epochs: int = Field(0, ge=0)
    batch_size: int = Field(64, ge=1)
    lr: float = Field(2e-5, gt=0)
    weight_decay: float = Field(0.0, ge=0)
    warmup_ratio: float = Field(0.0, ge=0, lt=1)
    scheduler: Literal["cosine", "linear", "constant"] = "cosine"
    max_grad_norm: float | None = Field(1.0, gt=0)
    seed: int = 42
    mixed_precision: Literal["no", "fp16", "bf16"] = "no"
    gradient_accumulation_steps: int = Field(1, ge=1)
    checkpoint_every_steps: int | None = Field(None, ge=1)


class EvalSection(Section):
    """Evaluation after training: on ``data`` (default: the recipe's data folder), split ``split``."""

    data: str | None = None
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
