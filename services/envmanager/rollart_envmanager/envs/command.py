"""Environments that run untrusted commands (tests of generated code, an agent's shell actions) in a sandbox.

The environment object itself runs in the envmanager; each episode gets a fresh sandbox of the configured
backend (bwrap, Docker, Kubernetes; ``process`` for trusted local testing), created by ``reset`` and closed
by the next ``reset`` or ``close``. Sandbox failures propagate as ``SandboxFailure``.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from ..sandbox import ExecResult, FailureCause, Sandbox, SandboxFailure, SandboxLimits, make_sandbox
from .base import Env

# pytest inside a sandbox: no plugin autoloading (the host's venv may carry many), just the per-test timeout.
PYTEST_ENV = {"PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1"}


def pytest_argv(python: str, run_limit_s: int, test_timeout_s: float, paths: list[str]) -> list[str]:
    return ["timeout", str(run_limit_s), python, "-m", "pytest", "-q", "-p", "pytest_timeout", "-p",
            "no:cacheprovider", f"--timeout={test_timeout_s:g}", *paths]


# Exit codes of timeout(1) (coreutils: 124; busybox: 128+SIGTERM) for a harness that ran out of time.
HARNESS_TIMEOUT_CODES = (124, 143)


class CommandEnv(Env):
    def __init__(
        self,
        *,
        sandbox_backend: str = "bwrap",
        sandbox_limits: SandboxLimits | None = None,
        sandbox_options: Mapping[str, str] | None = None,
        sandbox_image: str = "",
        **options: Any,
    ) -> None:
        super().__init__(**options)
        self.sandbox_backend = sandbox_backend
        self.sandbox_limits = sandbox_limits or SandboxLimits()
        self.sandbox_options = dict(sandbox_options or {})
        self.sandbox_image = sandbox_image
        self.sandbox: Sandbox | None = None

    def new_sandbox(self) -> Sandbox:
        """Closes the previous episode's sandbox and starts a fresh one."""
        self.close_sandbox()
        opts = dict(self.sandbox_options)
        if self.sandbox_image:
            opts["image"] = self.sandbox_image
        sandbox = make_sandbox(self.sandbox_backend, self.sandbox_limits, options=opts)
        self.sandbox = sandbox.start()
        return sandbox

    def close_sandbox(self) -> None:
        if self.sandbox is not None:
            self.sandbox.close()
            self.sandbox = None

    def _close(self) -> dict[str, Any] | None:
        self.close_sandbox()
        return None

    def harness_seconds(self, wanted: float) -> int:
        """Time for an inner harness: leaves the sandbox's own step timeout as the outer bound."""
        outer = self.sandbox_limits.step_timeout_s
        return max(1, int(min(wanted, outer - 2 if outer > 4 else outer * 0.7)))


_SUMMARY = re.compile(rb"(\d+) (passed|failed|error|errors)")


def pytest_counts(output: bytes) -> dict[str, int]:
    counts = {"passed": 0, "failed": 0, "errors": 0}
    for n, kind in _SUMMARY.findall(output[-4000:]):
        key = kind.decode()
        key = "errors" if key.startswith("error") else key
        counts[key] = int(n)
    return counts


def judge_pytest(result: ExecResult, what: str, backend: str) -> tuple[bool, bool, dict[str, int]]:
    """(passed, timed_out, counts) of a pytest run under timeout(1).

    Passing needs exit 0 *and* a summary with at least one passed test and no failure or error: code under
    test can end the process early (``os._exit(0)`` at import) and must not pass that way. Every other
    outcome, including pytest's own error exits (the answer can provoke them: SystemExit at import, no tests
    left), is a failed answer. Only a harness that cannot start at all (126/127) is an environment error.
    """
    if result.exit_code in (126, 127):
        raise SandboxFailure(
            FailureCause.ENV_ERROR, f"{what}: the test harness cannot run (exit {result.exit_code}): "
            f"{result.text(400)}", backend=backend,
        )
    counts = pytest_counts(result.stdout + result.stderr)
    timed_out = result.exit_code in HARNESS_TIMEOUT_CODES
    passed = result.exit_code == 0 and counts["passed"] > 0 and counts["failed"] == 0 and counts["errors"] == 0
    return passed, timed_out, counts
