"""Which scorer a request means, and running a pool scorer inside a worker process.

A request names its scorer with ``RewardSpec.kind`` (+ ``scorer`` for a name within the kind). When the kind is
unspecified it is derived, first from the trajectory metadata ``reward_kind`` (``math``, ``reasoning_gym``,
``code``, ``game``, ``llm_judge`` or ``custom``, with ``reward_scorer`` as the name), then from the task tag:

    math, math:*                                        -> MATH
    reasoning_gym:<dataset>, rg:<dataset>               -> REASONING_GYM (scorer = <dataset>)
    code, code:*                                        -> CODE
    game, game:*, gem:*, textarena:*, gym:*, swe:*      -> GAME (the environment's own rewards)
    judge, judge:*                                      -> LLM_JUDGE
"""

from __future__ import annotations

from dataclasses import dataclass, field

from rollart.v1 import common_pb2

from ..sandbox import SandboxLimits
from .base import InvalidRequest, Verdict

SK = common_pb2.ScorerKind
KIND_NAMES: dict[common_pb2.ScorerKind, str] = {
    SK.SCORER_KIND_MATH: "math",
    SK.SCORER_KIND_REASONING_GYM: "reasoning_gym",
    SK.SCORER_KIND_CODE: "code",
    SK.SCORER_KIND_GAME: "game",
    SK.SCORER_KIND_LLM_JUDGE: "llm_judge",
    SK.SCORER_KIND_CUSTOM: "custom",
}
KINDS_BY_NAME = {v: k for k, v in KIND_NAMES.items()}
# Kinds that run in pool worker processes (CPU work, signals, sandboxes, user code); the rest run in the service.
POOL_KINDS = frozenset({"math", "reasoning_gym", "code", "custom"})
_TASK_PREFIXES: list[tuple[tuple[str, ...], str, bool]] = [
    # (prefixes, kind, the rest of the tag names the scorer)
    (("reasoning_gym:", "reasoning-gym:", "rg:"), "reasoning_gym", True),
    (("math:",), "math", False),
    (("code:",), "code", False),
    (("game:", "gem:", "textarena:", "gym:", "gymnasium:", "swe:"), "game", False),
    (("judge:",), "llm_judge", False),
]
_TASK_EXACT = {"math": "math", "code": "code", "game": "game", "judge": "llm_judge", "swe": "game"}


def resolve(traj: common_pb2.Trajectory, spec: common_pb2.RewardSpec) -> common_pb2.RewardSpec:
    """The effective spec: the request's, or one derived from the trajectory (see the module docstring)."""
    out = common_pb2.RewardSpec()
    out.CopyFrom(spec)
    if spec.kind != SK.SCORER_KIND_UNSPECIFIED:
        if spec.kind not in KIND_NAMES:
            raise InvalidRequest(f"unknown scorer kind {spec.kind}")
        return out
    meta_kind = traj.metadata.get("reward_kind", "")
    if meta_kind:
        if meta_kind not in KINDS_BY_NAME:
            raise InvalidRequest(f"trajectory metadata reward_kind {meta_kind!r} is not one of {sorted(KINDS_BY_NAME)}")
        out.kind = KINDS_BY_NAME[meta_kind]
        out.scorer = out.scorer or traj.metadata.get("reward_scorer", "")
        return out
    task = traj.task
    if task in _TASK_EXACT:
        out.kind = KINDS_BY_NAME[_TASK_EXACT[task]]
        return out
    for prefixes, kind, named in _TASK_PREFIXES:
        for p in prefixes:
            if task.startswith(p):
                out.kind = KINDS_BY_NAME[kind]
                if named and not out.scorer:
                    out.scorer = task[len(p) :]
                return out
    raise InvalidRequest(
        f"cannot derive a scorer from task {task!r}: set spec.kind (or trajectory metadata reward_kind)"
    )


@dataclass
class WorkerContext:
    """What a worker process knows besides the request: sandbox limits and the registered custom scorers."""

    sandbox: SandboxLimits = field(default_factory=SandboxLimits)
    custom_scorers: dict[str, str] = field(default_factory=dict)


def run(
    kind: str, name: str, options: dict[str, str], traj: common_pb2.Trajectory, budget: float, ctx: WorkerContext
) -> Verdict:
    """Run a pool scorer (inside a worker process)."""
    if kind == "math":
        from . import math as math_scorer

        return math_scorer.score(traj, options, budget)
    if kind == "reasoning_gym":
        from . import reasoning_gym as reasoning_gym_scorer

        return reasoning_gym_scorer.score(traj, name, options, budget)
    if kind == "code":
        from . import code as code_scorer

        return code_scorer.score(traj, options, budget, ctx.sandbox)
    if kind == "custom":
        from . import custom as custom_scorer

        target = ctx.custom_scorers.get(name)
        if target is None:
            raise InvalidRequest(f"no custom scorer named {name!r} is registered")
        return custom_scorer.score(traj, target, options)
    raise InvalidRequest(f"scorer kind {kind!r} does not run in the worker pool")


def preload(kinds: list[str]) -> None:
    """Import the heavy libraries of these kinds, so a fresh worker's first scoring is not slowed by imports."""
    for kind in kinds:
        if kind == "math":
            from math_verify import parse, verify

            # The first comparison builds math-verify's LaTeX parser (about a second): do it before "ready".
            verify(parse("$(x+1)(x-2)$"), parse("\\boxed{x^2-x-2}"))
        elif kind == "reasoning_gym":
            import reasoning_gym  # noqa: F401
        elif kind == "code":
            from . import code  # noqa: F401
