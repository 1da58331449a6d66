"""RollArt EnvManager: environments (reasoning-gym, GEM, textarena, gymnasium, code, SWE), sandbox backends, and
the environment loops (lease, generate, step, settle) behind the ``rollart.v1.EnvManager`` gRPC service.

Library layer: :func:`open_env` and the registry (envs/, sandbox/, hosting.py). Service layer: loop.py (one
loop), manager.py (what the loops share), episode.py (one episode), chat.py (token history), service.py (gRPC),
main.py (``rollart-envmanager``).
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
