"""The proxy's actor table: which actors exist (static, from the resource manager, added by hand), their health
(a status poller per actor: unhealthy after failures, hung after silence, which cuts their in-flight turns so
those go elsewhere), the routing settings (affinity, PD pools, version window) and the views of them. The turn
pipeline (``core.Proxy``) routes over this table. See docs/llmproxy.md."""

from __future__ import annotations

import asyncio
import logging
import time

import grpc
from grpc import aio

from rollart.runtime.auth import bearer
from rollart.runtime.client import bare_channel, channel
from rollart.runtime.telemetry import log_fields
from rollart.runtime.timeutil import timestamp as _ts
from rollart.v1 import actor_pb2, actor_pb2_grpc, common_pb2
from rollart.v1 import llmproxy_pb2 as pp

from . import metrics, validators
from .config import LLMProxyConfig
from .router import DRAINING, HEALTHY, UNHEALTHY, ActorEntry, AutoSettings, Router
from .turn import Turn, TurnError

log = logging.getLogger(__name__)

PD_ROLE_NAMES = {
    "unified": common_pb2.PD_ROLE_UNIFIED,
    "prefill": common_pb2.PD_ROLE_PREFILL,
    "decode": common_pb2.PD_ROLE_DECODE,
}
GENERATE_METHOD = "/rollart.v1.Actor/Generate"


class ActorClient:
    """The channels of one actor: ``stub`` (control calls: status, abort, tokenize) and ``generate`` (the hot
    path: responses arrive as the actor's encoded bytes, which the proxy forwards without re-encoding).

    ``generate`` runs over a second channel without client interceptors (a grpc.aio interceptor wraps every call
    and message in a task and an async iterator, costly on the hot path). What they did is done inline in
    ``Proxy._stream``: the job token, trace context and trajectory baggage in the metadata, a client span when
    the turn's span is recorded.
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


class ActorTable:
    """The actors, their health and the routing settings; ``turns`` are the turns in flight (by request id), which
    an actor that dies or is removed has cut."""

    def __init__(self, cfg: LLMProxyConfig) -> None:
        self.cfg = cfg
        self.router = Router(cfg.max_sticky_trajectories, AutoSettings(**cfg.auto_affinity.model_dump()))
        self.clients: dict[str, ActorClient] = {}
        self.turns: dict[str, Turn] = {}
        self._actor_gauges: dict[str, tuple] = {}
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
            rule = pp.AffinityRule(
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
            self.set_pd([pp.PdPoolConfig(**p.model_dump()) for p in cfg.pd], merge=False)

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
        before = (entry.routable(), entry.active_version, entry.version_known, dict(entry.job_versions))
        entry.ready = st.ready
        entry.failures = 0
        entry.failing_since = 0.0
        entry.last_ok = time.time()
        if entry.state == UNHEALTHY:
            entry.state = HEALTHY
            log.info("actor healthy again", extra=log_fields(actor_id=entry.actor_id))
        if st.weights.loaded:
            entry.observe_version(st.weights.active_version)
        entry.job_id = st.job_id
        # Attached jobs: a job whose first adapter is not loaded yet is not served (its turns go elsewhere).
        entry.job_versions = {j: w.active_version for j, w in st.job_weights.items() if w.loaded}
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
        if before != (entry.routable(), entry.active_version, entry.version_known, entry.job_versions):
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

    def set_affinity(self, rules: list[pp.AffinityRule], merge: bool) -> None:
        from .router import Rule

        validators.affinity_rules(rules)
        new: dict[str, Rule] = {}
        for i, r in enumerate(rules):
            if r.from_binding:
                continue  # output-only rules derived from bindings
            if r.pool and not r.allow_fallback and self.cfg.resource_manager and self.synced:
                # Only a resource manager's view is complete enough to say a pool does not exist.
                known = set(self.router.pools) | {a.pool for a in self.router.actors.values()}
                if r.pool not in known:
                    raise TurnError(
                        validators.INVALID,
                        f"rules[{i}].pool: no pool named {r.pool!r} exists and allow_fallback is false",
                        field=f"rules[{i}].pool",
                    )
            new[r.task] = Rule.from_proto(r)
        if merge:
            self.router.rules.update(new)
        else:
            self.router.rules = new
        self.changed()

    def affinity_table(self) -> pp.AffinityTable:
        out = pp.AffinityTable(rules=[r.to_proto() for r in self.router.rules.values()])
        for task, rule in self.router.derived_rules.items():
            if task not in self.router.rules:
                p = rule.to_proto()
                p.from_binding = True
                out.rules.append(p)
        out.profiles.extend(p.to_proto() for p in self.router.profiles.values())
        return out

    def set_pd(self, pools: list[pp.PdPoolConfig], merge: bool) -> None:
        validators.pd_pools(pools)
        new: dict[str, pp.PdPoolConfig] = {}
        for p in pools:
            cfg = pp.PdPoolConfig()
            cfg.CopyFrom(p)
            new[p.pool] = cfg
        if merge:
            self.router.pd.update(new)
        else:
            self.router.pd = new
        self.changed()

    def pd_routing(self) -> pp.PdRouting:
        return pp.PdRouting(pools=list(self.router.pd.values()))

    def set_window(self, window: pp.VersionWindow, job: str = "") -> pp.VersionWindow:
        validators.version_window(window)
        new = pp.VersionWindow(min_version=window.min_version, max_version=window.max_version)
        if job:
            self.router.job_windows[job] = new
        else:
            self.router.window = new
        self.changed()
        return new

    # ---------------------------------------------------------------------------------------------- views

    def proxy_actor(self, a: ActorEntry, sticky: dict[str, int]) -> pp.ProxyActor:
        out = pp.ProxyActor(
            actor_id=a.actor_id,
            endpoint=a.endpoint,
            pool=a.pool,
            region=a.region,
            hardware=a.hardware,
            pd_role=a.pd_role or common_pb2.PD_ROLE_UNIFIED,
            state=DRAINING if a.self_draining and a.state == HEALTHY else a.state,
            source=pp.ACTOR_SOURCE_STATIC if a.static else pp.ACTOR_SOURCE_BINDING,
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
            job_id=a.job_id,
            job_versions=a.job_versions,
        )
        if a.last_ok:
            out.last_ok.CopyFrom(_ts(a.last_ok))
        return out

    def list_actors(self, pool: str = "") -> list[pp.ProxyActor]:
        sticky = self.router.sticky_counts()
        return [
            self.proxy_actor(a, sticky)
            for a in sorted(self.router.actors.values(), key=lambda a: a.actor_id)
            if not pool or a.pool == pool
        ]

    def models(self) -> list[str]:
        names = {a.model for a in self.router.actors.values() if a.model}
        if self.cfg.served_model_name:
            names.add(self.cfg.served_model_name)
        return sorted(names)

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
