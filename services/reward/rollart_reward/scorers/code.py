"""Code tasks: the final answer's code is run against the task's pytest file in a bwrap sandbox.

Trajectory metadata: ``tests`` (the pytest file; it imports the candidate as ``solution`` unless the option
``module`` or the metadata ``solution_file`` says otherwise; ``test_file`` names the test file). The
candidate is the last fenced code block of the final action (or the whole action).

Breaking out of the sandbox's limits is reported with its cause, never as a plain zero: network access,
writes outside the workspace, the process limit (fork bombs), the memory limit and the file-size limit are
FAILED verdicts (not retryable: the same code does the same thing again), running past the time budget or the
CPU limit is TIMEOUT. Tests that simply fail give reward 0 (or the passed fraction).
"""

from __future__ import annotations

import re
import signal

from rollart.v1 import common_pb2

from ..sandbox import SandboxLimits, SandboxRun, SandboxUnavailable, run_pytest
from .base import FAILED, OK, TIMEOUT, InvalidRequest, Verdict, final_answer

OPTIONS = {
    "tests_field": "metadata key holding the pytest file (default 'tests')",
    "module": "module name the tests import the candidate from (default 'solution')",
    "reward": "'binary' (1 iff every test passes, default) or 'fraction' (passed / total)",
    "violations": "'fail' (sandbox violations are FAILED verdicts, default) or 'zero' (reward 0, cause in components)",
    "memory_mb": "address-space limit of the sandbox in MiB (default: the service's sandbox.memory_mb)",
}
_FENCE = re.compile(r"```[ \t]*(?:python3?|py)?[ \t]*\n(.*?)```", re.DOTALL | re.IGNORECASE)
_MODULE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,63}$")
_TEST_FILE = re.compile(r"^test_[A-Za-z0-9_]{1,60}\.py$")
# Margin between the sandbox's wall-clock budget and the worker's: the sandbox must report first.
SANDBOX_MARGIN_S = 0.3

# (cause, substrings of a failure message that reveal it, what to tell the user)
_VIOLATIONS = [
    ("memory_limit", ("MemoryError", "Cannot allocate memory", "[Errno 12]"), "hit the sandbox memory limit"),
    (
        "process_limit",
        ("BlockingIOError: [Errno 11]", "Resource temporarily unavailable", "can't start new thread"),
        "hit the sandbox process limit (fork bomb?)",
    ),
    (
        "network_denied",
        (
            "[Errno 101]",
            "Network is unreachable",
            "[Errno 111]",
            "[Errno 99]",
            "Temporary failure in name resolution",
            "Name or service not known",
            "gaierror",
        ),
        "tried to use the network, which the sandbox does not have",
    ),
    (
        "write_denied",
        ("[Errno 30]", "Read-only file system", "[Errno 13] Permission denied"),
        "tried to write outside its workspace",
    ),
    ("file_size_limit", ("[Errno 27]", "File too large"), "hit the sandbox file-size limit"),
]


def extract_code(action: str) -> str:
    blocks = _FENCE.findall(action)
    return blocks[-1] if blocks else action


def violation(run: SandboxRun) -> tuple[str, str] | None:
    """The first sandbox limit the run's failures reveal, as (cause, description with evidence)."""
    messages = [t["message"] for t in (run.report or {}).get("tests", []) if t.get("outcome") != "passed"]
    messages.append(run.output_tail)
    for cause, needles, what in _VIOLATIONS:
        for msg in messages:
            hit = next((n for n in needles if n in msg), None)
            if hit is not None:
                line = next((ln for ln in msg.splitlines() if hit in ln), hit).strip()
                return cause, f"the code {what}: {line[:200]}"
    return None


def score(traj: common_pb2.Trajectory, options: dict[str, str], budget: float, limits: SandboxLimits) -> Verdict:
    tests = traj.metadata.get(options.get("tests_field") or "tests", "")
    if not tests.strip():
        raise InvalidRequest("trajectory metadata has no pytest file under 'tests'")
    # The EnvManager's code tasks record their file names (solution_file, test_file) in the metadata.
    solution_file = traj.metadata.get("solution_file", "")
    module = options.get("module") or (solution_file[:-3] if solution_file.endswith(".py") else "") or "solution"
    if not _MODULE.match(module):
        raise InvalidRequest(f"the candidate module must be a Python identifier, got {module!r}")
    test_file = traj.metadata.get("test_file") or "test_solution.py"
    if not _TEST_FILE.match(test_file) or test_file == f"{module}.py":
        raise InvalidRequest(f"metadata test_file must be a test_*.py file name, got {test_file!r}")
    mode = options.get("reward", "binary")
    if mode not in ("binary", "fraction"):
        raise InvalidRequest(f"option reward must be 'binary' or 'fraction', got {mode!r}")
    on_violation = options.get("violations", "fail")
    if on_violation not in ("fail", "zero"):
        raise InvalidRequest(f"option violations must be 'fail' or 'zero', got {on_violation!r}")
    if "memory_mb" in options:
        try:
            limits = SandboxLimits(**{**limits.__dict__, "memory_mb": max(64, min(int(options["memory_mb"]), 65536))})
        except ValueError:
            raise InvalidRequest(f"option memory_mb must be an integer, got {options['memory_mb']!r}") from None
    code = extract_code(final_answer(traj))
    sandbox_budget = max(0.5, budget - SANDBOX_MARGIN_S)
    try:
        run = run_pytest(code, tests, limits, sandbox_budget, module=module, test_file=test_file)
    except SandboxUnavailable as exc:
        return Verdict(status=FAILED, error=str(exc), cause="sandbox_unavailable", retryable=True)
    except OSError as exc:
        return Verdict(status=FAILED, error=f"sandbox could not start: {exc}", cause="sandbox_error", retryable=True)
    return judge_run(run, mode, on_violation)


def judge_run(run: SandboxRun, mode: str = "binary", on_violation: str = "fail") -> Verdict:
    """Turn a sandbox run into a verdict (see the module docstring)."""
    tests = [t for t in (run.report or {}).get("tests", []) if t.get("when") in ("call", "setup", "collect")]
    passed = sum(1 for t in tests if t["outcome"] == "passed" and t["when"] == "call")
    failed = sum(1 for t in tests if t["outcome"] == "failed")
    total = passed + failed
    counts = {"passed": float(passed), "failed": float(failed)}
    tail = run.output_tail[-1500:]
    found = violation(run)
    if found is None and run.max_processes and run.peak_processes >= run.max_processes - 1:
        found = (
            "process_limit",
            f"the code hit the sandbox process limit (fork bomb?): {run.peak_processes} of "
            f"{run.max_processes} processes",
        )
    if found is not None:
        cause, why = found
        if run.timed_out:
            why += f" (and was killed at its {run.budget:.1f}s time budget)"
        if on_violation == "zero":
            return Verdict(status=OK, reward=0.0, components={**counts, cause: 1.0}, explanation=why, cause=cause)
        return Verdict(status=FAILED, error=why, cause=cause, explanation=tail, components=counts)
    if run.timed_out:
        return Verdict(
            status=TIMEOUT,
            error=f"the code ran past its {run.budget:.1f}s time budget and was killed",
            cause="time_limit",
            explanation=tail,
            components=counts,
        )
    sig = run.signal
    if sig == signal.SIGXCPU:
        return Verdict(
            status=TIMEOUT, error="the code ran past its CPU-time limit", cause="cpu_limit", explanation=tail
        )
    if sig == signal.SIGXFSZ:
        return Verdict(status=FAILED, error="the code hit the sandbox file-size limit", cause="file_size_limit")
    if sig is not None:
        try:
            name = signal.Signals(sig).name
        except ValueError:
            name = f"signal {sig}"
        hint = " (out of memory?)" if sig == signal.SIGKILL else ""
        return Verdict(
            status=FAILED, error=f"the test run was killed by {name}{hint}", cause="crashed", explanation=tail
        )
    exitstatus = (run.report or {}).get("exitstatus")
    if exitstatus is None:
        return Verdict(
            status=FAILED,
            error=f"the test run ended (exit code {run.exit_code}) without a pytest report",
            cause="sandbox_error",
            explanation=tail,
            retryable=True,
        )
    if exitstatus == 5:
        return Verdict(status=FAILED, error="the task's test file collected no tests", cause="no_tests")
    if exitstatus in (3, 4):
        return Verdict(status=FAILED, error=f"pytest failed (exit status {exitstatus})", cause="sandbox_error")
    if exitstatus == 2 and total == 0:
        # Interrupted without a collection error we saw: treat like a collection failure of the candidate.
        failed = 1
    if mode == "fraction":
        reward = passed / max(total, 1)
    else:
        reward = 1.0 if exitstatus == 0 and passed > 0 and failed == 0 else 0.0
    first = next((t for t in tests if t["outcome"] == "failed"), None)
    explanation = f"{passed} passed, {failed} failed"
    if first is not None:
        explanation += f"; first failure ({first['nodeid'] or first['when']}): {first['message'][-300:]}"
    return Verdict(status=OK, reward=reward, components=counts, explanation=explanation)
