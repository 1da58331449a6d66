"""The one failure type of every sandbox: an infrastructure failure with a cause, never a reward."""

from __future__ import annotations

from enum import StrEnum
from typing import Any


class FailureCause(StrEnum):
    """Why a sandbox failed; the value is the cause string reported upwards (``failures_by_cause``)."""

    CRASH = "sandbox-crash"  # the sandboxed process died (signal, unexpected exit)
    TIMEOUT = "sandbox-timeout"  # one step/command ran past its timeout
    BUDGET = "sandbox-budget"  # the sandbox's whole time budget is spent
    MEMORY = "sandbox-oom"  # memory limit hit (OOM kill, allocation failure)
    PIDS = "sandbox-pids"  # process limit hit (fork bomb)
    CPU = "sandbox-cpu"  # CPU-time limit hit (SIGXCPU)
    FILE_SIZE = "sandbox-fsize"  # file-size limit hit (SIGXFSZ / EFBIG)
    WORKSPACE = "sandbox-workspace"  # the workspace grew past its size limit
    ENV_ERROR = "env-error"  # the environment code itself raised (a bug, not the agent's action)
    PROTOCOL = "sandbox-protocol"  # the sandboxed side sent something unreadable
    SETUP = "sandbox-setup"  # the sandbox could not be created (image build, bwrap error, ...)
    UNAVAILABLE = "sandbox-unavailable"  # the backend cannot run here (no docker daemon, no cluster)
    CLOSED = "sandbox-closed"  # used after close() or after an earlier failure


class SandboxFailure(RuntimeError):
    """An infrastructure failure of a sandbox. Callers report it as a failure with its cause, never as a zero reward."""

    def __init__(self, cause: FailureCause, message: str, *, backend: str = "", details: dict[str, Any] | None = None):
        super().__init__(f"[{cause.value}] {message}")
        self.cause = cause
        self.message = message
        self.backend = backend
        self.details = dict(details or {})

    def __reduce__(self):  # keep the cause through pickling (process pools)
        return (_rebuild, (self.cause.value, self.message, self.backend, self.details))


def _rebuild(cause: str, message: str, backend: str, details: dict[str, Any]) -> SandboxFailure:
    return SandboxFailure(FailureCause(cause), message, backend=backend, details=details)
