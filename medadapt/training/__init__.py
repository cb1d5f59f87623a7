"""Training core shared by every system: the one loop (:func:`train` over :class:`Stage` objects, each with
a :class:`Step`), its optimisation section (:class:`OptimSection`) and resumable checkpoints."""

from medadapt.training.checkpoint import CheckpointConfig, latest_checkpoint
from medadapt.training.config import OptimSection
from medadapt.training.loop import Batch, LoopResult, Stage, Step, TrainingError, train

__all__ = [
    "Batch",
    "CheckpointConfig",
    "LoopResult",
    "OptimSection",
    "Stage",
    "Step",
    "TrainingError",
    "latest_checkpoint",
    "train",
]
