"""The sandbox interface shared by every backend: limits, a time budget, commands, files, long-lived children.

A sandbox is created per episode. ``start()`` starts its budget clock; every command or environment call is
bounded by ``min(step timeout, remaining budget)``. Anything that goes wrong with the sandbox itself (a crash,
a timeout, a limit hit) is raised as :class:`SandboxFailure` with a cause; a command that simply exits non-zero
is a normal :class:`ExecResult`.
"""

from __future__ import annotations

import io
import os
import posixpath
import re
import signal
import tarfile
import threading
import time
from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import IO, Any, Self

from rollart.runtime import ids, timeutil

from .errors import FailureCause, SandboxFailure

# Backend names, as used in configuration (the proto's SANDBOX_BACKEND_<NAME> lower-cased).
IN_PROCESS = "in_process"
PROCESS = "process"
BWRAP = "bwrap"
DOCKER = "docker"
KUBERNETES = "kubernetes"
BACKENDS = (IN_PROCESS, PROCESS, BWRAP, DOCKER, KUBERNETES)

# Cap on captured output per stream; the rest is dropped (the sandbox cannot flood the host's memory).
DEFAULT_OUTPUT_LIMIT = 1 << 20


@dataclass(frozen=True)
class SandboxLimits:
    """Limits of one sandbox. Zero or negative means "backend default" where a backend has one."""

    time_budget_s: float = 600.0  # the whole episode (sandbox lifetime)
    step_timeout_s: float = 60.0  # one command / one environment call
    memory_mib: int = 1024  # address space (bwrap, process) or cgroup memory (docker, kubernetes)
    cpu_limit: float = 1.0  # cores (docker, kubernetes); scales the CPU-seconds rlimit elsewhere
    pids_limit: int = 64
    workspace_mib: int = 256
    file_size_mib: int = 64  # largest single file
    open_files: int = 256
    writable_root: bool = False

    def __post_init__(self) -> None:
        if self.time_budget_s <= 0 or self.step_timeout_s <= 0:
            raise ValueError("time_budget_s and step_timeout_s must be > 0")
        if self.memory_mib <= 0 or self.pids_limit <= 0 or self.workspace_mib <= 0 or self.file_size_mib <= 0:
            raise ValueError("memory_mib, pids_limit, workspace_mib and file_size_mib must be > 0")
        if self.cpu_limit <= 0:
            raise ValueError("cpu_limit must be > 0")

    def with_overrides(self, **kw: Any) -> SandboxLimits:
        return replace(self, **{k: v for k, v in kw.items() if v not in (None, 0, 0.0, "")})

    @classmethod
    def from_proto(cls, spec: Any, base: SandboxLimits | None = None) -> SandboxLimits:
        """From a ``rollart.v1.SandboxSpec``; unset (zero) fields keep ``base``'s values."""
        base = base or cls()

        secs = timeutil.seconds
        limits = base.with_overrides(
            time_budget_s=secs(spec.time_budget) if spec.HasField("time_budget") else None,
            step_timeout_s=secs(spec.step_timeout) if spec.HasField("step_timeout") else None,
            memory_mib=int(spec.memory_mib),
            cpu_limit=float(spec.cpu_limit),
            pids_limit=int(spec.pids_limit),
            workspace_mib=int(spec.workspace_mib),
        )
        return replace(limits, writable_root=True) if spec.writable_root else limits


class TimeBudget:
    """The sandbox's lifetime budget; hands out per-call timeouts and says which limit a timeout hit."""

    def __init__(self, total_s: float, clock=time.monotonic) -> None:
        self.total_s = float(total_s)
        self._clock = clock
        self.started_at: float | None = None

    def start(self) -> None:
        if self.started_at is None:
            self.started_at = self._clock()

    def elapsed(self) -> float:
        return 0.0 if self.started_at is None else self._clock() - self.started_at

    def remaining(self) -> float:
        return self.total_s - self.elapsed()

    def check(self, backend: str = "") -> None:
        if self.remaining() <= 0:
            raise SandboxFailure(
                FailureCause.BUDGET, f"time budget of {self.total_s:g}s is spent", backend=backend
            )

    def timeout(self, step_timeout_s: float) -> tuple[float, FailureCause]:
        """The timeout of the next call and the cause to report when it is hit."""
        remaining = self.remaining()
        if remaining < step_timeout_s:
            return max(remaining, 0.0), FailureCause.BUDGET
        return step_timeout_s, FailureCause.TIMEOUT


@dataclass
class ExecResult:
    """A command that ran to completion inside the sandbox (any exit code)."""

    argv: list[str]
    exit_code: int
    stdout: bytes
    stderr: bytes
    duration_s: float
    truncated: bool = False

    @property
    def ok(self) -> bool:
        return self.exit_code == 0

    def text(self, limit: int = 4000) -> str:
        """stdout and stderr as text, cut to ``limit`` characters (tail kept) for observations."""
        out = self.stdout.decode(errors="replace")
        err = self.stderr.decode(errors="replace")
        both = out + (("\n" if out and not out.endswith("\n") else "") + err if err else "")
        return both if len(both) <= limit else "[... output cut ...]\n" + both[-limit:]


@dataclass
class Spawned:
    """A long-lived child inside a sandbox, with pipes: what the env host protocol talks over."""

    pid: int
    stdin: IO[bytes]
    stdout: IO[bytes]
    proc: Any  # subprocess.Popen
    stderr_path: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)


_SAFE_REL = re.compile(r"^[^\x00]+$")


def safe_relpath(path: str) -> str:
    """A workspace-relative path that cannot leave the workspace (no absolute paths, no ``..``)."""
    if not isinstance(path, str) or not path or not _SAFE_REL.match(path):
        raise ValueError(f"invalid path {path!r}")
    norm = posixpath.normpath(path[len("/workspace/"):] if path.startswith("/workspace/") else path)
    if norm.startswith("/") or norm == ".." or norm.startswith("../") or norm == ".":
        raise ValueError(f"path {path!r} leaves the workspace")
    return norm


def tar_bytes(files: Mapping[str, bytes | str], mode: int = 0o644) -> bytes:
    """An uncompressed tar of workspace-relative files (what gets extracted inside the sandbox)."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        dirs: set[str] = set()
        for raw_path, content in files.items():
            path = safe_relpath(raw_path)
            data = content.encode() if isinstance(content, str) else bytes(content)
            parent = posixpath.dirname(path)
            while parent and parent not in dirs:
                dirs.add(parent)
                parent = posixpath.dirname(parent)
            info = tarfile.TarInfo(path)
            info.size = len(data)
            info.mode = mode
            info.mtime = int(time.time())
            tar.addfile(info, io.BytesIO(data))
        for d in sorted(dirs):
            info = tarfile.TarInfo(d)
            info.type = tarfile.DIRTYPE
            info.mode = 0o755
            tar.addfile(info)
    return buf.getvalue()


def signal_name(num: int) -> str:
    try:
        return signal.Signals(num).name
    except ValueError:
        return f"signal {num}"


def classify_signal(sig: int) -> FailureCause | None:
    """The failure cause of a process killed by ``sig`` (None: not a sandbox failure by itself)."""
    if sig == signal.SIGXCPU:
        return FailureCause.CPU
    if sig == signal.SIGXFSZ:
        return FailureCause.FILE_SIZE
    if sig in (signal.SIGKILL, signal.SIGSEGV, signal.SIGBUS, signal.SIGABRT, signal.SIGILL, signal.SIGSYS):
        return FailureCause.CRASH
    return None


# Uncaught limit errors printed on stderr by the runtime that hit them (Python, libc, shells, C++).
_STDERR_LIMITS: tuple[tuple[re.Pattern[bytes], FailureCause], ...] = (
    (re.compile(rb"MemoryError|Cannot allocate memory|std::bad_alloc|[Oo]ut of memory"), FailureCause.MEMORY),
    (re.compile(rb"[Cc]an(no|')t fork|fork: Resource temporarily unavailable|BlockingIOError: \[Errno 11\]"),
     FailureCause.PIDS),
    (re.compile(rb"File too large|\[Errno 27\]"), FailureCause.FILE_SIZE),
    (re.compile(rb"No space left on device|\[Errno 28\]"), FailureCause.WORKSPACE),
)


def classify_stderr(stderr: bytes) -> FailureCause | None:
    """A limit the command died of, judged from the tail of its stderr (only used for non-zero exits)."""
    tail = stderr[-8192:]
    for pattern, cause in _STDERR_LIMITS:
        if pattern.search(tail):
            return cause
    return None


_live: dict[str, set[str]] = {}
_live_lock = threading.Lock()


def live_sandboxes() -> dict[str, int]:
    """Started, not yet closed sandboxes of this process by backend (the status's ``sandboxes`` map)."""
    with _live_lock:
        return {backend: len(ids) for backend, ids in _live.items() if ids}


class Sandbox(ABC):
    """One sandbox: limits, a budget, a workspace, commands and files; closed exactly once."""

    backend: str = ""
    supports_exec: bool = True
    supports_spawn: bool = True
    #: The Python interpreter (with pytest) to use inside, for envs that run tests.
    python: str = "python3"
    #: Where the workspace is, as seen from inside.
    workspace: str = "/workspace"

    def __init__(self, limits: SandboxLimits | None = None, *, sandbox_id: str | None = None) -> None:
        self.limits = limits or SandboxLimits()
        self.id = sandbox_id or ids.new_id(self.backend, nbytes=6)
        self.budget = TimeBudget(self.limits.time_budget_s)
        self.started = False
        self.closed = False
        self.failure: SandboxFailure | None = None

    # -- lifecycle ---------------------------------------------------------------------------------------------
    def start(self) -> Self:
        if self.closed:
            raise SandboxFailure(FailureCause.CLOSED, f"sandbox {self.id} is closed", backend=self.backend)
        if not self.started:
            self.budget.start()
            try:
                self._start()
            except SandboxFailure:
                self._safe_cleanup()
                raise
            except Exception as exc:
                self._safe_cleanup()
                raise SandboxFailure(
                    FailureCause.SETUP, f"cannot start {self.backend} sandbox: {exc}", backend=self.backend
                ) from exc
            self.started = True
            with _live_lock:
                _live.setdefault(self.backend, set()).add(self.id)
        return self

    def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        with _live_lock:
            _live.get(self.backend, set()).discard(self.id)
        self._safe_cleanup()

    def _safe_cleanup(self) -> None:
        try:
            self._cleanup()
        except Exception:  # closing must not raise over the original failure
            pass

    def __enter__(self) -> Sandbox:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- per-call bookkeeping ------------------------------------------------------------------------------------
    def _fail(self, cause: FailureCause, message: str, **details: Any) -> SandboxFailure:
        """A failure of this sandbox (the caller raises it; it sets ``self.failure`` when the sandbox is gone)."""
        return SandboxFailure(cause, message, backend=self.backend, details=details)

    def _ready(self) -> None:
        if self.closed:
            raise SandboxFailure(FailureCause.CLOSED, f"sandbox {self.id} is closed", backend=self.backend)
        if self.failure is not None:
            raise SandboxFailure(
                FailureCause.CLOSED, f"sandbox {self.id} failed earlier: {self.failure}", backend=self.backend
            )
        if not self.started:
            self.start()
        self.budget.check(self.backend)

    def call_timeout(self, timeout: float | None) -> tuple[float, FailureCause]:
        step = self.limits.step_timeout_s if timeout is None else min(float(timeout), self.limits.step_timeout_s)
        return self.budget.timeout(step)

    # -- the interface -------------------------------------------------------------------------------------------
    def exec(
        self,
        argv: Sequence[str],
        *,
        input: bytes | None = None,
        timeout: float | None = None,
        cwd: str | None = None,
        env: Mapping[str, str] | None = None,
        classify: bool = True,
    ) -> ExecResult:
        """Runs a command to completion. ``classify``: a non-zero exit whose stderr shows an uncaught limit error
        (MemoryError, cannot fork, file too large) raises SandboxFailure with that cause."""
        self._ready()
        if not argv or not all(isinstance(a, str) for a in argv):
            raise ValueError("argv must be a non-empty list of strings")
        result = self._exec(list(argv), input=input, timeout=timeout, cwd=cwd, env=dict(env or {}))
        if classify and result.exit_code != 0:
            cause = classify_stderr(result.stderr)
            if cause is not None:
                raise self._fail(
                    cause,
                    f"command {argv[0]!r} died of a limit (exit {result.exit_code}): "
                    f"{result.stderr[-300:].decode(errors='replace').strip()}",
                    exit_code=result.exit_code,
                )
        self._after_exec()
        return result

    def write_files(self, files: Mapping[str, bytes | str]) -> None:
        """Writes workspace-relative files, from inside the sandbox (symlinks planted there cannot redirect it)."""
        if not files:
            return
        data = tar_bytes(files)
        result = self.exec(["tar", "-x", "-f", "-", "-C", self.workspace], input=data, classify=True)
        if result.exit_code != 0:
            raise OSError(f"writing files into the sandbox failed: {result.text(500)}")

    def read_file(self, path: str, max_bytes: int = DEFAULT_OUTPUT_LIMIT) -> bytes:
        rel = safe_relpath(path)
        result = self.exec(["head", "-c", str(int(max_bytes)), posixpath.join(self.workspace, rel)])
        if result.exit_code != 0:
            raise FileNotFoundError(f"{path}: {result.text(300).strip()}")
        return result.stdout

    def spawn(self, argv: Sequence[str], *, env: Mapping[str, str] | None = None) -> Spawned:
        """Starts a long-lived child with stdin/stdout pipes (the env host). Bounded by the budget, not a timeout."""
        self._ready()
        return self._spawn(list(argv), env=dict(env or {}))

    def _after_exec(self) -> None:  # noqa: B027 - an optional hook, empty by default
        """Hook: checks after each command (workspace size)."""

    @abstractmethod
    def _start(self) -> None: ...

    @abstractmethod
    def _cleanup(self) -> None: ...

    def _exec(
        self, argv: list[str], *, input: bytes | None, timeout: float | None, cwd: str | None, env: dict[str, str]
    ) -> ExecResult:
        raise SandboxFailure(
            FailureCause.UNAVAILABLE, f"the {self.backend} sandbox cannot run commands", backend=self.backend
        )

    def _spawn(self, argv: list[str], *, env: dict[str, str]) -> Spawned:
        raise SandboxFailure(
            FailureCause.UNAVAILABLE, f"the {self.backend} sandbox cannot host child processes", backend=self.backend
        )

    def describe(self) -> dict[str, Any]:
        return {"id": self.id, "backend": self.backend, "limits": self.limits, "pid": os.getpid()}
