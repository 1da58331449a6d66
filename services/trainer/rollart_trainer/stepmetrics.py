"""A step's metrics: the training statistics and batch shape, and the ledger's counters (settlements,
generation accounting) as the difference over the step. Format and fields: docs/trainer.md, "Metrics"."""

from __future__ import annotations

import contextlib
import math
from typing import Any

from grpc import aio

from rollart.job.metrics import accounting_delta, wasted_fraction
from rollart.v1 import ledger_pb2, ledger_pb2_grpc, trainer_pb2

from . import tasks
from .train_stats import response_lengths

T = trainer_pb2


def fill(
    m: T.StepMetrics,
    stats: Any,
    batch: ledger_pb2.Batch,
    multitask: bool,
    *,
    max_tokens: int = 0,
    max_seq_len: int = 0,
) -> None:
    """The training statistics ``stats`` (grpo.StepStats) and the batch's shape into ``m``. ``max_tokens``
    (the job's sampling limit per request) and ``max_seq_len`` (the trainer's) define a clipped response."""
    m.samples = stats.samples
    m.groups = stats.groups
    m.reward_mean, m.reward_std = stats.reward_mean, stats.reward_std
    m.reward_min, m.reward_max = stats.reward_min, stats.reward_max
    m.loss, m.pg_loss, m.kl = stats.loss, stats.pg_loss, stats.kl
    m.entropy, m.clip_fraction = stats.entropy, stats.clip_fraction
    m.grad_norm = stats.grad_norm if math.isfinite(stats.grad_norm) else -1.0
    m.learning_rate = stats.learning_rate
    m.tokens_trained = stats.tokens_trained
    m.response_length_mean = stats.response_length_mean
    m.staleness_mean, m.staleness_max = stats.staleness_mean, stats.staleness_max
    m.extra["zero_advantage_groups"] = float(stats.zero_advantage_groups)
    m.extra["behaviour_kl"] = float(stats.behaviour_kl)
    m.extra["ratio_mean"] = float(stats.ratio_mean)
    for name in getattr(stats, "OBJECTIVE_METRICS", ()):  # off-policy figures (docs/objective.md)
        m.extra[name] = float(getattr(stats, name))
    m.extra["train_tokens_per_s"] = float(stats.tokens_per_second)
    m.extra["batch_min_version"] = float(batch.min_version)
    m.extra["batch_max_version"] = float(batch.max_version)
    m.extra["evicted"] = float(batch.evicted)
    # dynamic sampling: zero-variance groups the ledger consumed for this batch (never trained)
    m.extra["filtered_groups"] = float(batch.filtered_groups)
    m.extra["filtered_samples"] = float(batch.filtered_samples)
    m.extra["filtered_tokens"] = float(batch.filtered_tokens)
    m.extra.update(response_lengths((t for g in batch.groups for t in g.trajectories), max_tokens, max_seq_len))
    turns = [len(t.turns) for g in batch.groups for t in g.trajectories]
    m.extra["turns_mean"] = sum(turns) / len(turns) if turns else 0.0
    if multitask:
        per_task = tasks.step_metrics(batch)
        for task, tm in per_task.items():
            m.tasks[task].CopyFrom(tm)
        tasks.export(per_task)
    # When the batch's trajectories ran (the rollout lane of rollart run's timeline.png).
    trajs = [t for g in batch.groups for t in g.trajectories]
    starts = [t.started_at.ToNanoseconds() / 1e9 for t in trajs if t.started_at.seconds]
    ends = [t.finished_at.ToNanoseconds() / 1e9 for t in trajs if t.finished_at.seconds]
    if starts and ends:
        m.extra["t_rollout_start"], m.extra["t_rollout_end"] = min(starts), max(ends)


async def counters(ledger: ledger_pb2_grpc.LedgerStub) -> dict[str, Any]:
    """Settlement counters and the generation accounting, from the ledger (where the fates are decided)."""
    out: dict[str, Any] = {}
    with contextlib.suppress(aio.AioRpcError):
        st = await ledger.GetStatus(ledger_pb2.LedgerStatusRequest(include_inactive_actors=True))
        out["admitted"] = st.settlement.admitted
        out["rejected"] = sum(st.settlement.rejected.values())
        out["tokens"] = sum(a.settled_tokens for a in st.actors)
        if st.HasField("accounting"):
            out["accounting"] = st.accounting
    return out


def settle(m: T.StepMetrics, before: dict[str, Any], after: dict[str, Any], elapsed: float) -> None:
    """The ledger's counters over the step (``counters`` before and after it) into ``m``."""
    m.admitted = int(after.get("admitted", 0) - before.get("admitted", 0))
    m.rejected = int(after.get("rejected", 0) - before.get("rejected", 0))
    acc_before, acc_after = before.get("accounting"), after.get("accounting")
    if acc_after is not None:
        m.accounting_total.CopyFrom(acc_after)
        m.accounting_total.wasted_token_fraction = wasted_fraction(acc_after)
        if acc_before is not None:
            m.accounting.CopyFrom(accounting_delta(acc_after, acc_before))
    toks = after.get("tokens", 0) - before.get("tokens", 0)
    m.rollout_tokens_per_s = toks / elapsed if elapsed > 0 and toks > 0 else 0.0
