"""User-registered scorers: ``custom_scorers: {name: "package.module:function"}`` in the service configuration.

The function receives ``(trajectory: rollart.v1.common_pb2.Trajectory, options: dict[str, str])`` and returns
a float reward, or a dict with ``reward`` and optionally ``components`` and ``explanation``. It runs in a pool
worker process under the call's time budget (killed past it). Raise ``ScorerFailure`` to report a failure.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any

from rollart.v1 import common_pb2

from .base import ScorerFailure, Verdict

_LOADED: dict[str, Callable[..., Any]] = {}


def load(target: str) -> Callable[..., Any]:
    fn = _LOADED.get(target)
    if fn is None:
        module, _, attr = target.partition(":")
        if not module or not attr:
            raise ScorerFailure("bad_custom_scorer", f"custom scorer target {target!r} is not 'module:function'")
        try:
            fn = getattr(importlib.import_module(module), attr)
        except (ImportError, AttributeError) as exc:
            raise ScorerFailure("bad_custom_scorer", f"cannot load custom scorer {target!r}: {exc}") from None
        _LOADED[target] = fn
    return fn


def score(traj: common_pb2.Trajectory, target: str, options: dict[str, str]) -> Verdict:
    result = load(target)(traj, dict(options))
    if isinstance(result, Verdict):
        return result
    if isinstance(result, (int, float)) and not isinstance(result, bool):
        return Verdict(reward=float(result))
    if isinstance(result, dict) and "reward" in result:
        return Verdict(
            reward=float(result["reward"]),
            components={str(k): float(v) for k, v in (result.get("components") or {}).items()},
            explanation=str(result.get("explanation", "")),
        )
    raise ScorerFailure("bad_custom_scorer", f"custom scorer {target!r} returned {type(result).__name__}, not a reward")
