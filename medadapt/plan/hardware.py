"""The hardware a plan is for: GPU count and memory, and how Accelerate shares state between them (read from
an ``accelerate`` config by :func:`read_accelerate_config`; what each strategy shards: docs/recipes.md).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Literal

from medadapt.errors import ConfigError
from medadapt.yaml_input import read_yaml

__all__ = ["Hardware", "read_accelerate_config"]

Strategy = Literal["single", "ddp", "deepspeed", "fsdp"]


@dataclass(frozen=True)
class Hardware:
    """``num_gpus`` devices of ``gpu_memory_gb`` GiB each; ``shard_stage`` 0-3 in ZeRO terms (split over
    ``shard_group`` devices); ``headroom``: the fraction of each device kept free (CUDA context, fragmentation)."""

    num_gpus: int = 1
    gpu_memory_gb: float = 80.0
    strategy: Strategy = "single"
    shard_stage: int = 0
    shard_group: int | None = None
    mixed_precision: str | None = None
    headroom: float = 0.1
    source: str = "defaults"

    def __post_init__(self):
        if self.num_gpus < 1:
            raise ConfigError(f"--num-gpus must be >= 1, got {self.num_gpus}")
        if self.gpu_memory_gb <= 0:
            raise ConfigError(f"--gpu-memory must be > 0 GB, got {self.gpu_memory_gb}")
        if not 0 <= self.headroom < 1:
            raise ConfigError(f"headroom must be in [0, 1), got {self.headroom}")
        if self.strategy == "single" and self.num_gpus > 1:  # several plain processes are DDP replicas
            object.__setattr__(self, "strategy", "ddp")

    @property
    def usable_bytes(self) -> float:
        return self.gpu_memory_gb * 2**30 * (1 - self.headroom)

    @property
    def shards(self) -> int:
        """Devices the sharded state is split over."""
        return max(1, min(self.shard_group or self.num_gpus, self.num_gpus))

    def describe(self) -> str:
        how = {"single": "one process", "ddp": "DDP replicas", "deepspeed": f"DeepSpeed ZeRO-{self.shard_stage}",
               "fsdp": f"FSDP (ZeRO-{self.shard_stage}-like)"}[self.strategy]
        return f"{self.num_gpus} x {self.gpu_memory_gb:g} GB, {how}"

    def with_overrides(self, *, num_gpus: int | None = None, gpu_memory_gb: float | None = None) -> Hardware:
        if gpu_memory_gb is not None and not (math.isfinite(gpu_memory_gb) and gpu_memory_gb > 0):
            raise ConfigError(f"--gpu-memory must be a finite number of GB > 0, got {gpu_memory_gb}")
        return replace(self, num_gpus=self.num_gpus if num_gpus is None else num_gpus,
                       gpu_memory_gb=self.gpu_memory_gb if gpu_memory_gb is None else gpu_memory_gb)


_FSDP = {"FULL_SHARD": (3, False), "1": (3, False), "SHARD_GRAD_OP": (2, False), "2": (2, False),
         "NO_SHARD": (0, False), "3": (0, False), "HYBRID_SHARD": (3, True), "4": (3, True),
         "_HYBRID_SHARD_ZERO2": (2, True), "5": (2, True)}


def _count(cfg: dict, key: str, path: Path) -> int:
    """A positive whole number from an accelerate config (absent: 1); anything else is a ConfigError."""
    value = cfg.get(key)
    if value is None:
        return 1
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ConfigError(f"{path}: {key} must be a whole number >= 1, got {value!r}")
    return value


def read_accelerate_config(path: str | Path) -> Hardware:
    """The :class:`Hardware` an Accelerate config file describes (GPU memory: the default 80 GB)."""
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"accelerate config not found: {path}")
    cfg = read_yaml(path)[0] or {}  # the YAML input policy: one error line with the line number
    if not isinstance(cfg, dict):
        raise ConfigError(f"{path}: an accelerate config must be a YAML mapping")
    machines, procs = _count(cfg, "num_machines", path), _count(cfg, "num_processes", path)
    dist = str(cfg.get("distributed_type") or "NO").upper()
    mp = cfg.get("mixed_precision")
    mp = "no" if mp in (False, None, "no") else str(mp)
    per_node = max(1, procs // machines) if machines > 1 else procs
    common = dict(num_gpus=procs, mixed_precision=mp, source=str(path))
    if dist in {"NO", "MULTI_CPU"} and procs <= 1:
        return Hardware(**{**common, "num_gpus": 1}, strategy="single")
    if dist in {"NO", "MULTI_GPU", "MULTI_CPU", "MULTI_XPU", "MULTI_NPU"}:
        return Hardware(**common, strategy="ddp" if procs > 1 else "single")
    if dist == "DEEPSPEED":
        ds = cfg.get("deepspeed_config") or {}
        stage = ds.get("zero_stage", 0) or 0
        if isinstance(stage, bool) or stage not in (0, 1, 2, 3):
            raise ConfigError(f"{path}: deepspeed_config.zero_stage must be 0-3, got {stage}")
        if ds.get("deepspeed_config_file"):
            raise ConfigError(f"{path}: a deepspeed_config_file is not read by the planner; put zero_stage in "
                              "the accelerate config")
        return Hardware(**common, strategy="deepspeed", shard_stage=stage)
    if dist == "FSDP":
        fs = cfg.get("fsdp_config") or {}
        strategy = str(fs.get("fsdp_sharding_strategy", "FULL_SHARD")).upper()
        if strategy not in _FSDP:
            raise ConfigError(f"{path}: unknown fsdp_sharding_strategy {strategy!r} "
                              f"(valid: FULL_SHARD, SHARD_GRAD_OP, NO_SHARD, HYBRID_SHARD)")
        stage, hybrid = _FSDP[strategy]
        return Hardware(**common, strategy="fsdp", shard_stage=stage, shard_group=per_node if hybrid else None)
    raise ConfigError(f"{path}: distributed_type {dist!r} is not planned (valid: NO, MULTI_GPU, DEEPSPEED, FSDP)")
