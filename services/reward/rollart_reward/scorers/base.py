"""What a scorer returns, and how it says that it could not score."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from rollart.runtime import errors
from rollart.v1 import common_pb2

# Status names shared by workers (JSON) and the service (mapped to ScoreStatus there).
OK, FAILED, TIMEOUT, INVALID = "ok", "failed", "timeout", "invalid"


@dataclass
class Verdict:
    """The result of one scoring attempt: a reward (status ok) or a failure with its cause."""

    status: str = OK
    reward: float = 0.0
    components: dict[str, float] = field(default_factory=dict)
    explanation: str = ""
    error: str = ""
    # Short machine-readable cause of a failure, e.g. "memory_limit", "worker_crashed", "judge_unreachable".
    cause: str = ""
    # Whether the same request may succeed when sent again (infrastructure trouble, not the trajectory itself).
    # Timeouts always are: a slow machine and an endless loop look the same from outside.
    retryable: bool = False

    def __post_init__(self) -> None:
        if self.status == TIMEOUT:
            self.retryable = True

    def to_dict(self) -> dict[str, Any]:
        return {
            "status": self.status,
            "reward": self.reward,
            "components": self.components,
            "explanation": self.explanation,
            "error": self.error,
            "cause": self.cause,
            "retryable": self.retryable,
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "Verdict":
        return cls(
            status=str(d.get("status", FAILED)),
            reward=float(d.get("reward", 0.0)),
            components={str(k): float(v) for k, v in (d.get("components") or {}).items()},
            explanation=str(d.get("explanation", "")),
            error=str(d.get("error", "")),
            cause=str(d.get("cause", "")),
            retryable=bool(d.get("retryable", False)),
        )


class ScorerFailure(Exception):
    """Raised by a scorer that could not produce a reward (never turned into a zero reward)."""

    def __init__(self, cause: str, message: str, *, retryable: bool = False, timeout: bool = False) -> None:
        super().__init__(message)
        self.cause = cause
        self.message = message
        self.retryable = retryable
        self.timeout = timeout

    def verdict(self) -> Verdict:
        return Verdict(
            status=TIMEOUT if self.timeout else FAILED, error=self.message, cause=self.cause, retryable=self.retryable
        )


class InvalidRequest(errors.InvalidArgument, ValueError):
    """The request cannot be scored as sent (missing gold answer, unknown dataset, ...): INVALID_ARGUMENT."""

    def __init__(self, message: str, field: str = "") -> None:
        super().__init__(field, message)


def final_answer(traj: common_pb2.Trajectory) -> str:
    """The final answer of a trajectory: the last turn's action."""
    if not traj.turns:
        raise InvalidRequest("trajectory has no turns: there is no answer to score")
    return traj.turns[-1].action


def gold(traj: common_pb2.Trajectory, options: dict[str, str], default_field: str = "answer") -> str:
    """The gold answer from the trajectory metadata (key ``answer`` unless options name ``answer_field``)."""
    key = options.get("answer_field") or default_field
    value = traj.metadata.get(key, "")
    if not value.strip():
        raise InvalidRequest(f"trajectory metadata has no gold answer under {key!r}")
    return value
