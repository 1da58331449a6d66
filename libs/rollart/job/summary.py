"""How much a run's reward improved: the mean of the first 10 steps against the last 10 (``rollart run``'s exit
code, ``summary.json``, the benchmarks)."""

from __future__ import annotations

import math
from typing import Any


def improvement(rewards: list[float], window: int = 10) -> tuple[float, float, float]:
    """(mean of the first ``window``, mean of the last ``window``, their ratio; inf when the first is 0)."""
    if not rewards:
        return 0.0, 0.0, 0.0
    w = min(window, len(rewards))
    first = sum(rewards[:w]) / w
    last = sum(rewards[-w:]) / w
    ratio = last / first if first > 0 else (math.inf if last > 0 else 0.0)
    return first, last, ratio


def ratio_of(d: dict[str, Any] | None) -> float:
    """A task's improvement from its summary entry (inf when it started at 0 and rose; 0 when it has none)."""
    if not d:
        return 0.0
    if d.get("improvement") is not None:
        return float(d["improvement"])
    return math.inf if d.get("reward_last10", 0.0) > 0 else 0.0
