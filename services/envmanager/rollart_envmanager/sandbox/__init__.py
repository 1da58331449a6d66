"""Sandbox backends behind one interface (:class:`Sandbox`), each with limits and a time budget.

``make_sandbox(backend, limits)`` builds one; ``availability(backend)`` says whether it can run here and why not.
Every failure of a sandbox is a :class:`SandboxFailure` with a :class:`FailureCause`.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from .base import (
    BACKENDS,
    BWRAP,
    DOCKER,
    IN_PROCESS,
    KUBERNETES,
    PROCESS,
    ExecResult,
    Sandbox,
    SandboxLimits,
    Spawned,
    TimeBudget,
    live_sandboxes,
)
from .errors import FailureCause, SandboxFailure

__all__ = [
    "BACKENDS",
    "BWRAP",
    "DOCKER",
    "IN_PROCESS",
    "KUBERNETES",
    "PROCESS",
    "ExecResult",
    "FailureCause",
    "Sandbox",
    "SandboxFailure",
    "SandboxLimits",
    "Spawned",
    "TimeBudget",
    "availability",
    "backend_name",
    "live_sandboxes",
    "make_sandbox",
    "proto_number",
]

_PROTO_NAMES = {
    1: IN_PROCESS,
    2: PROCESS,
    3: BWRAP,
    4: DOCKER,
    5: KUBERNETES,
}


def backend_name(value: str | int) -> str:
    """A backend name from a name, a proto enum name (SANDBOX_BACKEND_BWRAP) or a proto enum number."""
    if isinstance(value, int):
        if value not in _PROTO_NAMES:
            raise ValueError(f"unknown sandbox backend {value}")
        return _PROTO_NAMES[value]
    name = value.strip().lower().replace("-", "_")
    name = name.removeprefix("sandbox_backend_")
    if name not in BACKENDS:
        raise ValueError(f"unknown sandbox backend {value!r} (one of {', '.join(BACKENDS)})")
    return name


def proto_number(name: str) -> int:
    return {v: k for k, v in _PROTO_NAMES.items()}[backend_name(name)]


def make_sandbox(backend: str, limits: SandboxLimits | None = None, *, options: Mapping[str, str] | None = None,
                 **kw: Any) -> Sandbox:
    """A new (not yet started) sandbox of ``backend``."""
    name = backend_name(backend)
    opts = dict(options or {})
    if name == IN_PROCESS:
        from .local import InProcessSandbox

        return InProcessSandbox(limits, **kw)
    if name == PROCESS:
        from .local import ProcessSandbox

        return ProcessSandbox(limits, **kw)
    if name == BWRAP:
        from .bwrap import BwrapSandbox

        return BwrapSandbox(limits, **kw)
    if name == DOCKER:
        from .docker import DockerSandbox

        if "image" in opts:
            kw.setdefault("image", opts["image"])
        return DockerSandbox(limits, **kw)
    from .kubernetes import KubernetesSandbox

    return KubernetesSandbox(limits, options=opts, **kw)


def availability(backend: str) -> tuple[bool, str]:
    """(available, reason) for a backend on this machine."""
    name = backend_name(backend)
    if name in (IN_PROCESS, PROCESS):
        return True, ""
    if name == BWRAP:
        from .bwrap import availability as bwrap_availability

        return bwrap_availability()
    if name == DOCKER:
        from .docker import availability as docker_availability

        return docker_availability()
    from .kubernetes import availability as k8s_availability

    return k8s_availability()
