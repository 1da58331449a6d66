"""Prometheus metrics of the reward service (served on the service's /metrics endpoint)."""

from __future__ import annotations

from prometheus_client import Counter, Gauge, Histogram

WORKERS = Gauge("rollart_reward_workers", "Pool worker processes, by state", ["state"])
WORKERS_MIN = Gauge("rollart_reward_workers_min", "Fewest pool workers kept (0: scales to zero)")
WORKERS_MAX = Gauge("rollart_reward_workers_max", "Most pool workers")
QUEUE_DEPTH = Gauge("rollart_reward_queue_depth", "Scoring requests waiting for a pool worker")
IN_FLIGHT = Gauge("rollart_reward_in_flight", "Scoring requests being scored by pool workers")
SCALE_UPS = Counter("rollart_reward_scale_ups", "Pool workers started")
SCALE_DOWNS = Counter("rollart_reward_scale_downs", "Pool workers stopped (idle, shrunk, crashed or killed)")
WORKER_CRASHES = Counter("rollart_reward_worker_crashes", "Pool workers that died while scoring or starting")
WORKER_KILLS = Counter("rollart_reward_worker_kills", "Pool workers killed because a scorer ran past its deadline")
SCORED = Counter("rollart_reward_scored", "Scorings finished, by scorer kind and status", ["kind", "status"])
CACHE_HITS = Counter("rollart_reward_cache_hits", "Requests answered from the idempotency cache")
SCORING_SECONDS = Histogram(
    "rollart_reward_scoring_seconds",
    "Time spent scoring (excluding the queue), by scorer kind",
    ["kind"],
    buckets=(0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60),
)
QUEUE_SECONDS = Histogram(
    "rollart_reward_queue_seconds",
    "Time a request waited for a pool worker (including a scale-up from zero)",
    buckets=(0.0005, 0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2, 5, 10, 30),
)
