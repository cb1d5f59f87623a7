"""The recipe base every system's schema extends (``kind``, ``name``, ``data``, ``training``, ``eval``,
``save``) and the sections several systems share. A system's recipe narrows ``kind`` to a literal and adds its
own sections; the Python API builds the same classes a YAML file validates into, with the same defaults.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import Field, PrivateAttr, field_validator, model_validator

from medadapt.config import Section
from medadapt.data.builtin import is_builtin_dataset
from medadapt.eval.metrics import parse_metric

__all__ = ["SCHEMA_VERSION", "AlsoSection", "DataSection", "EvalSection", "LoraSection", "RecipeBase", "RunSection",
           "SaveSection", "Section", "resolve_path"]

SCHEMA_VERSION = 1


def resolve_path(value: str, recipe_path: str | Path | None) -> Path:
    """A recipe's relative path: from the current folder if it exists there, else from the recipe file's
    folder; builtin dataset names as they are."""
    if is_builtin_dataset(value):
        return Path(value)
    p = Path(value).expanduser()
    if p.is_absolute() or p.exists() or recipe_path is None:
        return p
    alt = Path(recipe_path).resolve().parent / p
    return alt if alt.exists() else p


class DataSection(Section):
    """A BEIR folder (``corpus.jsonl``, ``queries.jsonl``, ``qrels/<split>.tsv``) or a builtin name."""

    kind: Literal["beir"] = "beir"
    path: str = Field(..., description="BEIR folder or builtin dataset name (medmini)")
    train_split: str = "train"


class RunSection(Section):
    """How a run executes, whatever the system; a system's ``training`` section adds its optimisation settings."""

    seed: int = 42
    mixed_precision: Literal["no", "fp16", "bf16"] = "no"
    device: str | None = Field(None, description="cpu forces the CPU; default: the GPU when there is one")
    checkpoint_every_steps: int | None = Field(None, ge=1)
    encode_batch_size: int = Field(64, ge=1, description="batch size when encoding texts into the cache")

    @field_validator("mixed_precision", mode="before")
    @classmethod
    def _yaml_no(cls, v):
        return "no" if v is False else v  # YAML 1.1 reads a bare `no` (e.g. --set training.mixed_precision=no) as false


class AlsoSection(Section):
    """One more evaluation set scored after training beside the frozen base model (:mod:`medadapt.recipes.also`)."""

    data: str = Field(..., min_length=1, description="BEIR folder or builtin dataset name")
    split: str = Field("test", min_length=1)
    label: str | None = Field(None, min_length=1, description="name in tables, metrics.json and warnings "
                              "(default: <folder name>/<split>, e.g. questiondoctors/test)")

    @property
    def name(self) -> str:
        """``label``, else ``<last part of data>/<split>``."""
        if self.label:
            return self.label
        folder = Path(self.data.rstrip("/\\")).name or self.data
        return f"{folder}/{self.split}"


class EvalSection(Section):
    """Evaluation after training on ``data`` (default: the recipe's), ``split``; ``expected`` regression targets
    within ``tolerance``; ``also`` more sets, each scored for the frozen base and the trained model."""

    data: str | None = None
    split: str = "test"
    metrics: list[str] = Field(default_factory=lambda: ["ndcg@10", "recall@100", "mrr@10"])
    expected: dict[str, float] = Field(default_factory=dict, description="regression targets, metric -> value")
    tolerance: float = Field(0.005, ge=0)
    baseline: bool = Field(True, description="also evaluate the frozen base model (the backbone with its "
                           "heads disabled, or model.backbone) for the model card")
    also: list[AlsoSection] = Field(default_factory=list, description="more evaluation sets (e.g. outside "
                                    "the training domain), each scored for the frozen base and the trained "
                                    "model whatever ``baseline`` says")

    @model_validator(mode="before")
    @classmethod
    def _peers_here(cls, data):
        """``peers`` is the ``moe`` kind's (:mod:`medadapt.moe.peers`): one clear line for other kinds."""
        if isinstance(data, dict) and "peers" in data and "peers" not in cls.model_fields:
            raise ValueError("peer baselines (eval.peers) train on the moe recipe kind's fast path only "
                             "(kind: moe, frozen backbone + head); remove eval.peers")
        return data

    @field_validator("also")
    @classmethod
    def _distinct_labels(cls, v: list[AlsoSection]) -> list[AlsoSection]:
        names = [a.name for a in v]
        twice = sorted({n for n in names if names.count(n) > 1})
        if twice:
            raise ValueError(f"two sets are named {', '.join(twice)}; give one of them a label")
        return v

    @field_validator("metrics")
    @classmethod
    def _known_metrics(cls, v: list[str]) -> list[str]:
        for m in v:
            parse_metric(m)
        return v


class SaveSection(Section):
    """What the output folder holds."""

    adapter_only: bool = Field(True, description="when the backbone stayed frozen and only medadapt heads "
                               "trained: save the heads alone (a few MB, tied to the named base model); "
                               "false: a standalone folder with the backbone copied in")


class LoraSection(Section):
    """A PEFT LoRA adapter (:func:`medadapt.training.lora.attach_lora`)."""

    kind: Literal["lora"] = "lora"
    r: int = Field(16, ge=1)
    alpha: int = Field(32, ge=1)
    dropout: float = Field(0.05, ge=0.0, lt=1.0)
    target_modules: list[str] | None = None


class RecipeBase(Section):
    """Fields every recipe has. ``kind`` picks the system (:mod:`medadapt.recipes.registry`)."""

    kind: str
    name: str = Field(..., pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]*$",
                      description="run name (default output folder runs/<name>); letters, digits, . _ -")
    schema_version: Literal[1] = SCHEMA_VERSION
    description: str = ""
    data: DataSection
    training: RunSection = Field(default_factory=RunSection)
    eval: EvalSection = Field(default_factory=EvalSection)
    save: SaveSection = Field(default_factory=SaveSection)
    _source: str | None = PrivateAttr(None)  # the file it was read from: relative paths resolve against it

    def resolve(self, value: str) -> Path:
        """A path of this recipe (:func:`resolve_path`)."""
        return resolve_path(value, self._source)

    def training_identity(self) -> dict:
        """What decides the trained weights (all but ``name``, ``description``, ``eval``, ``save``): what a
        checkpoint must match to be resumed."""
        return self.model_dump(mode="json", exclude={"name", "description", "eval", "save"})
