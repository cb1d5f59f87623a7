"""Training: heads on cached embeddings (fast path), backbone / LoRA training through sentence-transformers
(slow path), checkpoints, and the recipe runner behind ``medadapt train``."""

from medadapt.training.checkpoint import CheckpointConfig, latest_checkpoint
from medadapt.training.head_trainer import HeadTrainConfig, TrainProgress, TrainResult, encode_with_head, train_head
from medadapt.training.runner import RunResult, run_recipe

__all__ = [
    "CheckpointConfig",
    "HeadTrainConfig",
    "RunResult",
    "TrainProgress",
    "TrainResult",
    "encode_with_head",
    "latest_checkpoint",
    "run_recipe",
    "train_head",
]
