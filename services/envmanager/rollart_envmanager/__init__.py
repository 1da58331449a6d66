"""RollArt EnvManager: environments (reasoning-gym, GEM, textarena, gymnasium, code, SWE) and sandbox backends.

The environment loops (lease, generate, step, settle) use :func:`open_env` and the registry; the gRPC service
that hosts them comes with the ledger and LLMProxy integration.
"""

from .envs import (
    ActionError,
    Env,
    EnvConfigError,
    EnvError,
    EnvInfo,
    EnvRegistry,
    EnvStateError,
    EnvUnavailable,
    StepResult,
    TaskConfig,
    UnknownEnvironment,
    default_registry,
    register_environment,
)
from .hosting import HostedEnv, open_env
from .latency import LatencySampler, LatencySpec
from .sandbox import FailureCause, Sandbox, SandboxFailure, SandboxLimits, make_sandbox

__all__ = [
    "ActionError",
    "Env",
    "EnvConfigError",
    "EnvError",
    "EnvInfo",
    "EnvRegistry",
    "EnvStateError",
    "EnvUnavailable",
    "FailureCause",
    "HostedEnv",
    "LatencySampler",
    "LatencySpec",
    "Sandbox",
    "SandboxFailure",
    "SandboxLimits",
    "StepResult",
    "TaskConfig",
    "UnknownEnvironment",
    "default_registry",
    "make_sandbox",
    "open_env",
    "register_environment",
]
