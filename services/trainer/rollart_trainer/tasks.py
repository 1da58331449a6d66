"""Multi-task jobs (``TrainerJobSpec.tasks``): which task each group of a step comes from, and per-task figures.

Each step's ``groups_per_step`` groups are split between the tasks by share in whole groups (largest
remainder, ties by task tag: the ledger's ``policy.task_group_quotas``, which fills batches the same way) and
laid out interleaved (smooth weighted round robin), so the ledger's pool order (FIFO) mixes the tasks too.
Group ``i`` of the job is position ``i mod groups_per_step`` of step block ``i // groups_per_step``; its task
index is ``block * quota + rank`` (rank: earlier positions of the same task in the block), so a group's task,
seed and prompt id are a function of ``i`` alone: adding the same range again after a restart changes
nothing. A one-task job (``tasks`` empty) is the single source ``prompts`` with every group.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from rollart.v1 import ledger_pb2
from rollart.v1 import trainer_pb2 as T


def sources(spec: T.TrainerJobSpec) -> list[T.PromptSource]:
    """The job's prompt sources: ``tasks``, else ``prompts`` alone."""
    return list(spec.tasks) if len(spec.tasks) else [spec.prompts]


def tag(src: T.PromptSource) -> str:
    return src.task or src.environment


def shares(srcs: list[T.PromptSource]) -> dict[str, float]:
    """Normalised share by task tag (0 is the uniform share 1)."""
    raw = {tag(s): (s.share if s.share > 0 else 1.0) for s in srcs}
    total = sum(raw.values())
    return {t: x / total for t, x in raw.items()}


def quotas(groups: int, share: dict[str, float]) -> dict[str, int]:
    """Whole groups per task (largest remainder, ties by task tag)."""
    total = sum(share.values())
    exact = {t: groups * s / total for t, s in share.items()}
    out = {t: int(math.floor(x)) for t, x in exact.items()}
    for t in sorted(exact, key=lambda t: (-(exact[t] - out[t]), t))[: groups - sum(out.values())]:
        out[t] += 1
    return out


def layout(quota: dict[str, int]) -> list[str]:
    """One step's groups in pool order: each task ``quota[t]`` times, interleaved (smooth weighted round robin)."""
    total = sum(quota.values())
    credit = dict.fromkeys(quota, 0)
    out: list[str] = []
    for _ in range(total):
        for t in quota:
            credit[t] += quota[t]
        best = max(sorted(quota), key=lambda t: credit[t])
        credit[best] -= total
        out.append(best)
    return out


@dataclass(frozen=True)
class Plan:
    """Where group ``i`` of the job comes from."""

    sources: dict[str, T.PromptSource]
    quota: dict[str, int]
    order: list[str]

    @classmethod
    def of(cls, spec: T.TrainerJobSpec, groups_per_step: int) -> Plan:
        srcs = sources(spec)
        q = quotas(groups_per_step, shares(srcs))
        return cls({tag(s): s for s in srcs}, q, layout(q))

    def group(self, i: int) -> tuple[T.PromptSource, int]:
        """(its source, its index within that task) of the job's group ``i``."""
        block, pos = divmod(i, len(self.order))
        task = self.order[pos]
        rank = self.order[:pos].count(task)
        return self.sources[task], block * self.quota[task] + rank


def step_metrics(batch: ledger_pb2.Batch) -> dict[str, T.TaskStepMetrics]:
    """Per task of a batch: samples, groups, batch share, mean reward, mean turns, generated and prompt tokens."""
    out: dict[str, T.TaskStepMetrics] = {}
    rewards: dict[str, float] = {}
    turns: dict[str, int] = {}
    total = 0
    for g in batch.groups:
        seen: set[str] = set()
        for t in g.trajectories:
            m = out.setdefault(t.task, T.TaskStepMetrics())
            if t.task not in seen:
                m.groups += 1
                seen.add(t.task)
            m.samples += 1
            total += 1
            rewards[t.task] = rewards.get(t.task, 0.0) + t.reward
            turns[t.task] = turns.get(t.task, 0) + len(t.turns)
            m.tokens += sum(len(turn.action_token_ids) for turn in t.turns)
            m.prompt_tokens += len(t.prompt_token_ids) + sum(len(turn.observation_token_ids) for turn in t.turns)
    for task, m in out.items():
        m.reward_mean = rewards[task] / m.samples
        m.turns_mean = turns[task] / m.samples
        m.batch_share = m.samples / total
    return out


# ------------------------------------------------------------------------------------------ Prometheus

#: Distinct ``task`` label values the trainer exports; further tags are counted under ``other`` (the label
#: set stays bounded whatever a job file names).
MAX_TASK_LABELS = 32
_labels: set[str] = set()


def task_label(task: str) -> str:
    if task in _labels:
        return task
    if len(_labels) < MAX_TASK_LABELS and 0 < len(task) <= 128:
        _labels.add(task)
        return task
    return "other"


def export(per_task: dict[str, T.TaskStepMetrics]) -> None:
    """A step's per-task figures as Prometheus series with a bounded ``task`` label."""
    from prometheus_client import REGISTRY, Counter, Gauge

    global _metrics
    if _metrics is None:
        names = set(getattr(REGISTRY, "_names_to_collectors", {}))
        if "rollart_trainer_task_reward_mean" in names:  # module reloaded in one process (tests)
            return
        _metrics = (
            Gauge("rollart_trainer_task_reward_mean", "Mean reward of the task's samples in the last batch", ["task"]),
            Gauge("rollart_trainer_task_batch_share", "The task's fraction of the last batch's samples", ["task"]),
            Counter("rollart_trainer_task_samples_total", "Samples of the task trained on", ["task"]),
            Counter("rollart_trainer_task_tokens_total", "Generated tokens of the task trained on", ["task"]),
        )
    reward, share, samples, tokens = _metrics
    for task, m in per_task.items():
        label = task_label(task)
        reward.labels(label).set(m.reward_mean)
        share.labels(label).set(m.batch_share)
        samples.labels(label).inc(m.samples)
        tokens.labels(label).inc(m.tokens)


_metrics: tuple | None = None
