"""Prometheus metrics of the proxy (served on the service's /metrics endpoint)."""

from __future__ import annotations

from prometheus_client import Counter, Gauge, Histogram

REQUESTS = Counter("rollart_llmproxy_requests_total", "Turns by route reason and outcome", ["reason", "outcome"])
OUTSTANDING_TOKENS = Gauge(
    "rollart_llmproxy_outstanding_tokens",
    "Tokens outstanding on an actor (prompt not yet prefilled + tokens not yet generated)",
    ["actor"],
)
OUTSTANDING_REQUESTS = Gauge("rollart_llmproxy_outstanding_requests", "Requests in flight on an actor", ["actor"])
ACTOR_HEALTHY = Gauge("rollart_llmproxy_actor_healthy", "1 when the actor is routable", ["actor"])
ACTOR_FAILURES = Counter(
    "rollart_llmproxy_actor_failures_total", "Turns ended UNAVAILABLE because their actor failed", ["actor"]
)
SUSPENDED = Gauge("rollart_llmproxy_suspended", "1 while admission is suspended")
WAITERS = Gauge("rollart_llmproxy_suspended_waiters", "Requests waiting for admission")
ADMISSION_WAIT = Histogram(
    "rollart_llmproxy_admission_wait_seconds",
    "Time a turn waited for admission",
    buckets=(0.001, 0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300),
)
SHARE_WAIT = Histogram(
    "rollart_llmproxy_share_wait_seconds",
    "Time a turn waited for its job's share of a full fleet (job_shares; job \"\" is the fleet owner's turns)",
    ["job"],
    buckets=(0.001, 0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300),
)
TTFT = Histogram(
    "rollart_llmproxy_time_to_first_token_seconds",
    "From the proxy receiving a turn to its first token",
    buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30),
)
TOKENS = Counter("rollart_llmproxy_generated_tokens_total", "Tokens streamed to callers", ["actor"])
ABORTED = Counter("rollart_llmproxy_aborted_total", "Turns ended by Abort")
PD_TURNS = Counter("rollart_llmproxy_pd_turns_total", "Turns by PD mode", ["mode"])
# Affinity (bounded labels: a task's profile, never its name; the per-task figures are in GetAffinity).
AFFINITY_FALLBACKS = Counter(
    "rollart_llmproxy_affinity_fallback_turns_total",
    "Turns routed outside their affinity scope, by the task's profile (rule: a hand-written rule) and why",
    ["profile", "why"],
)
TASK_PROFILE_CHANGES = Counter(
    "rollart_llmproxy_task_profile_changes_total", "Tasks classified (or re-classified) by auto affinity", ["profile"]
)
# path: one of the API's routes, or "other" for any unknown path (so requests cannot grow the label set).
HTTP_REQUESTS = Counter("rollart_llmproxy_http_requests_total", "OpenAI API requests", ["path", "status"])

#: Series labelled by actor id: removed with the actor (``Proxy._finalize_removal``).
PER_ACTOR = (OUTSTANDING_TOKENS, OUTSTANDING_REQUESTS, ACTOR_HEALTHY, ACTOR_FAILURES, TOKENS)
