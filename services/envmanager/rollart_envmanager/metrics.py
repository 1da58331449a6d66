"""Prometheus metrics of the envmanager (served on /metrics by the runtime)."""

from __future__ import annotations

from prometheus_client import Counter, Gauge, Histogram

LOOPS = Gauge("rollart_envmanager_loops", "Loops by state", ["state"])
TRAJECTORIES = Counter("rollart_envmanager_trajectories_total", "Trajectories finished, by outcome", ["outcome"])
FAILURES = Counter("rollart_envmanager_failures_total", "Infrastructure failures and timeouts, by cause", ["cause"])
TURNS = Counter("rollart_envmanager_turns_total", "Turns taken")
TOKENS = Counter("rollart_envmanager_tokens_generated_total", "Tokens generated for this envmanager's trajectories")
GENERATION_RETRIES = Counter("rollart_envmanager_generation_retries_total", "Turns resent after a lost actor")
REWARDS_PENDING = Gauge("rollart_envmanager_rewards_pending", "Trajectories sent for reward, not yet answered")
REWARDS = Counter("rollart_envmanager_rewards_total", "Reward outcomes handed to the ledger", ["outcome"])
_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300)
GENERATION_SECONDS = Histogram("rollart_envmanager_generation_seconds", "Time of one generation turn",
                               buckets=_BUCKETS)
STEP_SECONDS = Histogram("rollart_envmanager_step_seconds", "Time of one environment step (with injected latency)",
                         buckets=_BUCKETS)
EPISODE_SECONDS = Histogram("rollart_envmanager_episode_seconds", "Lease to settlement of one trajectory",
                            buckets=_BUCKETS)
CANCEL_SECONDS = Histogram("rollart_envmanager_cancel_seconds",
                           "From a lease cancellation arriving to its trajectory being aborted", buckets=_BUCKETS)

# Per task tag (multi-task jobs): trajectories by outcome ("ok", "rejected", "cancelled" or a failure cause). The
# task label is bounded: the first MAX_TASK_LABELS tags seen keep their name, later ones count as "other".
TASK_TRAJECTORIES = Counter(
    "rollart_envmanager_task_trajectories_total", "Trajectories finished, by task tag and outcome", ["task", "outcome"]
)
MAX_TASK_LABELS = 32
_task_labels: set[str] = set()


def task_trajectory(task: str, outcome: str) -> None:
    if task not in _task_labels and len(_task_labels) < MAX_TASK_LABELS and 0 < len(task) <= 128:
        _task_labels.add(task)
    TASK_TRAJECTORIES.labels(task if task in _task_labels else "other", outcome).inc()
