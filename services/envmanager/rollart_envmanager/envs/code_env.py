"""Code tasks: the answer is a Python function, checked by its pytest file inside a sandbox.

Each episode writes ``solution.py`` (the code from the action's last fenced ``python`` block, or the whole
action) and the task's ``test_solution.py`` into a fresh sandbox and runs pytest there under an inner time
limit (per test via pytest-timeout, for the whole run via timeout(1)). Tests that fail, error or hang are
the answer's fault: reward 0 (and, with ``max_turns`` > 1, the failure output as the next observation for
another attempt). A
sandbox that crashes or overruns its own limits raises ``SandboxFailure``: never a reward.

The metadata carries the task id, entry point and test source so that the reward service can re-check the
final answer on its own.
"""

from __future__ import annotations

import re
from typing import Any

from .base import EnvConfigError, StepResult
from .code_tasks import BY_ID, TASKS, CodeTask
from .command import PYTEST_ENV, CommandEnv, judge_pytest, pytest_argv
from .options import opt_float, opt_str

SYSTEM_PROMPT = "You are an expert Python programmer. Reply with the complete solution in one ```python block."
OPTIONS = {
    "task": f"task id ({', '.join(t.id for t in TASKS)}); default: chosen by the reset seed",
    "test_timeout_s": "per-test time limit in seconds (default 5)",
    "run_timeout_s": "time limit of the whole pytest run in seconds (default 30, within the step timeout)",
}
_FENCE = re.compile(r"```(?:python|py)?[ \t]*\n(.*?)```", re.DOTALL)


def extract_code(action: str) -> str:
    blocks = _FENCE.findall(action)
    return blocks[-1] if blocks else action


class CodeEnv(CommandEnv):
    system_prompt = SYSTEM_PROMPT
    default_max_turns = 1

    def __init__(self, **options: Any) -> None:
        super().__init__(**options)
        self.fixed_task = opt_str(self.options, "task", "")
        if self.fixed_task and self.fixed_task not in BY_ID:
            raise EnvConfigError(f"unknown code task {self.fixed_task!r} (one of {', '.join(BY_ID)})")
        self.test_timeout = opt_float(self.options, "test_timeout_s", 5.0)
        self.run_timeout = opt_float(self.options, "run_timeout_s", 30.0)
        self.task: CodeTask | None = None

    def _reset(self, seed: int | None) -> str:
        self.task = BY_ID[self.fixed_task] if self.fixed_task else TASKS[(seed or 0) % len(TASKS)]
        self.new_sandbox()
        self.metadata = {
            "task_id": self.task.id,
            "entry_point": self.task.entry_point,
            "tests": self.task.tests,
            "language": "python",
            "solution_file": "solution.py",
            "test_file": "test_solution.py",
        }
        return (
            f"{self.task.prompt}\n\nReply with the complete function (and any imports it needs) in a single "
            "```python code block. It will be saved as solution.py and tested with pytest."
        )

    def _step(self, action: str) -> StepResult:
        assert self.task is not None and self.sandbox is not None
        code = extract_code(action)
        self.sandbox.write_files({"solution.py": code, "test_solution.py": self.task.tests})
        limit = self.harness_seconds(self.run_timeout)
        argv = pytest_argv(self.sandbox.python, limit, self.test_timeout, ["test_solution.py"])
        # pytest's verdict decides (classify=False): the answer's own MemoryError is a failed test, not a failure
        result = self.sandbox.exec(argv, env={"PYTHONPATH": self.sandbox.workspace, **PYTEST_ENV}, classify=False)
        passed, timed_out, counts = judge_pytest(result, f"code task {self.task.id}", self.sandbox.backend)
        info = {"task_id": self.task.id, "passed": passed, "exit_code": result.exit_code, "tests": counts,
                "harness_timeout": timed_out, "output": result.text(2000)}
        done = passed or self.turn >= self.max_turns
        if passed:
            feedback = "All tests passed."
        elif timed_out:
            feedback = f"The tests did not finish within {limit}s."
        else:
            feedback = "Some tests failed:\n" + result.text(3000)
        return StepResult(observation=feedback, reward=1.0 if passed else 0.0, done=done, info=info)
