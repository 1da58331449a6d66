"""The proxy's state and the life of one turn, shared by the gRPC service and the OpenAI HTTP API.

A turn: validate -> wait for admission (Suspend) -> route (sticky / preferred / least loaded, affinity
scope, version window; waits a little for a usable actor) -> optionally prefill on a PD prefill actor ->
stream from the actor, forwarding chunks. An actor that fails before anything was forwarded is excluded and
the turn is routed again (RouteReason RETRY); after that the turn ends UNAVAILABLE with the retryable
trailing metadata of llmproxy.proto.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import logging
import os
import time
from collections.abc import AsyncGenerator, AsyncIterator, Sequence
from dataclasses import dataclass

import grpc
from grpc import aio
from opentelemetry import trace
from opentelemetry.trace import SpanKind, Status, StatusCode

from rollart.runtime import errors, ids
from rollart.runtime.auth import bearer
from rollart.runtime.client import bare_channel, channel
from rollart.runtime.telemetry import inject_metadata, log_fields, trajectory_scope
from rollart.runtime.telemetry import tracer as _tracer
from rollart.runtime.timeutil import duration as _dur
from rollart.runtime.timeutil import timestamp as _ts
from rollart.v1 import actor_pb2, actor_pb2_grpc, common_pb2
from rollart.v1 import llmproxy_pb2 as lp

from . import metrics
from .admission import AdmissionGate, AdmissionRefused, AdmissionTimeout
from .config import LLMProxyConfig
from .router import DRAINING, HEALTHY, UNHEALTHY, ActorEntry, AutoSettings, NoRoute, Route, Router
from .tokenizer import LocalTokenizer

log = logging.getLogger(__name__)

MAX_ID = ids.MAX_ID_CHARS  # also the longest task (route) name
# Trailing metadata of a failed turn (see the retryable-status contract in llmproxy.proto).
MD_RETRYABLE = "rollart-retryable"
MD_FAILED_ACTOR = "rollart-failed-actor"
MD_TOKENS = "rollart-tokens-streamed"
PD_ROLE_NAMES = {
    "unified": common_pb2.PD_ROLE_UNIFIED,
    "prefill": common_pb2.PD_ROLE_PREFILL,
    "decode": common_pb2.PD_ROLE_DECODE,
}
ABORTED = common_pb2.FINISH_REASON_ABORTED
GENERATE_METHOD = "/rollart.v1.Actor/Generate"
_REASONS = {v: lp.RouteReason.Name(v).removeprefix("ROUTE_REASON_").lower() for v in lp.RouteReason.values()}


def _varint(n: int) -> bytes:
    out = bytearray()
    while n > 0x7F:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


@dataclass(slots=True)
class Forward:
    """One chunk on its way to the caller: the actor's encoded ``GenerationChunk`` as received (``raw``), its
    parsed form (read for accounting, never re-encoded) and, on a turn's first chunk, the routing decision."""

    raw: bytes
    chunk: common_pb2.GenerationChunk
    route: lp.RouteInfo | None = None

    def wire(self) -> bytes:
        """The encoded ``TrajectoryGenerateResponse`` (route = field 1, chunk = field 2), built around the
        actor's bytes: byte for byte what serializing ``message()`` gives, without encoding the chunk again."""
        head = b""
        if self.route is not None:
            r = self.route.SerializeToString()
            head = b"\x0a" + _varint(len(r)) + r
        return head + b"\x12" + _varint(len(self.raw)) + self.raw

    def message(self) -> lp.TrajectoryGenerateResponse:
        resp = lp.TrajectoryGenerateResponse(chunk=self.chunk)
        if self.route is not None:
            resp.route.CopyFrom(self.route)
        return resp


class TurnError(errors.ServiceError):
    """Ends a turn with a gRPC status and the retryable-status trailing metadata (llmproxy.proto).

    A ``runtime.errors.ServiceError``: raised from a servicer method, the server's handler wrapper ends the call
    with it; the OpenAI HTTP API maps it to an HTTP status.
    """

    def __init__(self, code: grpc.StatusCode, message: str, trailing: list[tuple[str, str]] | None = None) -> None:
        super().__init__(
            message, trailing=trailing or [(MD_RETRYABLE, "true" if code == grpc.StatusCode.UNAVAILABLE else "false")]
        )
        self.code = code

    @property
    def retryable(self) -> bool:
        return self.code == grpc.StatusCode.UNAVAILABLE


def invalid(message: str) -> TurnError:
    return TurnError(grpc.StatusCode.INVALID_ARGUMENT, message)


def unavailable(message: str, failed_actor: str = "", streamed: int = 0) -> TurnError:
    md = [(MD_RETRYABLE, "true"), (MD_TOKENS, str(streamed))]
    if failed_actor:
        md.append((MD_FAILED_ACTOR, failed_actor))
    return TurnError(grpc.StatusCode.UNAVAILABLE, message, md)


class _ActorFailed(Exception):
    """The actor failed the turn in a way another actor may not (dead, unreachable, wrong version)."""

    def __init__(self, actor: ActorEntry, message: str, dead: bool) -> None:
        super().__init__(message)
        self.actor = actor
        self.message = message
        self.dead = dead


def check_id(name: str, value: str, required: bool = True) -> None:
    """The one id rule (``rollart.runtime.ids``), failing as a non-retryable TurnError."""
    try:
        ids.check_id(name, value, required=required)
    except errors.InvalidArgument as exc:
        raise invalid(exc.details()) from None


def check_input(inp: common_pb2.ModelInput, where: str = "input") -> None:
    given = sum((bool(inp.token_ids), bool(inp.messages), bool(inp.text)))
    if given != 1:
        raise invalid(f"{where} must set exactly one of token_ids, messages or text (got {given})")
    if inp.token_ids and min(inp.token_ids) < 0:
        raise invalid(f"{where}.token_ids must not be negative")
    for i, m in enumerate(inp.messages):
        if not m.role:
            raise invalid(f"{where}.messages[{i}].role is required")


def check_sampling(s: common_pb2.SamplingParams) -> None:
    if s.max_tokens <= 0:
        raise invalid("sampling.max_tokens is required and must be > 0")
    if s.temperature < 0:
        raise invalid("sampling.temperature must be >= 0")
    if not 0 <= s.top_p <= 1:
        raise invalid("sampling.top_p must be within [0, 1]")
    if s.top_k < -1:
        raise invalid("sampling.top_k must be >= -1")
    if s.repetition_penalty < 0:
        raise invalid("sampling.repetition_penalty must be >= 0")


def prompt_estimate(inp: common_pb2.ModelInput) -> int:
    """Prompt tokens, exact for token ids, a rough estimate for text (corrected once the actor answers)."""
    if inp.token_ids:
        return len(inp.token_ids)
    if inp.messages:
        return sum(len(m.content) for m in inp.messages) // 3 + 4 * len(inp.messages)
    return len(inp.text) // 3 + 1


class ActorClient:
    """The channels of one actor: ``stub`` (control calls: status, abort, tokenize) and ``generate`` (the hot
    path: responses arrive as the actor's encoded bytes, which the proxy forwards without re-encoding).

    ``generate`` runs over a second channel without client interceptors: a grpc.aio interceptor puts a task and an
    extra async iterator around every call and message (measured: the largest share of the proxy's per-turn CPU
    after gRPC itself). What the interceptors did is done inline in ``Proxy._stream``: the job token, trace
    context and trajectory baggage in the metadata, a client span when the turn's span is recorded.
    """

    def __init__(self, endpoint: str, cfg: LLMProxyConfig) -> None:
        self.endpoint = endpoint
        token = cfg.token()
        # No idempotent methods: a dead actor must fail calls at once (no wait_for_ready, no transparent retry).
        self.channel = channel(endpoint, token=token, tls=cfg.tls, default_timeout=30.0, stream_timeout=None)
        self.stub = actor_pb2_grpc.ActorStub(self.channel)
        self.auth: tuple[tuple[str, str], ...] = (bearer(token),) if token is not None else ()
        # No retry machinery on this channel: Generate is never retried by gRPC (the proxy routes a failed turn
        # again itself).
        self.stream_channel = bare_channel(endpoint, cfg.tls)
        self.generate: aio.UnaryStreamMultiCallable[actor_pb2.ActorGenerateRequest, bytes]
        self.generate = self.stream_channel.unary_stream(
            GENERATE_METHOD,
            request_serializer=actor_pb2.ActorGenerateRequest.SerializeToString,
            response_deserializer=None,  # bytes: parsed once for accounting, forwarded as received
        )

    async def close(self) -> None:
        await self.channel.close()
        await self.stream_channel.close()


@dataclass(eq=False)
class Turn:
    request_id: str
    trajectory_id: str
    lease_id: str
    abort_future: asyncio.Future
    aborted: bool = False
    # Set when the proxy cuts the turn because its actor was removed or died (UNAVAILABLE).
    failed: str = ""
    actor: ActorEntry | None = None
    actor_request_id: str = ""
    call: aio.UnaryStreamCall | None = None
    streamed: int = 0
    cut_handle: asyncio.TimerHandle | None = None
    # PD: prompt tokens the prefill actor computed (not from its prefix cache), for the task's profile.
    prefill_uncached: int = 0

    def cut(self) -> None:
        if self.call is not None and not self.call.done():
            self.call.cancel()


class Proxy:
    def __init__(self, cfg: LLMProxyConfig) -> None:
        self.cfg = cfg
        self.router = Router(cfg.max_sticky_trajectories, AutoSettings(**cfg.auto_affinity.model_dump()))
        self.gate = AdmissionGate(cfg.max_waiting_requests)
        self.clients: dict[str, ActorClient] = {}
        self.turns: dict[str, Turn] = {}
        self.by_trajectory: dict[str, set[Turn]] = {}
        self.tokenizer = LocalTokenizer(cfg.tokenizer_dir) if cfg.tokenizer_dir else None
        self.tracer = _tracer("rollart.client")
        # Request ids the proxy makes up: unique per process (prefix) and per turn (counter), no uuid per turn.
        self._rid_prefix = f"{os.getpid():x}{int(time.time() * 1000) & 0xFFFFFF:x}"
        self._rid_counter = itertools.count(1)
        # Metric children by label values: ``labels()`` hashes and checks its arguments on every call.
        self._requests_metric: dict[tuple[str, str], object] = {}
        self._actor_gauges: dict[str, tuple] = {}
        self.requests_total = 0
        self.actor_failures = 0
        self.aborted_total = 0
        self.plan_step = 0
        self.openai_base_url = ""
        # Actors removed by hand stay out even when the resource manager still lists them (until AddActor).
        self.removed_by_hand: set[str] = set()
        # True once membership reflects the resource manager (or there is none): only then is "no actor was
        # ever registered for this task" final.
        self.synced = cfg.resource_manager is None
        self._changed = asyncio.Event()
        self._pollers: dict[str, asyncio.Task] = {}
        self._poll_now: dict[str, asyncio.Event] = {}
        self._background: set[asyncio.Task] = set()
        for a in cfg.actors:
            self.add_actor(
                a.actor_id,
                a.endpoint,
                pool=a.pool,
                region=a.region,
                hardware=common_pb2.Hardware(tags=a.tags),
                pd_role=PD_ROLE_NAMES[a.pd_role],
                static=True,
                poll=False,
            )
        for r in cfg.affinity:
            kind = {
                "gpu-compute": common_pb2.POOL_KIND_GPU_COMPUTE,
                "gpu-bandwidth": common_pb2.POOL_KIND_GPU_BANDWIDTH,
                "cpu": common_pb2.POOL_KIND_CPU,
                "serverless": common_pb2.POOL_KIND_SERVERLESS,
            }.get(r.pool_kind, common_pb2.POOL_KIND_UNSPECIFIED)
            rule = lp.AffinityRule(
                task=r.task,
                pool=r.pool,
                binding_id=r.binding_id,
                pool_kind=kind,
                hardware_tags=r.hardware_tags,
                allow_fallback=r.allow_fallback,
                auto=r.auto,
            )
            self.set_affinity([rule], merge=True)
        if cfg.pd:
            self.set_pd([lp.PdPoolConfig(**p.model_dump()) for p in cfg.pd], merge=False)

    # -------------------------------------------------------------------------------------------- lifecycle

    async def start(self) -> None:
        for actor_id in list(self.router.actors):
            self._start_poller(actor_id)

    async def stop(self) -> None:
        for task in [*self._pollers.values(), *self._background]:
            task.cancel()
        await asyncio.gather(*self._pollers.values(), *self._background, return_exceptions=True)
        for client in self.clients.values():
            await client.close()
        self.clients.clear()

    def spawn(self, coro, name: str) -> asyncio.Task:
        task = asyncio.get_running_loop().create_task(coro, name=name)
        self._background.add(task)
        task.add_done_callback(self._background.discard)
        return task

    def changed(self) -> None:
        """Wakes turns that wait for a usable actor."""
        self._changed.set()
        self._changed = asyncio.Event()

    # ------------------------------------------------------------------------------------------- membership

    def add_actor(
        self,
        actor_id: str,
        endpoint: str,
        *,
        pool: str = "",
        region: str = "",
        hardware: common_pb2.Hardware | None = None,
        pd_role: common_pb2.PdRole = common_pb2.PD_ROLE_UNSPECIFIED,
        static: bool = False,
        from_rm: bool = False,
        binding_ids: set[str] | None = None,
        poll: bool = True,
    ) -> ActorEntry:
        entry = self.router.actors.get(actor_id)
        if entry is None:
            entry = self.router.add(ActorEntry(actor_id=actor_id, endpoint=endpoint))
            self.clients[actor_id] = ActorClient(endpoint, self.cfg)
        elif entry.endpoint != endpoint:
            # Same id, new address (a restarted actor): new channel, and its state is unknown again.
            old = self.clients.pop(actor_id, None)
            if old is not None:
                self.spawn(old.close(), f"close-{actor_id}")
            entry.endpoint = endpoint
            entry.ready = False
            entry.version_known = False
            self.clients[actor_id] = ActorClient(endpoint, self.cfg)
        if pool:
            entry.pool = pool
        if region:
            entry.region = region
        if hardware is not None and (hardware.ByteSize() or not entry.hardware.ByteSize()):
            entry.hardware = hardware
        if pd_role:
            entry.pd_role = pd_role
        entry.static = entry.static or static
        entry.from_rm = entry.from_rm or from_rm
        if binding_ids is not None:
            entry.binding_ids = set(binding_ids)
        if entry.state == DRAINING and static:
            entry.state = HEALTHY  # added again by hand: routable again
        if poll:
            self._start_poller(actor_id)
        self._export(entry)
        self.changed()
        return entry

    def remove_actor(self, actor_id: str, abort_in_flight: bool, by_hand: bool = True) -> bool:
        entry = self.router.actors.get(actor_id)
        if by_hand:
            self.removed_by_hand.add(actor_id)
        if entry is None:
            return False
        in_flight = [t for t in self.turns.values() if t.actor is entry]
        if abort_in_flight or not in_flight:
            for t in in_flight:
                t.failed = f"actor {actor_id} was removed"
                t.cut()
            if in_flight:
                self._forward_abort(entry, [t.actor_request_id for t in in_flight], [], "actor removed")
            self._finalize_removal(entry)
        else:
            entry.state = DRAINING  # finalized when its last turn ends
        self.changed()
        return True

    def _finalize_removal(self, entry: ActorEntry) -> None:
        self.router.remove(entry.actor_id)
        task = self._pollers.pop(entry.actor_id, None)
        if task is not None:
            task.cancel()
        self._poll_now.pop(entry.actor_id, None)
        client = self.clients.pop(entry.actor_id, None)
        if client is not None:
            self.spawn(client.close(), f"close-{entry.actor_id}")
        self._actor_gauges.pop(entry.actor_id, None)
        for gauge in metrics.PER_ACTOR:  # a removed actor's series go with it: the label set stays bounded
            try:
                gauge.remove(entry.actor_id)
            except KeyError:
                pass

    def _export(self, a: ActorEntry) -> None:
        gauges = self._actor_gauges.get(a.actor_id)
        if gauges is None:
            gauges = self._actor_gauges[a.actor_id] = (
                metrics.OUTSTANDING_TOKENS.labels(a.actor_id),
                metrics.OUTSTANDING_REQUESTS.labels(a.actor_id),
                metrics.ACTOR_HEALTHY.labels(a.actor_id),
                metrics.TOKENS.labels(a.actor_id),
            )
        gauges[0].set(a.outstanding_tokens)
        gauges[1].set(a.outstanding_requests)
        gauges[2].set(1 if a.routable() else 0)

    def _tokens_metric(self, a: ActorEntry):
        gauges = self._actor_gauges.get(a.actor_id)
        return gauges[3] if gauges is not None else metrics.TOKENS.labels(a.actor_id)

    def _count(self, reason: str, outcome: str) -> None:
        child = self._requests_metric.get((reason, outcome))
        if child is None:
            child = self._requests_metric[(reason, outcome)] = metrics.REQUESTS.labels(reason, outcome)
        child.inc()  # type: ignore[attr-defined]

    def _start_poller(self, actor_id: str) -> None:
        old = self._pollers.get(actor_id)
        if old is not None and not old.done():
            ev = self._poll_now.get(actor_id)
            if ev is not None:
                ev.set()
            return
        self._poll_now[actor_id] = asyncio.Event()
        self._pollers[actor_id] = asyncio.get_running_loop().create_task(
            self._poll_loop(actor_id), name=f"status-{actor_id}"
        )

    def poll_soon(self, actor_id: str) -> None:
        ev = self._poll_now.get(actor_id)
        if ev is not None:
            ev.set()

    async def _poll_loop(self, actor_id: str) -> None:
        while True:
            entry = self.router.actors.get(actor_id)
            client = self.clients.get(actor_id)
            if entry is None or client is None:
                return
            await self.poll_once(entry, client)
            ev = self._poll_now.get(actor_id)
            if ev is None:
                return
            try:
                await asyncio.wait_for(ev.wait(), self.cfg.status_interval_seconds)
            except TimeoutError:
                pass
            ev.clear()

    async def poll_once(self, entry: ActorEntry, client: ActorClient, timeout: float | None = None) -> None:
        sent = time.monotonic()
        try:
            st = await client.stub.GetStatus(
                actor_pb2.ActorStatusRequest(), timeout=timeout or self.cfg.status_timeout_seconds
            )
        except aio.AioRpcError as exc:
            self._status_failed(entry, exc, sent)
            return
        if client is not self.clients.get(entry.actor_id):
            return  # the endpoint changed meanwhile
        before = (entry.routable(), entry.active_version, entry.version_known)
        entry.ready = st.ready
        entry.failures = 0
        entry.failing_since = 0.0
        entry.last_ok = time.time()
        if entry.state == UNHEALTHY:
            entry.state = HEALTHY
            log.info("actor healthy again", extra=log_fields(actor_id=entry.actor_id))
        if st.weights.loaded:
            entry.observe_version(st.weights.active_version)
        entry.model = st.model or entry.model
        entry.max_model_len = st.max_model_len or entry.max_model_len
        entry.tokens_per_s = st.tokens_per_s
        entry.self_draining = st.draining
        if st.pd_role:
            entry.pd_role = st.pd_role
        entry.pool = entry.pool or st.pool
        entry.region = entry.region or st.region
        if not entry.hardware.ByteSize() and st.hardware.ByteSize():
            entry.hardware.CopyFrom(st.hardware)
        self._export(entry)
        if before != (entry.routable(), entry.active_version, entry.version_known):
            self.changed()

    def _status_failed(self, entry: ActorEntry, exc: aio.AioRpcError, sent: float | None = None) -> None:
        entry.failures += 1
        entry.last_error = f"GetStatus: {exc.code().name}: {exc.details()}"
        if not entry.failing_since:
            entry.failing_since = sent if sent is not None else time.monotonic()
        silent = time.monotonic() - entry.failing_since
        refused = exc.code() == grpc.StatusCode.UNAVAILABLE
        # Hung: it has not answered for hung_after_seconds. Its streams would stall until it wakes (a SIGSTOP,
        # a wedged engine): cut them now so their turns go elsewhere.
        hung = silent >= self.cfg.hung_after_seconds
        if entry.state == HEALTHY and (refused or hung or entry.failures >= self.cfg.unhealthy_after_failures):
            self.mark_unhealthy(entry, entry.last_error, cut_in_flight=refused or hung)
        elif hung:
            self._cut_in_flight(entry, f"actor {entry.actor_id} has not answered for {silent:.1f}s (hung)")

    def mark_unhealthy(self, entry: ActorEntry, why: str, cut_in_flight: bool = False) -> None:
        if entry.state == DRAINING:
            if cut_in_flight:  # removed but still serving its last turns: those must not wait for it either
                self._cut_in_flight(entry, f"actor {entry.actor_id} is unreachable: {why}")
            return
        if entry.state == HEALTHY:
            log.warning("actor unhealthy", extra=log_fields(actor_id=entry.actor_id, error=why))
        entry.state = UNHEALTHY
        entry.last_error = why
        self._export(entry)
        if cut_in_flight:
            # Unreachable or hung: its streams are broken or stalled; end them now with the retryable status.
            self._cut_in_flight(entry, f"actor {entry.actor_id} is unreachable: {why}")
        self.changed()

    def _cut_in_flight(self, entry: ActorEntry, why: str) -> int:
        """Ends the actor's in-flight turns as failed (retryable UNAVAILABLE, or routed again when nothing was
        streamed yet) and tells the actor to abort them, should it wake up. Returns how many were cut."""
        cut = [t for t in self.turns.values() if t.actor is entry and not t.failed]
        for t in cut:
            t.failed = why
            t.cut()
        if cut:
            log.warning("in-flight turns cut", extra=log_fields(actor_id=entry.actor_id, turns=len(cut), why=why))
            self._forward_abort(entry, [t.actor_request_id for t in cut], [], why[:200])
        return len(cut)

    # --------------------------------------------------------------------------------------------- settings

    def set_affinity(self, rules: list[lp.AffinityRule], merge: bool) -> None:
        from .router import Rule, check_rule

        seen: set[str] = set()
        new: dict[str, Rule] = {}
        for i, r in enumerate(rules):
            if r.from_binding:
                continue  # output-only rules derived from bindings
            problem = check_rule(r)
            if problem:
                raise invalid(f"rules[{i}]: {problem}")
            if r.task in seen:
                raise invalid(f"rules[{i}]: task {r.task!r} appears twice")
            if r.pool and not r.allow_fallback and self.cfg.resource_manager and self.synced:
                # Only a resource manager's view is complete enough to say a pool does not exist.
                known = set(self.router.pools) | {a.pool for a in self.router.actors.values()}
                if r.pool not in known:
                    raise invalid(f"rules[{i}].pool: no pool named {r.pool!r} exists and allow_fallback is false")
            seen.add(r.task)
            new[r.task] = Rule.from_proto(r)
        if merge:
            self.router.rules.update(new)
        else:
            self.router.rules = new
        self.changed()

    def affinity_table(self) -> lp.AffinityTable:
        out = lp.AffinityTable(rules=[r.to_proto() for r in self.router.rules.values()])
        for task, rule in self.router.derived_rules.items():
            if task not in self.router.rules:
                p = rule.to_proto()
                p.from_binding = True
                out.rules.append(p)
        out.profiles.extend(p.to_proto() for p in self.router.profiles.values())
        return out

    def set_pd(self, pools: list[lp.PdPoolConfig], merge: bool) -> None:
        seen: set[str] = set()
        new: dict[str, lp.PdPoolConfig] = {}
        for i, p in enumerate(pools):
            if not p.pool:
                raise invalid(f"pools[{i}].pool is required")
            if p.pool in seen:
                raise invalid(f"pools[{i}]: pool {p.pool!r} appears twice")
            if p.min_prompt_tokens < 0:
                raise invalid(f"pools[{i}].min_prompt_tokens must be >= 0")
            both = set(p.prefill_actor_ids) & set(p.decode_actor_ids)
            if both:
                raise invalid(f"pools[{i}]: actors {sorted(both)} are both prefill and decode")
            if p.kv_connector_config_json:
                try:
                    json.loads(p.kv_connector_config_json)
                except ValueError as exc:
                    raise invalid(f"pools[{i}].kv_connector_config_json is not JSON: {exc}") from None
            seen.add(p.pool)
            cfg = lp.PdPoolConfig()
            cfg.CopyFrom(p)
            new[p.pool] = cfg
        if merge:
            self.router.pd.update(new)
        else:
            self.router.pd = new
        self.changed()

    def pd_routing(self) -> lp.PdRouting:
        return lp.PdRouting(pools=list(self.router.pd.values()))

    def set_window(self, window: lp.VersionWindow) -> lp.VersionWindow:
        if window.min_version < 0 or window.max_version < 0:
            raise invalid("versions must be >= 0")
        if window.max_version and window.max_version < window.min_version:
            raise invalid(f"max_version {window.max_version} is below min_version {window.min_version}")
        self.router.window = lp.VersionWindow(min_version=window.min_version, max_version=window.max_version)
        self.changed()
        return self.router.window

    # ---------------------------------------------------------------------------------------------- views

    def proxy_actor(self, a: ActorEntry, sticky: dict[str, int]) -> lp.ProxyActor:
        out = lp.ProxyActor(
            actor_id=a.actor_id,
            endpoint=a.endpoint,
            pool=a.pool,
            region=a.region,
            hardware=a.hardware,
            pd_role=a.pd_role or common_pb2.PD_ROLE_UNIFIED,
            state=DRAINING if a.self_draining and a.state == HEALTHY else a.state,
            source=lp.ACTOR_SOURCE_STATIC if a.static else lp.ACTOR_SOURCE_BINDING,
            binding_id=",".join(sorted(a.binding_ids)),
            active_version=a.active_version,
            outstanding_requests=a.outstanding_requests,
            outstanding_tokens=a.outstanding_tokens,
            sticky_trajectories=sticky.get(a.actor_id, 0),
            tokens_per_s=a.tokens_per_s,
            step_allocation=a.step_allocation,
            last_error=a.last_error,
            model=a.model,
            ready=a.ready,
            version_known=a.version_known,
        )
        if a.last_ok:
            out.last_ok.CopyFrom(_ts(a.last_ok))
        return out

    def list_actors(self, pool: str = "") -> list[lp.ProxyActor]:
        sticky = self.router.sticky_counts()
        return [
            self.proxy_actor(a, sticky)
            for a in sorted(self.router.actors.values(), key=lambda a: a.actor_id)
            if not pool or a.pool == pool
        ]

    def admission_state(self) -> lp.AdmissionState:
        g = self.gate
        out = lp.AdmissionState(
            suspended=g.suspended,
            reason=g.reason,
            waiting_requests=g.waiting,
            in_flight_requests=sum(1 for t in self.turns.values() if t.actor is not None),
        )
        if g.suspended:
            out.since.CopyFrom(_ts(g.since))
        return out

    def suspend(self, reason: str, step: int) -> lp.AdmissionState:
        if self.gate.suspend(reason, step):
            log.info("suspended", extra=log_fields(reason=reason, step=step))
        metrics.SUSPENDED.set(1)
        return self.admission_state()

    def resume(self) -> lp.AdmissionState:
        released, lasted = self.gate.resume()
        metrics.SUSPENDED.set(0)
        if lasted:
            log.info("resumed", extra=log_fields(released=released, suspended_s=round(lasted, 4)))
        out = self.admission_state()
        out.released = released
        out.suspended_for.CopyFrom(_dur(lasted))
        return out

    def status(self) -> lp.ProxyStatus:
        actors = list(self.router.actors.values())
        return lp.ProxyStatus(
            admission=self.admission_state(),
            actors=len(actors),
            healthy_actors=sum(1 for a in actors if a.routable()),
            sticky_trajectories=len(self.router.sticky),
            requests_total=self.requests_total,
            actor_failures=self.actor_failures,
            aborted_total=self.aborted_total,
            version_window=self.router.window,
            affinity=self.affinity_table(),
            pd=self.pd_routing(),
            openai_base_url=self.openai_base_url,
            plan_step=self.plan_step,
        )

    def models(self) -> list[str]:
        names = {a.model for a in self.router.actors.values() if a.model}
        if self.cfg.served_model_name:
            names.add(self.cfg.served_model_name)
        return sorted(names)

    # ---------------------------------------------------------------------------------------------- abort

    def abort(
        self, trajectory_ids: list[str], reason: str = "", lease_ids: Sequence[str] = ()
    ) -> lp.ProxyAbortResponse:
        hit: list[Turn] = []
        for tid in trajectory_ids:
            hit.extend(self.by_trajectory.get(tid, ()))
        if lease_ids:
            leases = set(lease_ids)
            hit.extend(t for t in self.turns.values() if t.lease_id and t.lease_id in leases)
        per_actor: dict[str, tuple[ActorEntry, list[str], set[str]]] = {}
        ended: set[str] = set()
        count = 0
        for t in dict.fromkeys(hit):  # de-duplicated, in order
            if t.aborted:
                continue
            t.aborted = True
            count += 1
            ended.add(t.trajectory_id)
            if not t.abort_future.done():
                t.abort_future.set_result(None)
            if t.actor is not None:
                slot = per_actor.setdefault(t.actor.actor_id, (t.actor, [], set()))
                slot[1].append(t.actor_request_id)
                slot[2].add(t.trajectory_id)
                # If the actor does not end the stream soon (or never saw the request), cut it here.
                t.cut_handle = asyncio.get_running_loop().call_later(self.cfg.abort_grace_seconds, t.cut)
        for actor, rids, tids in per_actor.values():
            self._forward_abort(actor, rids, sorted(tids), reason or "proxy abort")
        if count:
            self.aborted_total += count
            metrics.ABORTED.inc(count)
            log.info("aborted", extra=log_fields(requests=count, trajectories=sorted(ended), reason=reason))
        return lp.ProxyAbortResponse(aborted_requests=count, aborted_trajectory_ids=sorted(ended))

    def _forward_abort(self, actor: ActorEntry, request_ids: list[str], trajectory_ids: list[str], why: str) -> None:
        client = self.clients.get(actor.actor_id)
        if client is None:
            return

        async def send() -> None:
            try:
                await client.stub.Abort(
                    actor_pb2.ActorAbortRequest(request_ids=request_ids, trajectory_ids=trajectory_ids, reason=why),
                    timeout=self.cfg.abort_grace_seconds,
                )
            except aio.AioRpcError as exc:
                log.warning("abort not delivered", extra=log_fields(actor_id=actor.actor_id, error=exc.details()))

        self.spawn(send(), f"abort-{actor.actor_id}")

    # ------------------------------------------------------------------------------------------- tokenize

    async def tokenize(self, task: str, req: common_pb2.TokenizeRequest, timeout: float) -> common_pb2.TokenizeResponse:
        check_input(req.input, "request.input")
        if self.tokenizer is not None:
            try:
                ids, rendered = self.tokenizer.tokenize(req.input, req.add_special_tokens)
            except Exception as exc:  # noqa: BLE001 - template errors are the caller's input
                raise invalid(f"cannot tokenize: {exc}") from None
            return common_pb2.TokenizeResponse(
                token_ids=ids,
                rendered=rendered,
                model=self.cfg.served_model_name or self._any_model(),
                max_model_len=self.tokenizer.model_max_length,
            )
        exclude: set[str] = set()
        deadline = time.monotonic() + timeout
        for attempt in range(self.cfg.max_route_attempts):
            try:
                # Tokenizing does not depend on the version: any ready actor of the task's scope will do.
                route = self.router.route(trajectory_id="", task=task, min_version=0, exclude=exclude)
            except NoRoute as exc:
                raise (
                    unavailable(str(exc)) if exc.retryable else TurnError(grpc.StatusCode.FAILED_PRECONDITION, str(exc))
                ) from None
            client = self.clients.get(route.actor.actor_id)
            if client is None:
                exclude.add(route.actor.actor_id)
                continue
            remaining = max(deadline - time.monotonic(), 0.001)
            last = attempt == self.cfg.max_route_attempts - 1
            # One actor gets at most the hang bound: a hung actor must not spend the caller's whole deadline.
            budget = remaining if last else min(remaining, self.cfg.hung_after_seconds)
            try:
                return await client.stub.Tokenize(req, timeout=budget)
            except aio.AioRpcError as exc:
                hung = exc.code() == grpc.StatusCode.DEADLINE_EXCEEDED and budget < remaining
                if exc.code() != grpc.StatusCode.UNAVAILABLE and not hung:
                    raise TurnError(exc.code(), exc.details() or exc.code().name) from None
                if not hung:
                    self.mark_unhealthy(route.actor, f"Tokenize: {exc.details()}")
                exclude.add(route.actor.actor_id)
        raise unavailable("no actor could tokenize the input")

    def _any_model(self) -> str:
        models = self.models()
        return models[0] if models else ""

    # ---------------------------------------------------------------------------------------------- turns

    def _deadline(self, req: lp.TrajectoryGenerateRequest, time_remaining: float | None) -> float:
        now = time.monotonic()
        budget = self.cfg.default_deadline_seconds
        if req.HasField("deadline"):
            budget = req.deadline.ToNanoseconds() / 1e9 - time.time()
        if time_remaining is not None:
            budget = min(budget, time_remaining) if req.HasField("deadline") else time_remaining
        if budget <= 0:
            raise TurnError(grpc.StatusCode.DEADLINE_EXCEEDED, "the turn's deadline has already passed")
        return now + budget

    def validate(self, req: lp.TrajectoryGenerateRequest) -> None:
        check_id("trajectory_id", req.trajectory_id)
        check_id("request_id", req.request_id, required=False)
        check_id("lease_id", req.lease_id, required=False)
        check_id("preferred_actor_id", req.preferred_actor_id, required=False)
        if len(req.task) > MAX_ID:
            raise invalid(f"task must be at most {MAX_ID} characters")
        if not req.HasField("input"):
            raise invalid("input is required")
        check_input(req.input)
        if not req.HasField("sampling"):
            raise invalid("sampling is required (sampling.max_tokens > 0)")
        check_sampling(req.sampling)
        if req.min_version < 0:
            raise invalid("min_version must be >= 0")
        if req.turn < 0:
            raise invalid("turn must be >= 0")
        if not 0 <= req.chunk_tokens <= 1 << 20:
            raise invalid("chunk_tokens must be >= 0")

    async def generate(
        self, req: lp.TrajectoryGenerateRequest, time_remaining: float | None = None
    ) -> AsyncGenerator[lp.TrajectoryGenerateResponse, None]:
        """The turn's responses; raises TurnError for a failed turn (see the module docstring)."""
        async for item in self.generate_items(req, time_remaining):
            yield item.message() if isinstance(item, Forward) else item

    async def generate_wire(
        self, req: lp.TrajectoryGenerateRequest, time_remaining: float | None = None
    ) -> AsyncGenerator[bytes, None]:
        """``generate``'s responses, encoded: the actor's chunk bytes are forwarded as received."""
        async for item in self.generate_items(req, time_remaining):
            yield item.wire() if isinstance(item, Forward) else item.SerializeToString()

    async def generate_items(
        self, req: lp.TrajectoryGenerateRequest, time_remaining: float | None = None
    ) -> AsyncGenerator[Forward | lp.TrajectoryGenerateResponse, None]:
        """The turn: forwarded chunks, or a response the proxy makes itself (an aborted turn's last chunk)."""
        received = time.monotonic()
        self.validate(req)
        deadline = self._deadline(req, time_remaining)
        rid = req.request_id or f"{req.trajectory_id}:{req.turn}:{self._rid_prefix}.{next(self._rid_counter):x}"
        if rid in self.turns:
            raise TurnError(grpc.StatusCode.ALREADY_EXISTS, f"request {rid!r} is in flight")
        turn = Turn(rid, req.trajectory_id, req.lease_id, asyncio.get_running_loop().create_future())
        self.turns[rid] = turn
        self.by_trajectory.setdefault(turn.trajectory_id, set()).add(turn)
        try:
            async for resp in self._run_turn(turn, req, deadline, received):
                yield resp
        finally:
            if turn.cut_handle is not None:
                turn.cut_handle.cancel()
            self.turns.pop(rid, None)
            group = self.by_trajectory.get(turn.trajectory_id)
            if group is not None:
                group.discard(turn)
                if not group:
                    del self.by_trajectory[turn.trajectory_id]

    def _aborted_chunk(self, turn: Turn) -> lp.TrajectoryGenerateResponse:
        return lp.TrajectoryGenerateResponse(
            chunk=common_pb2.GenerationChunk(
                request_id=turn.request_id,
                trajectory_id=turn.trajectory_id,
                actor_id=turn.actor.actor_id if turn.actor is not None else "",
                offset=turn.streamed,
                finish_reason=ABORTED,
            )
        )

    async def _run_turn(
        self, turn: Turn, req: lp.TrajectoryGenerateRequest, deadline: float, received: float
    ) -> AsyncIterator[Forward | lp.TrajectoryGenerateResponse]:
        waited = 0.0
        if self.gate.suspended:
            metrics.WAITERS.inc()
            try:
                waited = await self.gate.admit(deadline, turn.abort_future)
            except AdmissionTimeout as exc:
                raise TurnError(grpc.StatusCode.DEADLINE_EXCEEDED, str(exc)) from None
            except AdmissionRefused as exc:
                raise unavailable(str(exc)) from None
            finally:
                metrics.WAITERS.dec()
            metrics.ADMISSION_WAIT.observe(waited)
        if turn.aborted:
            self._count("none", "aborted")
            yield self._aborted_chunk(turn)
            return
        exclude: set[str] = set()
        last_failure: _ActorFailed | None = None
        for attempt in range(self.cfg.max_route_attempts):
            route = await self._route(turn, req, deadline, exclude, last_failure)
            if route is None:  # aborted while waiting for an actor
                self._count("none", "aborted")
                yield self._aborted_chunk(turn)
                return
            if attempt:
                route.reason = lp.ROUTE_REASON_RETRY
            reason = (
                _REASONS.get(route.reason) or lp.RouteReason.Name(route.reason).removeprefix("ROUTE_REASON_").lower()
            )
            self.requests_total += 1
            try:
                async for resp in self._dispatch(turn, req, route, deadline, waited, received, attempt):
                    yield resp
                outcome = "aborted" if turn.aborted else "ok"
                self._count(reason, outcome)
                return
            except _ActorFailed as exc:
                if turn.aborted:  # cut by Abort: not the actor's fault, the trajectory keeps its actor
                    self._count(reason, "aborted")
                    yield self._aborted_chunk(turn)
                    return
                last_failure = exc
                exclude.add(exc.actor.actor_id)
                self.router.mark_failed(turn.trajectory_id, exc.actor.actor_id)
                if exc.dead:
                    self.actor_failures += 1
                    metrics.ACTOR_FAILURES.labels(exc.actor.actor_id).inc()
                if turn.failed and not turn.streamed:
                    turn.failed = ""  # cut (hung, unreachable, removed) before its first token: route it again
                if turn.streamed or turn.failed or time.monotonic() >= deadline:
                    self._count(reason, "unavailable")
                    raise unavailable(
                        f"actor {exc.actor.actor_id} failed: {exc.message}", exc.actor.actor_id, turn.streamed
                    ) from None
                log.info(
                    "retrying turn on another actor",
                    extra=log_fields(request_id=turn.request_id, failed_actor=exc.actor.actor_id, error=exc.message),
                )
            except TurnError as exc:
                self._count(reason, exc.code.name.lower())
                raise
        assert last_failure is not None
        self._count("retry", "unavailable")
        raise unavailable(
            f"{self.cfg.max_route_attempts} actors failed the turn; last: {last_failure.actor.actor_id}: "
            f"{last_failure.message}",
            last_failure.actor.actor_id,
            turn.streamed,
        )

    async def _route(
        self,
        turn: Turn,
        req: lp.TrajectoryGenerateRequest,
        deadline: float,
        exclude: set[str],
        last_failure: _ActorFailed | None,
    ) -> Route | None:
        wait_until = min(deadline, time.monotonic() + self.cfg.route_wait_seconds)
        while True:
            try:
                return self.router.route(
                    trajectory_id=req.trajectory_id,
                    task=req.task,
                    preferred_actor_id=req.preferred_actor_id,
                    min_version=req.min_version,
                    exclude=exclude,
                )
            except NoRoute as exc:
                failed = last_failure.actor.actor_id if last_failure is not None else ""
                if not exc.retryable and self.synced:
                    raise TurnError(grpc.StatusCode.FAILED_PRECONDITION, str(exc)) from None
                remaining = wait_until - time.monotonic()
                if remaining <= 0:
                    if time.monotonic() >= deadline:
                        raise TurnError(
                            grpc.StatusCode.DEADLINE_EXCEEDED, f"deadline passed waiting for an actor: {exc}"
                        ) from None
                    if not exc.retryable:
                        raise TurnError(grpc.StatusCode.FAILED_PRECONDITION, str(exc)) from None
                    raise unavailable(str(exc), failed, turn.streamed) from None
                changed = asyncio.ensure_future(self._changed.wait())
                try:
                    await asyncio.wait(
                        {changed, turn.abort_future}, timeout=remaining, return_when=asyncio.FIRST_COMPLETED
                    )
                finally:
                    changed.cancel()
                if turn.aborted:
                    return None

    async def _tokens(self, actor: ActorEntry, inp: common_pb2.ModelInput, deadline: float) -> list[int]:
        if inp.token_ids:
            return list(inp.token_ids)
        if self.tokenizer is not None:
            try:
                return self.tokenizer.tokenize(inp)[0]
            except Exception as exc:  # noqa: BLE001 - a template error is the caller's input
                raise invalid(f"cannot tokenize the input: {exc}") from None
        client = self.clients.get(actor.actor_id)
        if client is None:
            raise _ActorFailed(actor, "actor was removed", dead=False)
        try:
            resp = await client.stub.Tokenize(
                common_pb2.TokenizeRequest(input=inp), timeout=max(deadline - time.monotonic(), 0.001)
            )
        except aio.AioRpcError as exc:
            if exc.code() == grpc.StatusCode.UNAVAILABLE:
                self.mark_unhealthy(actor, f"Tokenize: {exc.details()}")
                raise _ActorFailed(actor, f"Tokenize: {exc.details()}", dead=True) from None
            raise TurnError(exc.code(), f"actor {actor.actor_id} Tokenize: {exc.details()}") from None
        return list(resp.token_ids)

    async def _dispatch(
        self,
        turn: Turn,
        req: lp.TrajectoryGenerateRequest,
        route: Route,
        deadline: float,
        waited: float,
        received: float,
        attempt: int,
    ) -> AsyncIterator[Forward | lp.TrajectoryGenerateResponse]:
        actor = route.actor
        lo, _hi = self.router.bounds(req.min_version)
        base_rid = turn.request_id if attempt == 0 else f"{turn.request_id}~r{attempt}"
        inp = req.input
        prefill: ActorEntry | None = None
        kv_params = ""
        if route.pd is not None:
            ids = await self._tokens(actor, inp, deadline)
            if len(ids) >= route.pd.min_prompt_tokens:
                prefill = self.router.choose_prefill(
                    turn.trajectory_id, route.pd, lo, self.router.window.max_version, {actor.actor_id}
                )
            inp = common_pb2.ModelInput(token_ids=ids)  # both phases see the very same tokens
            if prefill is None:
                metrics.PD_TURNS.labels("unified" if len(ids) < route.pd.min_prompt_tokens else "no_prefill").inc()
            else:
                try:
                    kv_params = await self._prefill(turn, req, prefill, inp, lo, base_rid, deadline)
                except _ActorFailed as exc:
                    # The decode actor can compute the prefill itself: fall back to a unified turn there.
                    log.warning(
                        "prefill failed; decoding unified",
                        extra=log_fields(
                            request_id=turn.request_id, prefill_actor=exc.actor.actor_id, error=exc.message
                        ),
                    )
                    metrics.PD_TURNS.labels("prefill_failed").inc()
                    prefill = None
                if turn.aborted:
                    yield self._aborted_chunk(turn)
                    return
                if prefill is not None:
                    metrics.PD_TURNS.labels("split").inc()
        areq = actor_pb2.ActorGenerateRequest(
            request_id=base_rid,
            trajectory_id=turn.trajectory_id,
            input=inp,
            sampling=req.sampling,
            min_version=lo,
            return_text=req.return_text,
            chunk_tokens=req.chunk_tokens or self.cfg.chunk_tokens,
            pd_phase=actor_pb2.PD_PHASE_DECODE if prefill is not None else actor_pb2.PD_PHASE_FULL,
            kv_transfer_params_json=kv_params,
        )
        info = lp.RouteInfo(
            actor_id=actor.actor_id,
            actor_endpoint=actor.endpoint,
            pool=actor.pool,
            reason=route.reason,
            prefill_actor_id=prefill.actor_id if prefill is not None else "",
            actor_version=actor.active_version,
            admission_wait=_dur(waited),
        )
        self.router.stick(turn.trajectory_id, actor.actor_id, prefill.actor_id if prefill is not None else "")
        first = True
        async for raw, chunk in self._stream(turn, actor, areq, prompt_estimate(inp), deadline):
            if chunk.HasField("usage"):  # the last chunk: the task's profile learns the turn's shape
                split = turn.prefill_uncached if prefill is not None else -1  # PD: the prefill side's work
                self.router.observe_turn(req.task, turn.trajectory_id, chunk.usage, prefilled=split)
            if first:
                metrics.TTFT.observe(time.monotonic() - received)
                first = False
                yield Forward(raw, chunk, info)
            else:
                yield Forward(raw, chunk)

    async def _prefill(
        self,
        turn: Turn,
        req: lp.TrajectoryGenerateRequest,
        actor: ActorEntry,
        inp: common_pb2.ModelInput,
        lo: int,
        base_rid: str,
        deadline: float,
    ) -> str:
        sampling = common_pb2.SamplingParams()
        sampling.CopyFrom(req.sampling)
        sampling.max_tokens = 1
        areq = actor_pb2.ActorGenerateRequest(
            request_id=f"{base_rid}~prefill",
            trajectory_id=turn.trajectory_id,
            input=inp,
            sampling=sampling,
            min_version=lo,
            pd_phase=actor_pb2.PD_PHASE_PREFILL,
        )
        # Connectors that find the KV by the prompt (vLLM's ExampleConnector: shared storage) return no
        # parameters; the decode phase still takes a JSON object.
        params = "{}"
        streamed = turn.streamed
        async for _raw, chunk in self._stream(turn, actor, areq, len(inp.token_ids), deadline, prefill=True):
            if chunk.kv_transfer_params_json:
                params = chunk.kv_transfer_params_json
            if chunk.HasField("usage"):
                turn.prefill_uncached = chunk.usage.prompt_tokens - chunk.usage.cached_prompt_tokens
        turn.streamed = streamed  # the prefill's token is not the caller's: the decode generates it again
        return params

    async def _stream(
        self,
        turn: Turn,
        actor: ActorEntry,
        areq: actor_pb2.ActorGenerateRequest,
        prompt_tokens: int,
        deadline: float,
        prefill: bool = False,
    ) -> AsyncIterator[tuple[bytes, common_pb2.GenerationChunk]]:
        """Chunks of one actor call (as received, and parsed), with load accounting; actor failures become
        _ActorFailed."""
        if turn.aborted or turn.failed:  # ended while it was being routed, tokenized or prefilled
            raise _ActorFailed(actor, turn.failed or "aborted", dead=False)
        client = self.clients.get(actor.actor_id)
        if client is None or actor.removed:
            raise _ActorFailed(actor, "actor was removed", dead=False)
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise TurnError(grpc.StatusCode.DEADLINE_EXCEEDED, "the turn's deadline passed")
        # What the client interceptors of rollart.runtime.client add, inline (see ActorClient): the job token,
        # the trace context and the trajectory as baggage; a client span only when the turn's span is recorded.
        metadata: list[tuple[str, str | bytes]] = list(client.auth)
        span = None
        if trace.get_current_span().is_recording():
            span = self.tracer.start_span(GENERATE_METHOD, kind=SpanKind.CLIENT)
            span.set_attribute("rpc.system", "grpc")
            span.set_attribute("rollart.trajectory_id", turn.trajectory_id)
        with trajectory_scope(turn.trajectory_id):
            if span is None:
                inject_metadata(metadata)  # the turn's own (unrecorded) trace context, if any
            else:
                with trace.use_span(span, end_on_exit=False):
                    inject_metadata(metadata)
        call = client.generate(areq, timeout=remaining, metadata=metadata)
        turn.call = call
        turn.actor = actor
        turn.actor_request_id = areq.request_id
        tokens_metric = self._tokens_metric(actor)
        prompt_left = prompt_tokens
        gen_left = areq.sampling.max_tokens
        actor.outstanding_requests += 1
        actor.outstanding_tokens += prompt_left + gen_left
        self._export(actor)
        status = "OK"
        parse = common_pb2.GenerationChunk.FromString
        try:
            async for raw in call:
                chunk = parse(raw)
                n = len(chunk.token_ids)
                delta = min(n, gen_left) + prompt_left
                prompt_left = 0  # the first chunk means the prompt is prefilled
                gen_left -= min(n, gen_left)
                actor.outstanding_tokens -= delta
                if chunk.versions and chunk.versions[-1] > actor.active_version:
                    actor.observe_version(chunk.versions[-1])
                if not prefill:
                    turn.streamed += n
                    tokens_metric.inc(n)
                yield raw, chunk
        except aio.AioRpcError as exc:
            code = exc.code()
            status = code.name
            if turn.aborted and code in (grpc.StatusCode.CANCELLED, grpc.StatusCode.UNAVAILABLE):
                raise _ActorFailed(actor, "aborted", dead=False) from None
            if turn.failed:
                raise _ActorFailed(actor, turn.failed, dead=True) from None
            if code == grpc.StatusCode.UNAVAILABLE:
                self.mark_unhealthy(actor, f"Generate: {exc.details()}")
                self.poll_soon(actor.actor_id)
                raise _ActorFailed(actor, exc.details() or "unavailable", dead=True) from None
            if code == grpc.StatusCode.FAILED_PRECONDITION and not turn.streamed:
                # Most likely its version is now outside the window: refresh it and try another actor.
                actor.version_known = False
                self.poll_soon(actor.actor_id)
                raise _ActorFailed(actor, exc.details() or "failed precondition", dead=False) from None
            if code == grpc.StatusCode.CANCELLED and time.monotonic() < deadline:
                raise _ActorFailed(actor, f"the actor cancelled the call: {exc.details()}", dead=True) from None
            raise TurnError(code, f"actor {actor.actor_id}: {exc.details()}") from None
        except asyncio.CancelledError:
            status = "CANCELLED"
            task = asyncio.current_task()
            if (turn.aborted or turn.failed) and (task is None or not task.cancelling()):
                raise _ActorFailed(actor, turn.failed or "aborted", dead=bool(turn.failed)) from None
            raise
        finally:
            if span is not None:
                span.set_attribute("rpc.grpc.status_code", status)
                if status != "OK":
                    span.set_status(Status(StatusCode.ERROR, status))
                span.end()
            actor.outstanding_requests -= 1
            actor.outstanding_tokens -= prompt_left + gen_left
            if not call.done():
                call.cancel()
            turn.call = None
            if turn.actor is actor:
                turn.actor = None
            self._export(actor)
            if actor.state == DRAINING and actor.outstanding_requests == 0 and actor.actor_id in self.router.actors:
                self._finalize_removal(actor)
