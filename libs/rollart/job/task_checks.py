"""A multi-task job checked against the running cluster before it starts (each task's environment at its
envmanager, its scorer at the reward service), and the tasks' affinity rules set on the LLMProxy. Bad input is a
``SpecError`` naming the field."""

from __future__ import annotations

from typing import Any

import grpc
from grpc import aio

from rollart.runtime.client import channel
from rollart.v1 import (
    common_pb2,
    envmanager_pb2,
    envmanager_pb2_grpc,
    llmproxy_pb2,
    llmproxy_pb2_grpc,
    reward_pb2,
    reward_pb2_grpc,
)

from .spec import JobTask, SpecError


def scorer_problem(spec: Any, scorers: list[Any] | None) -> str:
    """Why the reward service cannot score ``spec`` (a RewardSpec), or "" (no kind: the environment's default)."""
    if not spec.kind or scorers is None:
        return ""
    kind = common_pb2.ScorerKind.Name(spec.kind).removeprefix("SCORER_KIND_").lower()
    of_kind = [x for x in scorers if x.kind == spec.kind]
    if not of_kind:
        return f"the reward service has no {kind} scorer"
    named = {x.name for x in of_kind}
    if spec.scorer and spec.scorer not in named and "" not in named:
        return f"unknown {kind} scorer {spec.scorer!r} (known: {', '.join(sorted(named))})"
    if not any(x.available for x in of_kind if x.name in (spec.scorer, "")):
        return f"the {kind} scorer cannot run on this reward service"
    return ""


def rule_text(rule: Any) -> str:
    if getattr(rule, "auto", False):
        return "auto"
    where = rule.pool or rule.binding_id or (f"kind {rule.pool_kind}" if rule.pool_kind else "any")
    tags = f" tags {list(rule.hardware_tags)}" if rule.hardware_tags else ""
    return where + tags + (" (fallback)" if rule.allow_fallback else "")


async def check_tasks(tasks: list[JobTask], services: dict[str, Any], token: str) -> None:
    """Refuse a multi-task job before it starts when a task names an environment its envmanager does not
    have (or cannot run here) or a scorer the reward service does not have: SpecError naming the field."""
    svc = services
    listed: dict[str, dict[str, envmanager_pb2.EnvironmentInfo]] = {}
    for name in sorted({t.envmanager for t in tasks}):
        ch = channel(svc[name]["address"], token=token, default_timeout=30.0)
        try:
            resp = await envmanager_pb2_grpc.EnvManagerStub(ch).ListEnvironments(
                envmanager_pb2.ListEnvironmentsRequest(include_unavailable=True)
            )
        finally:
            await ch.close()
        listed[name] = {e.id: e for e in resp.environments}
    scorers: list[reward_pb2.ScorerInfo] | None = None
    if "reward" in svc and any(t.environment.reward.kind for t in tasks):
        ch = channel(svc["reward"]["address"], token=token, default_timeout=30.0)
        try:
            got = await reward_pb2_grpc.RewardStub(ch).ListScorers(reward_pb2.ListScorersRequest())
            scorers = list(got.scorers)
        finally:
            await ch.close()
    for i, t in enumerate(tasks):
        env_id = t.environment.environment
        info = listed[t.envmanager].get(env_id)
        if info is None:
            raise SpecError(f"tasks[{i}].environment.environment: unknown environment {env_id!r} at {t.envmanager}")
        if not info.available:
            why = info.unavailable_reason or "not available"
            raise SpecError(f"tasks[{i}].environment.environment: {env_id} cannot run here: {why}")
        problem = scorer_problem(t.environment.reward, scorers)
        if problem:
            raise SpecError(f"tasks[{i}].reward: {problem}")


async def set_affinity(tasks: list[JobTask], services: dict[str, Any], token: str) -> list[Any]:
    """Set the tasks' affinity rules on the LLMProxy (merged into its table); returns the rules set."""
    rules = [t.affinity for t in tasks if t.affinity is not None]
    if not rules:
        return rules
    ch = channel(services["llmproxy"]["address"], token=token, default_timeout=30.0)
    try:
        stub = llmproxy_pb2_grpc.LLMProxyStub(ch)
        await stub.SetAffinity(llmproxy_pb2.SetAffinityRequest(rules=rules, merge=True))
    except aio.AioRpcError as exc:
        if exc.code() == grpc.StatusCode.INVALID_ARGUMENT:
            raise SpecError(f"tasks[*].affinity: the LLMProxy refused the rules: {exc.details()}") from None
        raise
    finally:
        await ch.close()
    return rules
