"""The turn pipeline, shared by the gRPC service and the OpenAI HTTP API. A turn: validate -> wait for
admission (Suspend) -> route over the actor table (``actors``) -> optionally prefill on a PD prefill actor ->
stream from the actor, forwarding its bytes. An actor that fails before anything was forwarded is excluded and the
turn is routed again (RouteReason RETRY); after that the turn ends UNAVAILABLE with the retryable trailing
metadata of llmproxy.proto. See docs/llmproxy.md.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import os
import time
from collections.abc import AsyncGenerator, AsyncIterator, Sequence

import grpc
from grpc import aio
from opentelemetry import trace
from opentelemetry.trace import SpanKind, Status, StatusCode

from rollart.runtime.telemetry import inject_metadata, log_fields, trajectory_scope
from rollart.runtime.telemetry import tracer as _tracer
from rollart.runtime.timeutil import duration as _dur
from rollart.runtime.timeutil import timestamp as _ts
from rollart.v1 import actor_pb2, common_pb2
from rollart.v1 import llmproxy_pb2 as pp

from . import metrics, validators
from .actors import GENERATE_METHOD, PD_ROLE_NAMES, ActorClient, ActorTable
from .admission import AdmissionGate, AdmissionRefused, AdmissionTimeout
from .config import LLMProxyConfig
from .router import DRAINING, ActorEntry, NoRoute, Route
from .shares import JobShares, ShareTimeout
from .tokenizer import LocalTokenizer
from .turn import (
    MAX_ID,
    MD_FAILED_ACTOR,
    MD_RETRYABLE,
    MD_TOKENS,
    Forward,
    Turn,
    TurnError,
    _ActorFailed,
    _varint,
    prompt_estimate,
    unavailable,
)

# Imported from here by the service, the HTTP API, membership and tests.
__all__ = [
    "GENERATE_METHOD",
    "MAX_ID",
    "MD_FAILED_ACTOR",
    "MD_RETRYABLE",
    "MD_TOKENS",
    "PD_ROLE_NAMES",
    "ActorClient",
    "Forward",
    "Proxy",
    "Turn",
    "TurnError",
    "_varint",
    "prompt_estimate",
    "unavailable",
]

log = logging.getLogger(__name__)

ABORTED = common_pb2.FINISH_REASON_ABORTED
_REASONS = {v: pp.RouteReason.Name(v).removeprefix("ROUTE_REASON_").lower() for v in pp.RouteReason.values()}


class Proxy(ActorTable):
    """The actor table plus admission (Suspend/Resume), aborts, tokenizing and the turns themselves."""

    def __init__(self, cfg: LLMProxyConfig) -> None:
        super().__init__(cfg)
        self.by_trajectory: dict[str, set[Turn]] = {}
        self.gate = AdmissionGate(cfg.max_waiting_requests)
        self.job_gates: dict[str, AdmissionGate] = {}  # several jobs on one fleet: each trainer suspends its own
        self.shares = JobShares(cfg.fleet_turn_slots, cfg.job_shares)  # and each job's share of a full fleet
        self.tokenizer = LocalTokenizer(cfg.tokenizer_dir) if cfg.tokenizer_dir else None
        self.tracer = _tracer("rollart.client")
        # Request ids the proxy makes up: unique per process (prefix) and per turn (counter), no uuid per turn.
        self._rid_prefix = f"{os.getpid():x}{int(time.time() * 1000) & 0xFFFFFF:x}"
        self._rid_counter = itertools.count(1)
        # Metric children by label values: ``labels()`` hashes and checks its arguments on every call.
        self._requests_metric: dict[tuple[str, str], object] = {}
        self.requests_total = 0
        self.actor_failures = 0
        self.aborted_total = 0
        self.plan_step = 0
        self.openai_base_url = ""

    def _count(self, reason: str, outcome: str) -> None:
        child = self._requests_metric.get((reason, outcome))
        if child is None:
            child = self._requests_metric[(reason, outcome)] = metrics.REQUESTS.labels(reason, outcome)
        child.inc()  # type: ignore[attr-defined]

    # ------------------------------------------------------------------------------------------ admission

    def _gate(self, job: str) -> AdmissionGate:
        if not job:
            return self.gate
        if job not in self.job_gates:
            self.job_gates[job] = AdmissionGate(self.cfg.max_waiting_requests)
        return self.job_gates[job]

    def admission_state(self, job: str = "") -> pp.AdmissionState:
        g = self._gate(job)
        out = pp.AdmissionState(
            suspended=g.suspended,
            reason=g.reason,
            waiting_requests=g.waiting,
            in_flight_requests=sum(1 for t in self.turns.values() if t.actor is not None),
        )
        if g.suspended:
            out.since.CopyFrom(_ts(g.since))
        return out

    def suspend(self, reason: str, step: int, job: str = "") -> pp.AdmissionState:
        """Turns (of ``job`` only, when named) wait for Resume; turns in flight go on."""
        if self._gate(job).suspend(reason, step):
            log.info("suspended", extra=log_fields(reason=reason, step=step, job=job))
        if not job:
            metrics.SUSPENDED.set(1)
        return self.admission_state(job)

    def resume(self, job: str = "") -> pp.AdmissionState:
        released, lasted = self._gate(job).resume()
        if not job:
            metrics.SUSPENDED.set(0)
        if lasted:
            log.info("resumed", extra=log_fields(released=released, suspended_s=round(lasted, 4), job=job))
        out = self.admission_state(job)
        out.released = released
        out.suspended_for.CopyFrom(_dur(lasted))
        return out

    def status(self) -> pp.ProxyStatus:
        actors = list(self.router.actors.values())
        return pp.ProxyStatus(
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

    # ---------------------------------------------------------------------------------------------- abort

    def abort(
        self, trajectory_ids: list[str], reason: str = "", lease_ids: Sequence[str] = ()
    ) -> pp.ProxyAbortResponse:
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
            if t.aborted or t.finished:
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
        return pp.ProxyAbortResponse(aborted_requests=count, aborted_trajectory_ids=sorted(ended))

    # ------------------------------------------------------------------------------------------- tokenize

    async def tokenize(self, task: str, req: common_pb2.TokenizeRequest, timeout: float) -> common_pb2.TokenizeResponse:
        validators.model_input(req.input, "request.input")
        if self.tokenizer is not None:
            try:
                ids, rendered = self.tokenizer.tokenize(req.input, req.add_special_tokens)
            except Exception as exc:  # noqa: BLE001 - template errors are the caller's input
                raise TurnError(validators.INVALID, f"cannot tokenize: {exc}", field="request.input") from None
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

    def _deadline(self, req: pp.TrajectoryGenerateRequest, time_remaining: float | None) -> float:
        now = time.monotonic()
        budget = self.cfg.default_deadline_seconds
        if req.HasField("deadline"):
            budget = req.deadline.ToNanoseconds() / 1e9 - time.time()
        if time_remaining is not None:
            budget = min(budget, time_remaining) if req.HasField("deadline") else time_remaining
        if budget <= 0:
            raise TurnError(grpc.StatusCode.DEADLINE_EXCEEDED, "the turn's deadline has already passed")
        return now + budget

    def validate(self, req: pp.TrajectoryGenerateRequest) -> None:
        validators.generate(req)

    async def generate(
        self, req: pp.TrajectoryGenerateRequest, time_remaining: float | None = None
    ) -> AsyncGenerator[pp.TrajectoryGenerateResponse, None]:
        """The turn's responses; raises TurnError for a failed turn (see the module docstring)."""
        async for item in self.generate_items(req, time_remaining):
            yield item.message() if isinstance(item, Forward) else item

    async def generate_wire(
        self, req: pp.TrajectoryGenerateRequest, time_remaining: float | None = None
    ) -> AsyncGenerator[bytes, None]:
        """``generate``'s responses, encoded: the actor's chunk bytes are forwarded as received."""
        async for item in self.generate_items(req, time_remaining):
            yield item.wire() if isinstance(item, Forward) else item.SerializeToString()

    async def generate_items(
        self, req: pp.TrajectoryGenerateRequest, time_remaining: float | None = None
    ) -> AsyncGenerator[Forward | pp.TrajectoryGenerateResponse, None]:
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
        admitted = False
        try:
            waited = await self._admit(turn, req, deadline)
            admitted = True
            async for resp in self._run_turn(turn, req, deadline, received, waited):
                yield resp
        finally:
            if admitted and self.shares.on:
                self.shares.release(req.job_id)
            if turn.cut_handle is not None:
                turn.cut_handle.cancel()
            self.turns.pop(rid, None)
            group = self.by_trajectory.get(turn.trajectory_id)
            if group is not None:
                group.discard(turn)
                if not group:
                    del self.by_trajectory[turn.trajectory_id]

    def _aborted_chunk(self, turn: Turn) -> pp.TrajectoryGenerateResponse:
        return pp.TrajectoryGenerateResponse(
            chunk=common_pb2.GenerationChunk(
                request_id=turn.request_id,
                trajectory_id=turn.trajectory_id,
                actor_id=turn.actor.actor_id if turn.actor is not None else "",
                offset=turn.streamed,
                finish_reason=ABORTED,
            )
        )

    async def _admit(self, turn: Turn, req: pp.TrajectoryGenerateRequest, deadline: float) -> float:
        """Wait while the turn's job is suspended, then (shares on) for the job's share of a full fleet; returns
        the seconds waited. With shares on, the caller releases the job's slot when the turn ends."""
        waited = 0.0
        # A turn waits on its job's gate only: one job's update never holds another job's turns on a shared fleet.
        gate = self.job_gates.get(req.job_id) if req.job_id else self.gate
        if gate is not None and gate.suspended:
            metrics.WAITERS.inc()
            try:
                waited = await gate.admit(deadline, turn.abort_future)
            except AdmissionTimeout as exc:
                raise TurnError(grpc.StatusCode.DEADLINE_EXCEEDED, str(exc)) from None
            except AdmissionRefused as exc:
                raise unavailable(str(exc)) from None
            finally:
                metrics.WAITERS.dec()
            metrics.ADMISSION_WAIT.observe(waited)
        if self.shares.on:
            try:
                shared = await self.shares.acquire(req.job_id, deadline, turn.abort_future)
            except ShareTimeout as exc:
                raise TurnError(grpc.StatusCode.DEADLINE_EXCEEDED, str(exc)) from None
            metrics.SHARE_WAIT.labels(req.job_id).observe(shared)
            waited += shared
        return waited

    async def _run_turn(
        self, turn: Turn, req: pp.TrajectoryGenerateRequest, deadline: float, received: float, waited: float
    ) -> AsyncIterator[Forward | pp.TrajectoryGenerateResponse]:
        """The admitted turn: routed to an actor, and to another when one fails before streaming anything."""
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
                route.reason = pp.ROUTE_REASON_RETRY
            reason = (
                _REASONS.get(route.reason) or pp.RouteReason.Name(route.reason).removeprefix("ROUTE_REASON_").lower()
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
        req: pp.TrajectoryGenerateRequest,
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
                    job=req.job_id,
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
                raise TurnError(validators.INVALID, f"cannot tokenize the input: {exc}", field="input") from None
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
        req: pp.TrajectoryGenerateRequest,
        route: Route,
        deadline: float,
        waited: float,
        received: float,
        attempt: int,
    ) -> AsyncIterator[Forward | pp.TrajectoryGenerateResponse]:
        actor = route.actor
        lo, _hi = self.router.bounds(req.min_version, req.job_id)
        base_rid = turn.request_id if attempt == 0 else f"{turn.request_id}~r{attempt}"
        inp = req.input
        prefill: ActorEntry | None = None
        kv_params = ""
        if route.pd is not None and not req.job_id:  # an attached job's turns run unified (PD is the own job's)
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
            job_id=req.job_id,
        )
        info = pp.RouteInfo(
            actor_id=actor.actor_id,
            actor_endpoint=actor.endpoint,
            pool=actor.pool,
            reason=route.reason,
            prefill_actor_id=prefill.actor_id if prefill is not None else "",
            actor_version=actor.version_of(req.job_id) or 0,
            admission_wait=_dur(waited),
        )
        self.router.stick(turn.trajectory_id, actor.actor_id, prefill.actor_id if prefill is not None else "")
        first = True
        async for raw, chunk in self._stream(turn, actor, areq, prompt_estimate(inp), deadline):
            if chunk.HasField("usage"):  # the last chunk: the task's profile learns the turn's shape
                split = turn.prefill_uncached if prefill is not None else -1  # PD: the prefill side's work
                self.router.observe_turn(req.task, turn.trajectory_id, chunk.usage, prefilled=split)
            if chunk.finish_reason:
                turn.finished = True
            if first:
                metrics.TTFT.observe(time.monotonic() - received)
                first = False
                yield Forward(raw, chunk, info)
            else:
                yield Forward(raw, chunk)

    async def _prefill(
        self,
        turn: Turn,
        req: pp.TrajectoryGenerateRequest,
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
                if turn.aborted:  # nothing after an Abort reaches the caller (the actor may have run ahead of it)
                    raise _ActorFailed(actor, "aborted", dead=False)
                chunk = parse(raw)
                n = len(chunk.token_ids)
                delta = min(n, gen_left) + prompt_left
                prompt_left = 0  # the first chunk means the prompt is prefilled
                gen_left -= min(n, gen_left)
                actor.outstanding_tokens -= delta
                if chunk.versions and chunk.versions[-1] > (actor.version_of(areq.job_id) or 0):
                    actor.observe_version(chunk.versions[-1], areq.job_id)
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
