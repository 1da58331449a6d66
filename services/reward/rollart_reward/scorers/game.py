"""Game outcomes: the environment's own rewards, aggregated per the spec (no model, no sandbox)."""

from __future__ import annotations

from rollart.v1 import common_pb2

from .base import InvalidRequest, Verdict

OPTIONS = {
    "aggregate": "how per-turn env rewards combine: 'sum' (default), 'last', 'max' or 'mean'",
    "success_threshold": "when set, the reward is 1.0 if the aggregate is >= this, else 0.0 (win/loss)",
    "metadata_field": "take the outcome from this metadata key (e.g. a final reward given at close) instead",
}
AGGREGATES = ("sum", "last", "max", "mean")


def _float(value: str, what: str) -> float:
    try:
        return float(value)
    except ValueError:
        raise InvalidRequest(f"{what} must be a number, got {value!r}") from None


def score(traj: common_pb2.Trajectory, options: dict[str, str]) -> Verdict:
    how = options.get("aggregate", "sum")
    if how not in AGGREGATES:
        raise InvalidRequest(f"option aggregate must be one of {AGGREGATES}, got {how!r}")
    field = options.get("metadata_field")
    rewards = [t.env_reward for t in traj.turns]
    if field:
        if field not in traj.metadata:
            raise InvalidRequest(f"trajectory metadata has no {field!r}")
        value = _float(traj.metadata[field], f"metadata {field!r}")
    else:
        if not rewards:
            raise InvalidRequest("trajectory has no turns: there is no game outcome to score")
        value = {
            "sum": sum(rewards),
            "last": rewards[-1],
            "max": max(rewards),
            "mean": sum(rewards) / len(rewards),
        }[how]
    components = {how if not field else field: value, "turns": float(len(rewards))}
    threshold = options.get("success_threshold")
    if threshold is not None and threshold != "":
        won = value >= _float(threshold, "option success_threshold")
        components["won"] = 1.0 if won else 0.0
        return Verdict(reward=1.0 if won else 0.0, components=components, explanation=f"{how}={value:g}, won={won}")
    return Verdict(reward=float(value), components=components, explanation=f"{how} of {len(rewards)} env rewards")
