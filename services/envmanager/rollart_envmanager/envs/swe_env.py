"""Software-engineering tasks, SWE-bench style: fix a bug in a small repository inside a container.

``reset`` creates the sandbox (a Docker container by default) and copies the repository into
``/workspace/repo``; the observation is the issue. Each turn the agent sends one action, as a fenced block:

    ```bash                      a shell command, run in the repository (output and exit code come back)
    pytest -q tests
    ```

    ```write path/to/file.py     replace a whole file
    <content>
    ```

    ```edit path/to/file.py      search/replace edits; each SEARCH text must occur exactly once
    <<<<<<< SEARCH
    old lines
    =======
    new lines
    >>>>>>> REPLACE
    ```

    ```submit                    (or a line SUBMIT) evaluate and end the episode
    ```

Evaluation copies the task's hidden tests into the repository (over any edits of them) and runs the whole
test suite: reward 1.0 when every test passes, else 0.0. Reaching the turn limit evaluates too. An action
without a recognised block is an invalid action (it costs a turn, the repository is unchanged).
The repositories are made by the project and ship in ``envs/data/swe/<id>/`` (``repo/``, ``hidden/``,
``task.json``).
"""

from __future__ import annotations

import json
import posixpath
import re
from dataclasses import dataclass
from importlib import resources
from typing import Any

from ..sandbox.base import safe_relpath
from .base import EnvConfigError, StepResult
from .command import HARNESS_TIMEOUT_CODES, PYTEST_ENV, CommandEnv, judge_pytest, pytest_argv
from .options import opt_float, opt_str

SYSTEM_PROMPT = (
    "You are a software engineer fixing an issue in a repository. Each reply must contain exactly one action "
    "as a fenced block: ```bash (a command), ```write PATH (a whole file), ```edit PATH (SEARCH/REPLACE "
    "blocks) or ```submit when you are done."
)
OPTIONS = {
    "repo": "repository id (default: chosen by the reset seed)",
    "test_timeout_s": "per-test time limit of the evaluation (default 10)",
    "output_chars": "characters of command output shown per turn (default 4000)",
    "command_timeout_s": "time limit of one shell action (default 30, within the step timeout)",
}
_BLOCK = re.compile(r"^```[ \t]*([A-Za-z]+)[ \t]*([^\n`]*)\n(.*?)^```[ \t]*$", re.DOTALL | re.MULTILINE)
_EMPTY_BLOCK = re.compile(r"^```[ \t]*submit[ \t]*```?", re.MULTILINE | re.IGNORECASE)
_SUBMIT_LINE = re.compile(r"^\s*SUBMIT\s*$", re.MULTILINE)
_EDIT = re.compile(r"<<<<<<< SEARCH\n(.*?)\n?=======\n(.*?)\n?>>>>>>> REPLACE", re.DOTALL)


@dataclass(frozen=True)
class Action:
    kind: str  # bash | write | edit | submit | invalid
    path: str = ""
    body: str = ""
    error: str = ""


def parse_action(text: str) -> Action:
    m = _BLOCK.search(text)
    if m:
        kind, arg, body = m.group(1).lower(), m.group(2).strip(), m.group(3)
        if kind in ("bash", "sh", "shell"):
            return Action("bash", body=body) if body.strip() else Action("invalid", error="empty command")
        if kind in ("write", "edit"):
            if not arg:
                return Action("invalid", error=f"```{kind} needs a path: ```{kind} path/to/file")
            try:
                path = safe_relpath(arg)
            except ValueError as exc:
                return Action("invalid", error=str(exc))
            return Action(kind, path=path, body=body)
        if kind == "submit":
            return Action("submit")
        return Action("invalid", error=f"unknown action block ```{kind}")
    if _EMPTY_BLOCK.search(text) or _SUBMIT_LINE.search(text):
        return Action("submit")
    return Action("invalid", error="no action block found")


def apply_edits(content: str, body: str) -> tuple[str, str]:
    """(new content, error); error is empty when every SEARCH block matched exactly once."""
    edits = _EDIT.findall(body)
    if not edits:
        return content, "no <<<<<<< SEARCH / ======= / >>>>>>> REPLACE block found"
    for search, replace in edits:
        count = content.count(search) if search else 0
        if count != 1:
            return content, f"SEARCH text found {count} times (it must occur exactly once):\n{search[:300]}"
        content = content.replace(search, replace, 1)
    return content, ""


@dataclass(frozen=True)
class SweTask:
    id: str
    title: str
    issue: str
    files: dict[str, str]
    hidden: dict[str, str]
    test_paths: tuple[str, ...]


def _read_tree(root: Any, prefix: str = "") -> dict[str, str]:
    out: dict[str, str] = {}
    for entry in root.iterdir():
        name = posixpath.join(prefix, entry.name) if prefix else entry.name
        if entry.is_dir():
            if entry.name != "__pycache__":
                out.update(_read_tree(entry, name))
        else:
            out[name] = entry.read_text()
    return out


def load_tasks() -> dict[str, SweTask]:
    base = resources.files(__package__).joinpath("data", "swe")
    tasks = {}
    for d in sorted(base.iterdir(), key=lambda p: p.name):
        if not d.is_dir() or not d.joinpath("task.json").is_file():
            continue
        meta = json.loads(d.joinpath("task.json").read_text())
        tasks[meta["id"]] = SweTask(
            id=meta["id"],
            title=meta["title"],
            issue=meta["issue"],
            files=_read_tree(d.joinpath("repo")),
            hidden=_read_tree(d.joinpath("hidden")),
            test_paths=tuple(meta.get("test_paths", ["tests"])),
        )
    return tasks


_TASKS: dict[str, SweTask] | None = None


def tasks() -> dict[str, SweTask]:
    global _TASKS
    if _TASKS is None:
        _TASKS = load_tasks()
    return _TASKS


class SweEnv(CommandEnv):
    system_prompt = SYSTEM_PROMPT
    default_max_turns = 20
    repo_dir = "repo"

    def __init__(self, **options: Any) -> None:
        options.setdefault("sandbox_backend", "docker")
        super().__init__(**options)
        self.fixed_repo = opt_str(self.options, "repo", "")
        if self.fixed_repo and self.fixed_repo not in tasks():
            raise EnvConfigError(f"unknown SWE repository {self.fixed_repo!r} (one of {', '.join(tasks())})")
        self.test_timeout = opt_float(self.options, "test_timeout_s", 10.0)
        self.output_chars = int(opt_float(self.options, "output_chars", 4000))
        self.command_timeout = opt_float(self.options, "command_timeout_s", 30.0)
        self.task: SweTask | None = None

    @property
    def repo_path(self) -> str:
        assert self.sandbox is not None
        return posixpath.join(self.sandbox.workspace, self.repo_dir)

    def _reset(self, seed: int | None) -> str:
        all_tasks = tasks()
        ids = sorted(all_tasks)
        self.task = all_tasks[self.fixed_repo] if self.fixed_repo else all_tasks[ids[(seed or 0) % len(ids)]]
        sandbox = self.new_sandbox()
        sandbox.write_files({posixpath.join(self.repo_dir, p): c for p, c in self.task.files.items()})
        listing = "\n".join(sorted(self.task.files))
        self.metadata = {"repo": self.task.id, "title": self.task.title, "source": "swe"}
        return (
            f"Issue: {self.task.title}\n\n{self.task.issue}\n\n"
            f"The repository is checked out in {self.repo_path} (your commands run there). Files:\n{listing}\n\n"
            "Fix the issue, then submit. Actions: ```bash, ```write PATH, ```edit PATH, ```submit."
        )

    def _run(self, argv: list[str]) -> Any:
        assert self.sandbox is not None
        # The agent's own output is shown to it, not judged: only signals, timeouts and sandbox limits fail.
        return self.sandbox.exec(argv, cwd=self.repo_path, env={"PYTHONPATH": self.repo_path, **PYTEST_ENV},
                                 classify=False)

    def _step(self, action: str) -> StepResult:
        assert self.sandbox is not None and self.task is not None
        act = parse_action(action)
        last_turn = self.turn >= self.max_turns
        info: dict[str, Any] = {"action": act.kind, "invalid_action": act.kind == "invalid"}
        if act.kind == "submit":
            return self._evaluate(info)
        if act.kind == "invalid":
            obs = f"Invalid action: {act.error}. Use one ```bash, ```write PATH, ```edit PATH or ```submit block."
        elif act.kind == "bash":
            # An inner limit: a command that runs too long is the agent's problem, shown to it as a timeout.
            limit = self.harness_seconds(self.command_timeout)
            result = self._run(["timeout", str(limit), "sh", "-c", act.body])
            note = f" (timed out after {limit}s)" if result.exit_code in HARNESS_TIMEOUT_CODES else ""
            obs = f"exit code {result.exit_code}{note}\n{result.text(self.output_chars)}"
            info["exit_code"] = result.exit_code
        elif act.kind == "write":
            self.sandbox.write_files({posixpath.join(self.repo_dir, act.path): act.body})
            obs = f"Wrote {act.path} ({len(act.body)} characters)."
        else:  # edit
            try:
                current = self.sandbox.read_file(posixpath.join(self.repo_dir, act.path)).decode(errors="replace")
            except FileNotFoundError:
                current = None
            if current is None:
                obs = f"Cannot edit {act.path}: no such file."
                info["invalid_action"] = True
            else:
                new, error = apply_edits(current, act.body)
                if error:
                    obs = f"Edit of {act.path} not applied: {error}"
                    info["invalid_action"] = True
                else:
                    self.sandbox.write_files({posixpath.join(self.repo_dir, act.path): new})
                    obs = f"Edited {act.path}."
        if last_turn:
            info["auto_submitted"] = True
            return self._evaluate(info, prefix=obs + "\n\nTurn limit reached: evaluating.\n")
        return StepResult(observation=obs, reward=0.0, done=False, info=info)

    def _evaluate(self, info: dict[str, Any], prefix: str = "") -> StepResult:
        assert self.sandbox is not None and self.task is not None
        self.sandbox.write_files({posixpath.join(self.repo_dir, p): c for p, c in self.task.hidden.items()})
        limit = self.harness_seconds(self.sandbox_limits.step_timeout_s)
        argv = pytest_argv(self.sandbox.python, limit, self.test_timeout, list(self.task.test_paths))
        result = self._run(argv)
        passed, timed_out, counts = judge_pytest(result, f"evaluation of {self.task.id}", self.sandbox.backend)
        info.update(resolved=passed, exit_code=result.exit_code, tests=counts, harness_timeout=timed_out)
        verdict = "All tests pass: the issue is resolved." if passed else "Tests fail:\n" + result.text(3000)
        return StepResult(observation=prefix + verdict, reward=1.0 if passed else 0.0, done=True, info=info)


def repo_ids() -> list[str]:
    return sorted(tasks())

