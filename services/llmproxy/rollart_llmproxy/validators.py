"""Every request check of the LLMProxy service, on top of ``rollart.runtime.ids`` and ``validation``.

Invariant: each check refuses with a non-retryable INVALID_ARGUMENT ``TurnError`` (the proxy's one coded error,
so the gRPC and the OpenAI HTTP APIs answer it alike) naming the field, before any state changes; checks that
need the proxy's state (a pool that does not exist, a request id in flight) stay in the core. See
docs/llmproxy.md.
"""

from __future__ import annotations

import json

import grpc

from rollart.runtime import errors, ids
from rollart.runtime import validation as v
from rollart.runtime.config import _check_address
from rollart.v1 import common_pb2
from rollart.v1 import llmproxy_pb2 as pp

from .turn import MAX_ID, TurnError

INVALID = grpc.StatusCode.INVALID_ARGUMENT
MAX_REASON_CHARS = 1000
MAX_CHUNK_TOKENS = 1 << 20


def check_id(name: str, value: str, required: bool = True) -> None:
    """The one id rule (``rollart.runtime.ids``), refused as a non-retryable TurnError."""
    try:
        ids.check_id(name, value, required=required)
    except errors.InvalidArgument as exc:
        raise TurnError(INVALID, exc.details(), field=name) from None


def job_id(value: str) -> None:
    """A job named by a turn, Suspend, Resume or SetVersionWindow: "" or a name (job ids are names)."""
    if value and ids.name_problem(value):
        raise TurnError(INVALID, f"job_id {ids.name_problem(value)}", field="job_id")


def model_input(inp: common_pb2.ModelInput, where: str = "input") -> None:
    given = sum((bool(inp.token_ids), bool(inp.messages), bool(inp.text)))
    if given != 1:
        why = f"{where} must set exactly one of token_ids, messages or text (got {given})"
        raise TurnError(INVALID, why, field=where)
    if inp.token_ids and min(inp.token_ids) < 0:
        raise TurnError(INVALID, f"{where}.token_ids must not be negative", field=f"{where}.token_ids")
    for i, m in enumerate(inp.messages):
        if not m.role:
            raise TurnError(INVALID, f"{where}.messages[{i}].role is required", field=f"{where}.messages[{i}].role")


def sampling(s: common_pb2.SamplingParams) -> None:
    if s.max_tokens <= 0:
        raise TurnError(INVALID, "sampling.max_tokens is required and must be > 0", field="sampling.max_tokens")
    if s.temperature < 0:
        raise TurnError(INVALID, "sampling.temperature must be >= 0", field="sampling.temperature")
    if not 0 <= s.top_p <= 1:
        raise TurnError(INVALID, "sampling.top_p must be within [0, 1]", field="sampling.top_p")
    if s.top_k < -1:
        raise TurnError(INVALID, "sampling.top_k must be >= -1", field="sampling.top_k")
    if s.repetition_penalty < 0:
        raise TurnError(INVALID, "sampling.repetition_penalty must be >= 0", field="sampling.repetition_penalty")


def generate(req: pp.TrajectoryGenerateRequest) -> None:
    check_id("trajectory_id", req.trajectory_id)
    check_id("request_id", req.request_id, required=False)
    check_id("lease_id", req.lease_id, required=False)
    check_id("preferred_actor_id", req.preferred_actor_id, required=False)
    job_id(req.job_id)
    if len(req.task) > MAX_ID:
        raise TurnError(INVALID, f"task must be at most {MAX_ID} characters", field="task")
    if not req.HasField("input"):
        raise TurnError(INVALID, "input is required", field="input")
    model_input(req.input)
    if not req.HasField("sampling"):
        raise TurnError(INVALID, "sampling is required (sampling.max_tokens > 0)", field="sampling")
    sampling(req.sampling)
    if req.min_version < 0:
        raise TurnError(INVALID, "min_version must be >= 0", field="min_version")
    if req.turn < 0:
        raise TurnError(INVALID, "turn must be >= 0", field="turn")
    if not 0 <= req.chunk_tokens <= MAX_CHUNK_TOKENS:
        raise TurnError(INVALID, "chunk_tokens must be >= 0", field="chunk_tokens")
    if req.HasField("deadline"):
        try:
            v.timestamp("deadline", req.deadline)
        except errors.InvalidArgument as exc:
            raise TurnError(INVALID, exc.details(), field="deadline") from None


def tokenize(request: pp.ProxyTokenizeRequest) -> None:
    if not request.HasField("request"):
        raise TurnError(INVALID, "request is required", field="request")


def suspend(request: pp.SuspendRequest) -> None:
    job_id(request.job_id)
    if len(request.reason) > MAX_REASON_CHARS:
        raise TurnError(INVALID, f"reason is longer than {MAX_REASON_CHARS} characters", field="reason")


def abort(request: pp.ProxyAbortRequest) -> None:
    if not request.trajectory_ids:
        raise TurnError(INVALID, "trajectory_ids is required", field="trajectory_ids")
    for i, tid in enumerate(request.trajectory_ids):
        check_id(f"trajectory_ids[{i}]", tid)


def add_actor(request: pp.AddProxyActorRequest) -> None:
    check_id("actor_id", request.actor_id)
    try:
        _check_address(request.endpoint)
    except ValueError as exc:
        raise TurnError(INVALID, f"endpoint: {exc}", field="endpoint") from None
    if request.pd_role not in common_pb2.PdRole.values():
        raise TurnError(INVALID, f"unknown pd_role {request.pd_role}", field="pd_role")


def affinity_rules(rules: list[pp.AffinityRule]) -> None:
    """Each rule usable and each task once (whether a pool exists is the actor table's to say)."""
    from .router import check_rule

    seen: set[str] = set()
    for i, r in enumerate(rules):
        if r.from_binding:
            continue  # output-only rules derived from bindings
        problem = check_rule(r)
        if problem:
            raise TurnError(INVALID, f"rules[{i}]: {problem}", field=f"rules[{i}]")
        if r.task in seen:
            raise TurnError(INVALID, f"rules[{i}]: task {r.task!r} appears twice", field=f"rules[{i}].task")
        seen.add(r.task)


def pd_pools(pools: list[pp.PdPoolConfig]) -> None:
    seen: set[str] = set()
    for i, p in enumerate(pools):
        at = f"pools[{i}]"
        if not p.pool:
            raise TurnError(INVALID, f"{at}.pool is required", field=f"{at}.pool")
        if p.pool in seen:
            raise TurnError(INVALID, f"{at}: pool {p.pool!r} appears twice", field=f"{at}.pool")
        if p.min_prompt_tokens < 0:
            raise TurnError(INVALID, f"{at}.min_prompt_tokens must be >= 0", field=f"{at}.min_prompt_tokens")
        both = set(p.prefill_actor_ids) & set(p.decode_actor_ids)
        if both:
            raise TurnError(INVALID, f"{at}: actors {sorted(both)} are both prefill and decode", field=at)
        if p.kv_connector_config_json:
            try:
                json.loads(p.kv_connector_config_json)
            except ValueError as exc:
                field = f"{at}.kv_connector_config_json"
                raise TurnError(INVALID, f"{field} is not JSON: {exc}", field=field) from None
        seen.add(p.pool)


def version_window(window: pp.VersionWindow) -> None:
    if window.min_version < 0 or window.max_version < 0:
        raise TurnError(INVALID, "versions must be >= 0", field="window")
    if window.max_version and window.max_version < window.min_version:
        raise TurnError(
            INVALID,
            f"max_version {window.max_version} is below min_version {window.min_version}",
            field="window.max_version",
        )
