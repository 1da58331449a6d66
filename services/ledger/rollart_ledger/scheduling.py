"""Step planning: who is eligible for version v, and how a batch is split over the eligible actors."""

from __future__ import annotations

import math
from dataclasses import dataclass

from rollart.v1 import common_pb2
from rollart.v1 import ledger_pb2 as lp

EX = lp.ExclusionReason


@dataclass(frozen=True)
class ActorView:
    """What planning needs to know about one actor."""

    actor_id: str
    tau: float
    alive: bool
    draining: bool
    weights: common_pb2.ActorWeightState


def has_staged(weights: common_pb2.ActorWeightState, version: int, version_hash: bytes) -> bool:
    """True when ``version`` is completely staged (and, where the actor reports a hash, it is h(v))."""
    for s in weights.staged:
        if s.version != version or not s.complete or s.error:
            continue
        if s.hash and version_hash and s.hash != version_hash:
            continue
        return True
    return False


def classify(a: ActorView, version: int, version_hash: bytes) -> tuple[lp.ExclusionReason | None, bool]:
    """(exclusion reason or None when eligible, needs Commit(v) first)."""
    if not a.alive:
        return EX.EXCLUSION_REASON_DEAD, False
    if a.draining:
        return EX.EXCLUSION_REASON_DRAINING, False
    w = a.weights
    if not w.loaded:
        return EX.EXCLUSION_REASON_WRONG_VERSION, False
    if w.active_version == version:
        return None, False
    if w.active_version == version - 1:
        if has_staged(w, version, version_hash):
            return None, True
        return EX.EXCLUSION_REASON_DELTA_NOT_STAGED, False
    return EX.EXCLUSION_REASON_WRONG_VERSION, False


def allocate(batch: int, taus: dict[str, float]) -> dict[str, int]:
    """Split ``batch`` in proportion to tau: B_a = floor(B * tau_a / T), the remainder to the fastest.

    Ties in tau go to the smaller actor id, so a plan is a pure function of its inputs. With T = 0 every actor
    counts as equally fast.
    """
    if not taus:
        return {}
    total = sum(max(t, 0.0) for t in taus.values())
    if total <= 0 or not math.isfinite(total):
        weights = {a: 1.0 for a in taus}
        total = float(len(taus))
    else:
        weights = {a: max(t, 0.0) for a, t in taus.items()}
    # The epsilon absorbs float error on exact quotients (300 * 5000 / 7500); the sum still cannot exceed B.
    out = {a: int(math.floor(batch * w / total + 1e-9)) for a, w in weights.items()}
    fastest = min(weights, key=lambda a: (-weights[a], a))
    out[fastest] += batch - sum(out.values())
    return out


def order(allocations: dict[str, int], taus: dict[str, float]) -> list[str]:
    """Actor ids fastest first (ties by id)."""
    return sorted(allocations, key=lambda a: (-taus[a], a))
