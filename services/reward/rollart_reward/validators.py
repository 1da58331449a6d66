"""Request checks of the Reward service, on top of ``rollart.runtime.validation``.

Invariant: a request is checked before a scorer or the worker pool sees it and refused with INVALID_ARGUMENT
naming the field; what needs the service's state (the registered scorers, its timeout bound) stays in the
servicer. See docs/reward.md.
"""

from __future__ import annotations

from rollart.runtime import errors, timeutil
from rollart.v1 import reward_pb2

MAX_WORKERS = 1024
MAX_IDLE_TIMEOUT_S = 7 * 24 * 3600


def configure_pool(request: reward_pb2.ConfigureRewardPoolRequest) -> float:
    """The idle timeout asked for (seconds, 0: none)."""
    if request.max_workers <= 0:
        raise errors.InvalidArgument("max_workers", "must be > 0")
    if request.max_workers > MAX_WORKERS:
        raise errors.InvalidArgument("max_workers", f"must be <= {MAX_WORKERS}")
    if request.min_workers < 0 or request.min_workers > request.max_workers:
        raise errors.InvalidArgument(
            "min_workers", f"must be within [0, max_workers={request.max_workers}], got {request.min_workers}"
        )
    return timeutil.checked_duration("idle_timeout", request.idle_timeout, max_seconds=MAX_IDLE_TIMEOUT_S)
