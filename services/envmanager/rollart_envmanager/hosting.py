"""Opening an environment on its sandbox backend (:func:`open_env`): the one entry point the loops use.

``hosted`` environments run in this process, in a child process speaking JSON lines, or in such a child inside
bubblewrap; ``command`` environments (code, SWE) run here and put untrusted commands in a sandbox. On top: the
turn limit, the injected latency and each episode's time budget. Invariant: environment code that raises becomes
``SandboxFailure(ENV_ERROR)``, a dead child, timeout or limit ``SandboxFailure`` with that cause; usage errors
(``ActionError``, ``EnvStateError``) pass through. docs/environments.md.
"""

from __future__ import annotations

import json
import os
import selectors
import sys
import time
from collections.abc import Callable
from typing import Any

from .envs.base import (
    ActionError,
    Env,
    EnvConfigError,
    EnvError,
    EnvStateError,
    EnvUnavailable,
    StepResult,
    UnknownEnvironment,
    check_action,
)
from .envs.info import COMMAND, EnvInfo
from .envs.registry import EnvRegistry, TaskConfig, default_registry
from .latency import LatencySampler
from .sandbox import IN_PROCESS, FailureCause, Sandbox, SandboxFailure, _proc, make_sandbox
from .sandbox.base import TimeBudget, classify_signal, classify_stderr, signal_name
from .sandbox.local import InProcessSandbox

_ERRORS: dict[str, type[Exception]] = {
    "ActionError": ActionError,
    "EnvStateError": EnvStateError,
    "EnvConfigError": EnvConfigError,
    "UnknownEnvironment": UnknownEnvironment,
    "EnvUnavailable": EnvUnavailable,
}
MAX_LINE = 64 * 1024 * 1024
STARTUP_TIMEOUT_S = 60.0  # importing an environment package in a fresh process (cold caches, 2 cores)


class _LocalHost:
    """The environment object in this process."""

    def __init__(self, env: Env, sandbox: InProcessSandbox | None) -> None:
        self.env = env
        self.sandbox = sandbox
        self.system_prompt = env.system_prompt

    def _call(self, fn: Any, *args: Any) -> Any:
        if self.sandbox is not None:
            self.sandbox.budget.check(IN_PROCESS)
        t0 = time.monotonic()
        try:
            result = fn(*args)
        except (EnvError, SandboxFailure):
            raise
        except Exception as exc:
            raise SandboxFailure(FailureCause.ENV_ERROR, f"{type(self.env).__name__}: {type(exc).__name__}: {exc}",
                                 backend=IN_PROCESS) from exc
        if self.sandbox is not None:
            self.sandbox.check_call_time(time.monotonic() - t0)
        return result

    def reset(self, seed: int | None) -> tuple[str, dict[str, str]]:
        if self.sandbox is not None:
            self.sandbox.budget = TimeBudget(self.sandbox.limits.time_budget_s)
            self.sandbox.budget.start()
        obs = self._call(self.env.reset, seed)
        return obs, dict(self.env.metadata)

    def step(self, action: str) -> StepResult:
        return self._call(self.env.step, action)

    def close(self) -> dict[str, Any]:
        try:
            return self.env.close()
        except (EnvError, SandboxFailure):
            raise
        except Exception as exc:
            raise SandboxFailure(FailureCause.ENV_ERROR, f"close failed: {exc}", backend=IN_PROCESS) from exc
        finally:
            if self.sandbox is not None:
                self.sandbox.close()

    @property
    def sandbox_id(self) -> str:
        env_sandbox = getattr(self.env, "sandbox", None)
        if env_sandbox is not None:
            return env_sandbox.id
        return self.sandbox.id if self.sandbox is not None else ""


class RemoteEnvHost:
    """The environment in a child process (process or bwrap sandbox), over JSON lines."""

    def __init__(self, new_sandbox: Callable[[], Sandbox], factory: str, kwargs: dict[str, Any], max_turns: int,
                 startup_timeout: float = STARTUP_TIMEOUT_S) -> None:
        self.new_sandbox = new_sandbox
        self.sandbox = new_sandbox()
        self.factory = factory
        self.kwargs = kwargs
        self.max_turns = max_turns
        self.startup_timeout = startup_timeout
        self.child: Any = None
        self.buffer = b""
        self.system_prompt = ""
        self.dead: SandboxFailure | None = None

    # -- lifecycle ---------------------------------------------------------------------------------------------
    def start(self) -> None:
        self.sandbox.start()
        # The child sees the modules this process sees (user environments in non-installed packages).
        path = os.pathsep.join(p for p in sys.path if p and os.path.isabs(p) and os.path.isdir(p))
        self.child = self.sandbox.spawn([self.sandbox.python, "-m", "rollart_envmanager.envhost"],
                                        env={"PYTHONPATH": path})
        self.buffer = b""
        self.dead = None
        made = self.call("make", timeout=self.startup_timeout, factory=self.factory, kwargs=self.kwargs,
                         max_turns=self.max_turns)
        self.system_prompt = made.get("system_prompt", "")

    @property
    def pid(self) -> int | None:
        return self.child.pid if self.child is not None else None

    def alive(self) -> bool:
        return self.child is not None and self.dead is None and self.child.proc.poll() is None

    def kill(self) -> None:
        if self.child is not None and self.child.proc.poll() is None:
            _proc.kill_group(self.child.proc)
            self.child.proc.wait()

    def close(self) -> dict[str, Any]:
        result: dict[str, Any] = {}
        try:
            if self.alive():
                result = self.call("close", timeout=min(10.0, max(self.sandbox.budget.remaining(), 1.0))) or {}
        finally:
            self.kill()
            self.sandbox.close()
        return result

    # -- protocol ----------------------------------------------------------------------------------------------
    def _stderr_tail(self, limit: int = 1500) -> str:
        path = self.child.stderr_path if self.child is not None else None
        if not path:
            return ""
        try:
            with open(path, "rb") as f:
                f.seek(0, os.SEEK_END)
                size = f.tell()
                f.seek(max(0, size - limit))
                return f.read().decode(errors="replace")
        except OSError:
            return ""

    def _died(self) -> SandboxFailure:
        proc = self.child.proc
        try:
            proc.wait(timeout=2)
        except Exception:
            _proc.kill_group(proc)
            proc.wait()
        rc = proc.returncode
        tail = self._stderr_tail()
        sig = -rc if rc < 0 else (rc - 128 if 128 < rc < 160 else 0)
        cause = (classify_signal(sig) if sig else None) or classify_stderr(tail.encode()) or FailureCause.CRASH
        how = f"killed by {signal_name(sig)}" if sig else f"exited with code {rc}"
        return SandboxFailure(cause, f"environment process (pid {proc.pid}) {how}: {tail.strip()[-600:]}",
                              backend=self.sandbox.backend, details={"exit_code": rc, "signal": sig})

    def call(self, op: str, *, timeout: float | None = None, **args: Any) -> Any:
        if self.dead is not None:
            raise SandboxFailure(FailureCause.CLOSED, f"environment process is gone: {self.dead.message}",
                                 backend=self.sandbox.backend)
        if self.child is None:
            raise SandboxFailure(FailureCause.CLOSED, "environment process not started", backend=self.sandbox.backend)
        self.sandbox.budget.check(self.sandbox.backend)
        step_timeout = self.sandbox.limits.step_timeout_s if timeout is None else timeout
        call_timeout, timeout_cause = self.sandbox.budget.timeout(step_timeout)
        try:
            self.child.stdin.write(json.dumps({"op": op, **args}).encode() + b"\n")
            self.child.stdin.flush()
        except (BrokenPipeError, OSError):
            self.dead = self._died()
            raise self.dead from None
        line = self._read_line(call_timeout, timeout_cause, op)
        try:
            resp = json.loads(line)
        except json.JSONDecodeError:
            self.kill()
            self.dead = SandboxFailure(FailureCause.PROTOCOL, f"unreadable reply to {op!r}: {line[:200]!r}",
                                       backend=self.sandbox.backend)
            raise self.dead from None
        if resp.get("ok"):
            return resp.get("result")
        kind, message = resp.get("type", ""), resp.get("message", "")
        if kind in _ERRORS:
            raise _ERRORS[kind](message)
        if kind == "MemoryError":
            raise SandboxFailure(FailureCause.MEMORY, f"environment {op!r} ran out of memory (limit "
                                 f"{self.sandbox.limits.memory_mib} MiB)", backend=self.sandbox.backend)
        if kind == "SandboxFailure" and resp.get("cause"):
            raise SandboxFailure(FailureCause(resp["cause"]), message, backend=self.sandbox.backend)
        raise SandboxFailure(FailureCause.ENV_ERROR, f"{op}: {kind}: {message}", backend=self.sandbox.backend,
                             details={"traceback": resp.get("traceback", "")})

    def _read_line(self, timeout: float, timeout_cause: FailureCause, op: str) -> bytes:
        fd = self.child.stdout.fileno()
        deadline = time.monotonic() + timeout
        with selectors.DefaultSelector() as sel:
            sel.register(fd, selectors.EVENT_READ)
            while b"\n" not in self.buffer:
                left = deadline - time.monotonic()
                if left <= 0:
                    self.kill()
                    what = "time budget" if timeout_cause is FailureCause.BUDGET else "step timeout"
                    self.dead = SandboxFailure(
                        timeout_cause, f"environment {op!r} ran past its {what} ({timeout:.1f}s); process killed",
                        backend=self.sandbox.backend,
                    )
                    raise self.dead
                if not sel.select(timeout=min(left, 0.5)):
                    continue
                chunk = os.read(fd, 1 << 16)
                if not chunk:
                    self.dead = self._died()
                    raise self.dead
                self.buffer += chunk
                if len(self.buffer) > MAX_LINE:
                    self.kill()
                    self.dead = SandboxFailure(FailureCause.PROTOCOL, "reply larger than 64 MiB",
                                               backend=self.sandbox.backend)
                    raise self.dead
        line, _, self.buffer = self.buffer.partition(b"\n")
        return line

    def reset(self, seed: int | None) -> tuple[str, dict[str, str]]:
        if not self.alive():
            # a fresh child after a crash or timeout (a new sandbox: the old one may be broken)
            self.kill()
            self.sandbox.close()
            self.sandbox = self.new_sandbox()
            self.start()
        self.sandbox.budget = TimeBudget(self.sandbox.limits.time_budget_s)
        self.sandbox.budget.start()
        result = self.call("reset", seed=seed)
        return result["observation"], dict(result.get("metadata") or {})

    def step(self, action: str) -> StepResult:
        return StepResult.from_dict(self.call("step", action=action))

    @property
    def sandbox_id(self) -> str:
        return self.sandbox.id


class HostedEnv:
    """An environment on its backend, with the turn limit, latency injection and budget of its task."""

    def __init__(self, info: EnvInfo, config: TaskConfig, backend: str, max_turns: int, host: Any,
                 latency: LatencySampler | None, apply_latency: bool) -> None:
        self.info = info
        self.config = config
        self.backend = backend
        self.max_turns = max_turns
        self.host = host
        self.latency = latency
        self.apply_latency = apply_latency
        self.metadata: dict[str, str] = {}
        self.turn = 0
        self.done = True
        self.episodes = 0
        self.closed = False

    @property
    def env_id(self) -> str:
        return self.info.id

    @property
    def system_prompt(self) -> str:
        return self.config.system_prompt or self.host.system_prompt

    @property
    def sandbox_id(self) -> str:
        return self.host.sandbox_id

    def reset(self, seed: int | None = None) -> str:
        if self.closed:
            raise EnvStateError("environment is closed")
        if seed is not None and (not isinstance(seed, int) or isinstance(seed, bool)):
            raise EnvConfigError(f"seed must be an integer, got {type(seed).__name__}")
        self.done = True
        obs, metadata = self.host.reset(seed)
        self.metadata = dict(metadata)
        self.turn = 0
        self.done = False
        self.episodes += 1
        return obs

    def step(self, action: str) -> StepResult:
        if self.closed:
            raise EnvStateError("environment is closed")
        if self.done:
            raise EnvStateError("step() after the episode ended (or before reset()); call reset()")
        check_action(action)
        result = self.host.step(action)
        self.turn += 1
        if not result.done and self.turn >= self.max_turns:
            result.done = True
            result.info["truncated"] = True
        self.done = result.done
        if self.latency is not None and self.apply_latency:
            result.info["injected_latency_s"] = self.latency.sleep()
        return result

    def sample_latency(self) -> float:
        """One latency draw, for async loops that sleep themselves (``apply_latency=False``)."""
        return self.latency.sample() if self.latency is not None else 0.0

    def close(self) -> dict[str, Any]:
        if self.closed:
            return {}
        self.closed = True
        return self.host.close() or {}

    def __enter__(self) -> HostedEnv:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def open_env(
    config: TaskConfig | str,
    *,
    registry: EnvRegistry | None = None,
    latency_stream: int | str = 0,
    apply_latency: bool = True,
    **options: Any,
) -> HostedEnv:
    """Builds an environment for a task configuration (or an id plus options) on its backend."""
    if isinstance(config, str):
        config = TaskConfig(environment=config, options=options)
    elif options:
        config = config.with_options(**options)
    reg = registry or default_registry()
    info, backend, max_turns = config.resolve(reg)
    ok, reason = info.availability()
    if not ok:
        raise EnvUnavailable(f"{info.id}: {reason}")
    kwargs = {**info.kwargs, **config.options}
    latency = config.latency.sampler(latency_stream) if config.latency.enabled else None

    if info.hosting == COMMAND:
        env = _construct(reg, info, {**kwargs, "sandbox_backend": backend, "sandbox_limits": config.limits,
                                     "sandbox_options": dict(config.sandbox_options),
                                     "sandbox_image": config.sandbox_image})
        env.max_turns = max_turns
        host: Any = _LocalHost(env, None)
    elif backend == IN_PROCESS:
        env = _construct(reg, info, kwargs)
        env.max_turns = max_turns
        host = _LocalHost(env, InProcessSandbox(config.limits).start())
    else:
        factory = reg._objects.get(info.id)
        if factory is not None and factory.__module__ == "__main__":
            raise EnvConfigError(f"{info.id} is defined in __main__ and can only run in-process")
        host = RemoteEnvHost(lambda: make_sandbox(backend, config.limits, options=config.sandbox_options),
                             info.factory, _plain(kwargs), max_turns)
        try:
            host.start()
        except BaseException:
            host.kill()
            host.sandbox.close()
            raise
    return HostedEnv(info, config, backend, max_turns, host, latency, apply_latency)


def _construct(reg: EnvRegistry, info: EnvInfo, kwargs: dict[str, Any]) -> Env:
    try:
        return reg.factory(info.id)(**kwargs)
    except EnvError:
        raise
    except (TypeError, ValueError) as exc:
        raise EnvConfigError(f"{info.id}: {exc}") from exc


def _plain(kwargs: dict[str, Any]) -> dict[str, Any]:
    try:
        json.dumps(kwargs)
    except TypeError as exc:
        raise EnvConfigError(f"options of a hosted environment must be JSON values: {exc}") from exc
    return kwargs



__all__ = ["HostedEnv", "RemoteEnvHost", "open_env"]
