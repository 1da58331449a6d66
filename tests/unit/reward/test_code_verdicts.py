"""How a sandbox run becomes a verdict (the real sandbox runs in tests/integration/reward)."""

from __future__ import annotations

import pytest

from rollart_reward.sandbox import SandboxRun, parse_report
from rollart_reward.scorers.base import FAILED, OK, TIMEOUT
from rollart_reward.scorers.code import extract_code, judge_run


def run(tests=(), exitstatus=0, exit_code=0, timed_out=False, tail=""):
    report = {
        "exitstatus": exitstatus,
        "tests": [dict(nodeid=f"t::{i}", when=w, outcome=o, message=m) for i, (w, o, m) in enumerate(tests)],
    }
    return SandboxRun(
        exit_code=exit_code, timed_out=timed_out, wall_seconds=0.1, output_tail=tail, report=report, budget=3.0
    )


def test_all_passed_and_some_failed():
    ok = judge_run(run([("call", "passed", ""), ("call", "passed", "")]))
    assert (ok.status, ok.reward, ok.components) == (OK, 1.0, {"passed": 2.0, "failed": 0.0})
    half = [("call", "passed", ""), ("call", "failed", "assert 1 == 2")]
    assert judge_run(run(half, exitstatus=1, exit_code=1)).reward == 0.0
    frac = judge_run(run(half, exitstatus=1, exit_code=1), mode="fraction")
    assert frac.reward == 0.5 and "assert 1 == 2" in frac.explanation


def test_collection_error_is_a_wrong_answer():
    v = judge_run(run([("collect", "failed", "SyntaxError: invalid syntax")], exitstatus=2, exit_code=2))
    assert v.status == OK and v.reward == 0.0 and "SyntaxError" in v.explanation


@pytest.mark.parametrize(
    "message, cause",
    [
        ("MemoryError", "memory_limit"),
        ("BlockingIOError: [Errno 11] Resource temporarily unavailable", "process_limit"),
        ("OSError: [Errno 101] Network is unreachable", "network_denied"),
        ("socket.gaierror: [Errno -3] Temporary failure in name resolution", "network_denied"),
        ("OSError: [Errno 30] Read-only file system: '/etc/x'", "write_denied"),
        ("PermissionError: [Errno 13] Permission denied: '/root/x'", "write_denied"),
    ],
)
def test_sandbox_violations_are_failures_with_their_cause(message, cause):
    v = judge_run(run([("call", "failed", message)], exitstatus=1, exit_code=1))
    assert (v.status, v.cause, v.retryable) == (FAILED, cause, False)
    assert message.split(":")[0] in v.error
    zero = judge_run(run([("call", "failed", message)], exitstatus=1, exit_code=1), on_violation="zero")
    assert (zero.status, zero.reward, zero.components[cause]) == (OK, 0.0, 1.0)


def test_timeouts_signals_and_missing_reports():
    t = judge_run(run(timed_out=True, exit_code=-9, exitstatus=None))
    assert (t.status, t.cause) == (TIMEOUT, "time_limit") and "3.0s" in t.error
    # A fork bomb killed at the budget: the cause seen in the partial report wins over a bare timeout.
    fork = judge_run(
        run(
            [("call", "failed", "BlockingIOError: [Errno 11] Resource temporarily unavailable")],
            timed_out=True,
            exit_code=-9,
            exitstatus=None,
        )
    )
    assert (fork.status, fork.cause) == (FAILED, "process_limit") and "time budget" in fork.error
    cpu = judge_run(run(exit_code=128 + 24, exitstatus=None))
    assert (cpu.status, cpu.cause) == (TIMEOUT, "cpu_limit")
    fsz = judge_run(run(exit_code=128 + 25, exitstatus=None))
    assert (fsz.status, fsz.cause) == (FAILED, "file_size_limit")
    none = judge_run(SandboxRun(exit_code=1, timed_out=False, wall_seconds=0.1, output_tail="boom", report=None))
    assert (none.status, none.cause, none.retryable) == (FAILED, "sandbox_error", True)
    no_tests = judge_run(run(exitstatus=5, exit_code=5))
    assert (no_tests.status, no_tests.cause) == (FAILED, "no_tests")


def test_report_parsing_and_code_extraction():
    rep = parse_report(
        '{"nodeid": "a", "when": "call", "outcome": "passed", "message": ""}\nnot json\n{"exitstatus": 0}\n'
    )
    assert rep == {"exitstatus": 0, "tests": [{"nodeid": "a", "when": "call", "outcome": "passed", "message": ""}]}
    assert parse_report('{"nodeid": "a", "when": "call", "outcome": "failed", "message": "x"}')["exitstatus"] is None
    assert extract_code("Here:\n```python\nx = 1\n```\nbetter:\n```py\nx = 2\n```") == "x = 2\n"
    assert extract_code("def f():\n    return 1\n") == "def f():\n    return 1\n"
