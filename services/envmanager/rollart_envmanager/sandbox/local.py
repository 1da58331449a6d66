"""Local backends: in-process (a budget holder for pure-Python, stateless envs) and one process per environment.

The process backend isolates *state* (GEM and textarena seed process-global RNGs; one env per process keeps
episodes independent and reproducible) and bounds resources with rlimits. It is not a security boundary: use
bwrap, Docker or Kubernetes for untrusted code.
"""

from __future__ import annotations

import math
import os
import shutil
import subprocess
import sys
import tempfile
import threading
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from . import _proc
from .base import (
    IN_PROCESS,
    PROCESS,
    ExecResult,
    Sandbox,
    SandboxLimits,
    Spawned,
    classify_signal,
    classify_stderr,
    signal_name,
)
from .errors import FailureCause

# Environment of every sandboxed command: nothing inherited from the host but a PATH and a locale.
BASE_ENV = {
    "LANG": "C.UTF-8",
    "LC_ALL": "C.UTF-8",
    "PYTHONDONTWRITEBYTECODE": "1",
    "PYTHONUNBUFFERED": "1",
    "PYTHONHASHSEED": "0",
    "HF_HUB_OFFLINE": "1",
    "OMP_NUM_THREADS": "1",
    "OPENBLAS_NUM_THREADS": "1",
    "MKL_NUM_THREADS": "1",
}


def host_path() -> str:
    """PATH with this interpreter's bin directory first (so ``python``/``pytest`` are the venv's)."""
    bindir = os.path.dirname(sys.executable)
    return os.pathsep.join([bindir, "/usr/local/bin", "/usr/bin", "/bin", "/usr/local/sbin", "/usr/sbin", "/sbin"])


class InProcessSandbox(Sandbox):
    """No isolation: a budget and a step timeout checked around in-process calls (which cannot be preempted)."""

    backend = IN_PROCESS
    supports_exec = False
    supports_spawn = False

    def _start(self) -> None:
        pass

    def _cleanup(self) -> None:
        pass

    def check_call_time(self, elapsed_s: float) -> None:
        """After an in-process call: one that overran its timeout is reported as a timeout after the fact."""
        if elapsed_s > self.limits.step_timeout_s:
            raise self._fail(
                FailureCause.TIMEOUT, f"in-process step took {elapsed_s:.2f}s > {self.limits.step_timeout_s:g}s"
            )
        if self.budget.remaining() <= 0:
            raise self._fail(FailureCause.BUDGET, f"time budget of {self.limits.time_budget_s:g}s is spent")


def rlimit_argv(limits: SandboxLimits, cpu_seconds: float, *, nproc: int | None = None) -> list[str]:
    """``prlimit`` wrapper arguments (thread-safe, unlike a preexec_fn) for one command."""
    prlimit = shutil.which("prlimit")
    if prlimit is None:
        return []
    mib = 1024 * 1024
    args = [
        prlimit,
        f"--as={limits.memory_mib * mib}",
        f"--fsize={min(limits.file_size_mib, limits.workspace_mib) * mib}",
        f"--nofile={limits.open_files}",
        f"--cpu={max(1, math.ceil(cpu_seconds))}",
        "--core=0",
    ]
    if nproc is not None:
        args.append(f"--nproc={nproc}")
    return [*args, "--"]


def dir_size(path: str, stop_at: int) -> int:
    """Bytes under ``path`` (not following symlinks), stopping early once past ``stop_at``."""
    total = 0
    for root, dirs, files in os.walk(path, followlinks=False):
        for name in files + dirs:
            try:
                total += os.lstat(os.path.join(root, name)).st_blocks * 512
            except OSError:
                continue
            if total > stop_at:
                return total
    return total


class ProcessSandbox(Sandbox):
    """Commands and env hosts as local child processes in their own session, under rlimits, in a temp workspace."""

    backend = PROCESS
    python = sys.executable

    def __init__(self, limits: SandboxLimits | None = None, *, sandbox_id: str | None = None,
                 root_dir: str | None = None) -> None:
        super().__init__(limits, sandbox_id=sandbox_id)
        self.root_dir = root_dir
        self.host_dir: str | None = None  # holds the workspace and logs
        self.host_workspace: str | None = None
        self.children: list[subprocess.Popen] = []

    # where commands see the workspace
    @property
    def workspace(self) -> str:  # type: ignore[override]
        return self.host_workspace or "/nonexistent"

    def _start(self) -> None:
        self.host_dir = tempfile.mkdtemp(prefix=f"rollart-{self.id}-", dir=self.root_dir)
        os.chmod(self.host_dir, 0o711)
        self.host_workspace = os.path.join(self.host_dir, "workspace")
        os.mkdir(self.host_workspace, 0o755)

    def _cleanup(self) -> None:
        for child in self.children:
            if child.poll() is None:
                _proc.kill_group(child)
                try:
                    child.wait(timeout=5)
                except subprocess.TimeoutExpired:
                    pass
        self.children.clear()
        if self.host_dir:
            shutil.rmtree(self.host_dir, ignore_errors=True)

    # -- how a command is wrapped (bwrap overrides) --------------------------------------------------------------
    def command_env(self, env: dict[str, str]) -> dict[str, str]:
        out = dict(BASE_ENV, PATH=host_path(), HOME=self.workspace, TMPDIR=self.workspace)
        out.update(env)
        return out

    def wrap(self, argv: list[str], *, cwd: str, cpu_seconds: float, extra_fds: Sequence[int] = ()) -> list[str]:
        return [*rlimit_argv(self.limits, cpu_seconds), *argv]

    def run_user(self) -> tuple[int | None, int | None]:
        return None, None

    def resolve_cwd(self, cwd: str | None) -> str:
        if cwd is None:
            return self.workspace
        return cwd if os.path.isabs(cwd) else os.path.join(self.workspace, cwd)

    def host_cwd(self, cwd: str) -> str | None:
        return cwd

    def _exec(
        self, argv: list[str], *, input: bytes | None, timeout: float | None, cwd: str | None, env: dict[str, str]
    ) -> ExecResult:
        call_timeout, timeout_cause = self.call_timeout(timeout)
        inner_cwd = self.resolve_cwd(cwd)
        status_r, status_w = os.pipe()
        try:
            wrapped = self.wrap(
                argv, cwd=inner_cwd, cpu_seconds=call_timeout * max(self.limits.cpu_limit, 1.0) + 1,
                extra_fds=(status_w,),
            )
            uid, gid = self.run_user()
            probe: dict[str, Any] = {}
            outcome = _proc.run(
                wrapped,
                input=input,
                timeout=call_timeout,
                env=self.command_env(env),
                cwd=self.host_cwd(inner_cwd),
                user=uid,
                group=gid,
                pass_fds=(status_w,) if self.uses_status_fd else (),
                on_timeout=lambda p: probe.update(self.timeout_probe(p)),
            )
        finally:
            os.close(status_w)
            status = _read_all(status_r)
        return self.interpret(argv, outcome, call_timeout, timeout_cause, status, probe)

    uses_status_fd = False

    def timeout_probe(self, proc: subprocess.Popen) -> dict[str, Any]:
        """Evidence gathered just before a timed-out command is killed (bwrap counts the sandbox's processes)."""
        return {}

    def interpret(
        self,
        argv: list[str],
        outcome: _proc.RunOutcome,
        timeout: float,
        timeout_cause: Any,
        status: bytes,
        probe: dict[str, Any],
    ) -> ExecResult:
        if outcome.timed_out:
            if probe.get("pids_exhausted") or classify_stderr(outcome.stderr) is FailureCause.PIDS:
                raise self._fail(
                    FailureCause.PIDS,
                    f"{argv[0]!r} hit the process limit ({self.limits.pids_limit}) and was killed after {timeout:.1f}s",
                    **probe,
                )
            what = "time budget" if timeout_cause is FailureCause.BUDGET else "step timeout"
            raise self._fail(timeout_cause, f"{argv[0]!r} ran past its {what} ({timeout:.1f}s) and was killed")
        rc = outcome.returncode
        sig = -rc if rc < 0 else (rc - 128 if rc in _SHELL_SIGNAL_CODES else 0)
        if sig:
            cause = classify_signal(sig)
            if cause is not None:
                raise self._fail(
                    cause,
                    f"{argv[0]!r} was killed by {signal_name(sig)}: "
                    f"{outcome.stderr[-300:].decode(errors='replace').strip()}",
                    signal=sig,
                )
        return ExecResult(
            argv=argv,
            exit_code=rc if rc >= 0 else 128 - rc,
            stdout=outcome.stdout,
            stderr=outcome.stderr,
            duration_s=outcome.duration_s,
            truncated=outcome.truncated,
        )

    def _after_exec(self) -> None:
        if self.host_workspace is None:
            return
        cap = self.limits.workspace_mib * 1024 * 1024
        used = dir_size(self.host_workspace, cap)
        if used > cap:
            raise self._fail(
                FailureCause.WORKSPACE, f"workspace holds more than its {self.limits.workspace_mib} MiB limit"
            )

    def _spawn(self, argv: list[str], *, env: dict[str, str]) -> Spawned:
        assert self.host_dir is not None
        log_path = os.path.join(self.host_dir, f"child-{len(self.children)}.log")
        # A long-lived host's CPU rlimit covers the whole budget.
        wrapped = self.wrap(
            argv, cwd=self.workspace, cpu_seconds=self.limits.time_budget_s * max(self.limits.cpu_limit, 1.0) + 5
        )
        uid, gid = self.run_user()

        def popen() -> subprocess.Popen:
            with open(log_path, "wb") as log:
                return subprocess.Popen(
                    wrapped,
                    stdin=subprocess.PIPE,
                    stdout=subprocess.PIPE,
                    stderr=log,
                    env=self.command_env(env),
                    cwd=self.host_cwd(self.workspace),
                    start_new_session=True,
                    user=uid,
                    group=gid,
                    extra_groups=[] if uid is not None else None,
                    close_fds=True,
                )

        # bwrap's --die-with-parent is a parent-death signal, and Linux delivers it when the *thread* that
        # forked the child exits: long-lived children are forked by one thread that lives as long as we do.
        proc = _spawner().submit(popen).result()
        self.children.append(proc)
        assert proc.stdin is not None and proc.stdout is not None
        return Spawned(pid=proc.pid, stdin=proc.stdin, stdout=proc.stdout, proc=proc, stderr_path=log_path)


_spawn_pool: ThreadPoolExecutor | None = None
_spawn_lock = threading.Lock()


def _spawner() -> ThreadPoolExecutor:
    global _spawn_pool
    with _spawn_lock:
        if _spawn_pool is None:
            _spawn_pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="rollart-spawner")
        return _spawn_pool


# Exit codes a shell (or bwrap) uses for "child killed by signal N": 128 + N, for the signals we classify.
_SHELL_SIGNAL_CODES = frozenset(128 + s for s in (4, 6, 7, 9, 11, 24, 25, 31))


def _read_all(fd: int) -> bytes:
    chunks = []
    try:
        os.set_blocking(fd, False)
        while True:
            try:
                chunk = os.read(fd, 65536)
            except BlockingIOError:
                break
            if not chunk:
                break
            chunks.append(chunk)
    finally:
        os.close(fd)
    return b"".join(chunks)
