"""RollArt trainer: GRPO policy optimisation, training checkpoints, bf16 weight export for publishing."""

from .backends import make_backend
from .checkpoint import CheckpointManager, CheckpointRecord, TrainerState
from .grpo import (
    GrpoSettings,
    MicroBatch,
    Sample,
    StepStats,
    TorchBackend,
    TrainBackend,
    TrainBatch,
    TurnTokens,
    flatten_sample,
    group_advantages,
    grpo_token_loss,
    k3_kl,
)
from .policy import Policy

__all__ = [
    "CheckpointManager",
    "CheckpointRecord",
    "GrpoSettings",
    "MicroBatch",
    "Policy",
    "Sample",
    "StepStats",
    "TorchBackend",
    "TrainBackend",
    "TrainBatch",
    "TrainerState",
    "TurnTokens",
    "flatten_sample",
    "group_advantages",
    "grpo_token_loss",
    "k3_kl",
    "make_backend",
]
