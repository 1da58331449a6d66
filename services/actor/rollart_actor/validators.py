"""Every request check of the Actor service that needs no engine state, on top of ``rollart.runtime.validation``.

Invariant: each check refuses with INVALID_ARGUMENT (naming the field) before the engine or the weight
manager sees the request; strings that reach the file system or a store opener (checkpoint uris, the
checkpoint store) hold no NUL, control or bidi characters and fit ``PATH_MAX``. Checks that need the engine
(vocabulary size, context length, the chat template) stay in the servicer. See docs/actor.md.
"""

from __future__ import annotations

import math

from rollart.runtime import errors, ids
from rollart.runtime import validation as v
from rollart.v1 import actor_pb2, common_pb2

MAX_ID_CHARS = ids.MAX_ID_CHARS
MAX_STOP_STRINGS = 16
ROLES = ("system", "user", "assistant", "tool")
PAUSE_MODES = frozenset(actor_pb2.PauseMode.values())

# INVALID_ARGUMENT for a field; each message here starts with the field, so the details read as written.
_bad = errors.InvalidArgument


def _id(name: str, value: str, required: bool) -> None:
    """The one id rule (``rollart.runtime.ids``), with the actor's messages."""
    if not value:
        if required:
            raise _bad(name, f"{name} is required")
        return
    why = ids.id_problem(value)
    if why:
        raise _bad(name, f"{name} {why}")


def model_input(inp: common_pb2.ModelInput) -> None:
    kinds = [bool(inp.token_ids), bool(inp.messages), bool(inp.text)]
    if sum(kinds) != 1:
        raise _bad("input", "input must set exactly one of token_ids, messages or text")
    for i, m in enumerate(inp.messages):
        if m.role not in ROLES:
            raise _bad(
                f"messages[{i}].role", f"messages[{i}].role must be system, user, assistant or tool, not {m.role!r}"
            )


def sampling(s: common_pb2.SamplingParams) -> tuple[float, int, float]:
    """``(top_p, top_k, repetition_penalty)`` with their "disabled" zeros replaced."""
    if s.max_tokens <= 0:
        raise _bad("sampling.max_tokens", "sampling.max_tokens must be > 0")
    if not math.isfinite(s.temperature) or s.temperature < 0:
        raise _bad("sampling.temperature", "sampling.temperature must be >= 0")
    top_p = 1.0 if s.top_p == 0 else s.top_p
    if not math.isfinite(top_p) or not 0 < top_p <= 1:
        raise _bad("sampling.top_p", "sampling.top_p must be in (0, 1] (0 disables it)")
    top_k = -1 if s.top_k == 0 else s.top_k
    if top_k < -1:
        raise _bad("sampling.top_k", "sampling.top_k must be >= -1 (0 or -1 disable it)")
    rep = 1.0 if s.repetition_penalty == 0 else s.repetition_penalty
    if not math.isfinite(rep) or rep <= 0:
        raise _bad("sampling.repetition_penalty", "sampling.repetition_penalty must be > 0")
    if len(s.stop) > MAX_STOP_STRINGS or any(not x for x in s.stop):
        raise _bad("sampling.stop", f"sampling.stop takes at most {MAX_STOP_STRINGS} non-empty strings")
    return top_p, top_k, rep


def generate(req: actor_pb2.ActorGenerateRequest, *, priority_scheduling: bool) -> tuple[float, int, float]:
    """The request's own checks; returns :func:`sampling`'s values."""
    _id("request_id", req.request_id, True)
    _id("trajectory_id", req.trajectory_id, False)
    out = sampling(req.sampling)
    if req.chunk_tokens < 0:
        raise _bad("chunk_tokens", "chunk_tokens must be >= 0")
    if req.min_version < 0:
        raise _bad("min_version", "min_version must be >= 0")
    if req.priority != 0 and not priority_scheduling:
        raise _bad("priority", "priority needs scheduling_policy: priority on this actor")
    if req.kv_transfer_params_json and req.pd_phase != actor_pb2.PD_PHASE_DECODE:
        raise _bad("kv_transfer_params_json", "kv_transfer_params_json is only for PD_PHASE_DECODE")
    return out


def abort(request: actor_pb2.ActorAbortRequest) -> None:
    for r in request.request_ids:
        if len(r) > MAX_ID_CHARS:
            raise _bad("request_ids", f"request ids are at most {MAX_ID_CHARS} characters")


def pause_mode(mode: int, field: str = "mode") -> None:
    if mode not in PAUSE_MODES:
        raise _bad(field, f"unknown pause mode {mode}")


def pause(request: actor_pb2.ActorPauseRequest) -> float | None:
    """The pause's timeout in seconds (None: none asked)."""
    pause_mode(request.mode)
    if not request.HasField("timeout"):
        return None
    timeout = request.timeout.ToNanoseconds() / 1e9
    if timeout < 0:
        raise _bad("timeout", "timeout must not be negative")
    return timeout


def commit(request: actor_pb2.ActorCommitRequest) -> None:
    order = request.order
    if order.version < 0:
        raise _bad("order.version", "order.version must be >= 0")
    if order.hash and len(order.hash) != 32:
        raise _bad("order.hash", "order.hash must be 32 bytes (SHA-256)")


def load_checkpoint(request: actor_pb2.LoadCheckpointRequest) -> None:
    if not request.uri:
        raise _bad("uri", "uri is required")
    v.uri("uri", request.uri)  # before the file system or a store sees it
    if request.version < 0 or request.replay_to_version < 0:
        raise _bad("version", "versions must be >= 0")
    if request.replay_to_version and request.replay_to_version <= request.version:
        raise _bad("replay_to_version", "replay_to_version must be above version (or 0)")
    pause_mode(request.pause_mode, "pause_mode")


def pull_buckets(request: actor_pb2.PullBucketsRequest) -> None:
    if request.version < 0:
        raise _bad("version", "version must be >= 0")
    if request.hash and len(request.hash) != 32:
        raise _bad("hash", "hash must be 32 bytes (SHA-256)")


def weight_source(src: actor_pb2.WeightSource) -> None:
    from rollart.runtime.config import _check_address

    for field, ep in [
        ("source.relay_endpoint", src.relay_endpoint),
        *((f"source.fallback_endpoints[{i}]", e) for i, e in enumerate(src.fallback_endpoints)),
        ("source.mooncake_master", src.mooncake_master),
    ]:
        if ep:
            try:
                _check_address(ep)
            except ValueError as exc:
                raise errors.InvalidArgument(field, str(exc)) from None
    if src.streams < 0 or src.streams > 64:
        raise _bad("streams", "streams must be in [0, 64]")
    v.uri("source.checkpoint_store", src.checkpoint_store)
