"""The progress of ``rollart run``: a one-line bar on a terminal (step, reward, tokens/s, staleness, wasted tokens,
each actor's version, per-task rewards), one line per step otherwise."""

from __future__ import annotations

import time
from typing import TextIO

from rollart.v1 import trainer_pb2

T = trainer_pb2


class Progress:
    """A one-line progress bar on a terminal, one line per step otherwise."""

    def __init__(self, total: int, stream: TextIO, quiet: bool = False) -> None:
        self.total = total
        self.stream = stream
        self.tty = stream.isatty()
        self.quiet = quiet
        self.t0 = time.monotonic()
        self.rewards: list[float] = []
        self.task_rewards: dict[str, list[float]] = {}  # multi-task jobs: each task's batch reward by step
        self.phase = ""
        self.last = ""
        self.validation = ""  # the last validation score of each task (rollart.job.evaluation.progress_text)

    def _bar(self, done: int, width: int = 24) -> str:
        if not self.total:
            return f"{done} steps"
        filled = int(width * min(done, self.total) / self.total)
        return "[" + "#" * filled + "." * (width - filled) + f"] {done}/{self.total}"

    def step(self, m: T.StepMetrics) -> None:
        self.rewards.append(m.reward_mean)
        recent = self.rewards[-10:]
        versions = " ".join(f"{a.split('-')[-1]}:v{v}" for a, v in sorted(m.actor_versions.items()))
        elapsed = time.monotonic() - self.t0
        self.last = (
            f"{self._bar(m.step)} reward {m.reward_mean:.3f} (avg10 {sum(recent) / len(recent):.3f})"
            f" | {m.rollout_tokens_per_s:6.0f} tok/s | stale {m.staleness_mean:.2f}/{m.staleness_max}"
            f" | wasted {m.accounting.wasted_token_fraction:4.0%} ({m.accounting_total.wasted_token_fraction:.0%} all)"
            f" | step {m.step_time.ToNanoseconds() / 1e9:5.1f}s | actors {versions or '-'} | {elapsed:4.0f}s"
        )
        if m.tasks:
            parts = []
            for task in sorted(m.tasks):
                rs = self.task_rewards.setdefault(task, [])
                rs.append(m.tasks[task].reward_mean)
                parts.append(f"{task} {rs[-1]:.3f} (avg10 {sum(rs[-10:]) / len(rs[-10:]):.3f})")
            self.last += " | tasks: " + ", ".join(parts)
        self.last += self.validation
        self._show(final=not self.tty)

    def note(self, text: str) -> None:
        if self.tty and self.last:
            self.stream.write("\r\x1b[2K")
        self.stream.write(text + "\n")
        if self.tty and self.last:
            self.stream.write(self.last)
        self.stream.flush()

    def _show(self, final: bool = False) -> None:
        if self.quiet:
            return
        if self.tty:
            self.stream.write("\r\x1b[2K" + self.last)
        elif final:
            self.stream.write(self.last + "\n")
        self.stream.flush()

    def close(self) -> None:
        if self.tty and self.last and not self.quiet:
            self.stream.write("\n")
            self.stream.flush()
