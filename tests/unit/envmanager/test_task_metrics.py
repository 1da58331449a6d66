"""The envmanager's per-task Prometheus series (multi-task jobs, issue 12): a bounded task label."""

from __future__ import annotations

from prometheus_client import REGISTRY

from rollart_envmanager import metrics


def value(task: str, outcome: str) -> float:
    return REGISTRY.get_sample_value(
        "rollart_envmanager_task_trajectories_total", {"task": task, "outcome": outcome}
    ) or 0.0


def test_outcomes_counted_per_task_and_the_label_stays_bounded():
    before = value("arith", "ok")
    metrics.task_trajectory("arith", "ok")
    metrics.task_trajectory("arith", "ok")
    assert value("arith", "ok") == before + 2
    for i in range(metrics.MAX_TASK_LABELS + 5):
        metrics.task_trajectory(f"flood-{i}", "rejected")
    metrics.task_trajectory("x" * 500, "rejected")
    assert len(metrics._task_labels) <= metrics.MAX_TASK_LABELS
    assert value("other", "rejected") >= 5
    assert value("x" * 500, "rejected") == 0.0
