"""Environments: one text-in/text-out multi-turn interface, a registry, and adapters for each source."""

from .base import (
    ActionError,
    Env,
    EnvConfigError,
    EnvError,
    EnvStateError,
    EnvUnavailable,
    StepResult,
    UnknownEnvironment,
)
from .info import EnvInfo
from .registry import EnvRegistry, TaskConfig, default_registry, register_environment

__all__ = [
    "ActionError",
    "Env",
    "EnvConfigError",
    "EnvError",
    "EnvInfo",
    "EnvRegistry",
    "EnvStateError",
    "EnvUnavailable",
    "StepResult",
    "TaskConfig",
    "UnknownEnvironment",
    "default_registry",
    "register_environment",
]
