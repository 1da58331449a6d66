"""The Ledger gRPC service over Redis.

Every state change is one atomic step in Redis: a Lua script (scripts.py) for leases, settlement, the buffer,
actors and versions, and a WATCH/MULTI transaction around a script for step planning (its inputs are read in
Python). Nothing is kept in this process beyond a wake-up signal for waiting calls, so several ledger handlers
(or processes) may run at once and a restarted ledger serves the same state. docs/ledger.md has the data
model.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import math
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, cast

import grpc
import hiredis
import redis.asyncio as aioredis
from grpc import aio
from prometheus_client import Counter

from rollart.discovery import Registration
from rollart.runtime import errors, ids, timeutil
from rollart.runtime.background import Periodic
from rollart.runtime.telemetry import log_fields
from rollart.v1 import common_pb2
from rollart.v1 import ledger_pb2 as lp
from rollart.v1 import ledger_pb2_grpc as lg
from rollart.v1 import resource_manager_pb2 as rm

from . import codec
from . import policy as pol
from .config import LedgerConfig
from .errors import LedgerError
from .planning import StepPlanner
from .scripts import (
    AcquireArgs,
    Acquired,
    BatchRecord,
    LedgerScripts,
    NewGroup,
    Submission,
    Verdict,
    WorkReport,
    now_ms,
)
from .tasks import task_pools

log = logging.getLogger(__name__)
# redis-py types every reply as bytes | str; this client never decodes, so its replies are bytes (casts below).
_Entries = list[tuple[bytes, dict[bytes, bytes]]]

MAX_BATCH = 1_000_000
MAX_PROMPTS = 10_000
MAX_PRIORITY = 1_000_000
# Items of one AcquireLeasesBatch or SubmitBatch; leases of one AcquireLeases(Batch) call.
MAX_BATCH_ITEMS = 256
MAX_LEASES_PER_CALL = 1000
# A new version is at most this far above the latest (the first at most this far above -1).
MAX_VERSION_STEP = 1024
K = lp.SubscriberKind

SUBMISSIONS = Counter("rollart_ledger_submissions_total", "Submit verdicts", ["verdict"])
LEASES_ISSUED = Counter("rollart_ledger_leases_issued_total", "Sample leases issued")
LEASES_EXPIRED = Counter("rollart_ledger_leases_expired_total", "Sample leases expired by the reaper")
SCORES_EXPIRED = Counter(
    "rollart_ledger_scores_expired_total", "Admitted samples un-admitted as failed: no reward within the score deadline"
)


class Abort(errors.ServiceError):
    """Ends the call with a status (a ``runtime.errors`` error: the server's handler wrapper maps it)."""

    def __init__(self, code: grpc.StatusCode, message: str) -> None:
        super().__init__(message)
        self.code = code


def invalid(message: str) -> Abort:
    return Abort(grpc.StatusCode.INVALID_ARGUMENT, message)


def precondition(message: str) -> Abort:
    return Abort(grpc.StatusCode.FAILED_PRECONDITION, message)


def _check_id(name: str, value: str, required: bool = True) -> None:
    ids.check_id(name, value, required=required)


def _check_duration(name: str, d: Any) -> float:
    return timeutil.checked_duration(name, d)


def _retry_after(got: Acquired) -> Any:
    """When to ask again after an acquire that got nothing: later while no version is registered."""
    return codec.dur_ms(1000 if got.status == "noversion" else 250)


def _item_error(exc: errors.ServiceError) -> lp.BatchItemError:
    """The status one refused item of a batch would have ended its own call with."""
    message = errors.truncate_bytes(exc.details(), errors.MAX_DETAILS_BYTES)
    return lp.BatchItemError(code=exc.code.value[0], message=message)


def handler(fn: Callable[..., Awaitable[Any]]) -> Callable[..., Awaitable[Any]]:
    """Raises the core's LedgerError (scripts, planning) as the ``runtime.errors`` error of its code.

    Abort, invalid ids and durations and store outages (redis ConnectionError -> UNAVAILABLE) are mapped by
    the server's handler wrapper like every service's.
    """

    @functools.wraps(fn)
    async def run(self: "LedgerService", request: Any, context: aio.ServicerContext) -> Any:
        try:
            return await fn(self, request, context)
        except LedgerError as exc:
            raise errors.error_for(exc.code, exc.message) from None

    return run


class _Signal:
    """Wakes waiting calls when this process changed something (other changes are found by polling)."""

    def __init__(self) -> None:
        self._event = asyncio.Event()

    def current(self) -> asyncio.Event:
        return self._event

    def fire(self) -> None:
        self._event.set()
        self._event = asyncio.Event()

    @staticmethod
    async def wait(event: asyncio.Event, timeout: float) -> None:
        if timeout <= 0:
            return
        try:
            await asyncio.wait_for(event.wait(), timeout)
        except TimeoutError:
            pass


class _HiredisPackingConnection(aioredis.Connection):
    """Packs commands with hiredis's C packer. redis-py's asyncio connection packs in Python (~0.7 us an argument:
    5-7% of the ledger's CPU with batches of ~20 arguments per item); the bytes are the same (hiredis writes str
    as UTF-8 and floats as their repr, as redis-py's encoder does)."""

    def pack_command(self, *args: Any) -> list[bytes]:
        if isinstance(args[0], str) and " " in args[0]:  # 'SCRIPT LOAD': the name's words are separate arguments
            args = (*args[0].split(), *args[1:])
        return [hiredis.pack_command(args)]


class LedgerService(lg.LedgerServicer):
    name = "ledger"
    service_names = [lp.DESCRIPTOR.services_by_name["Ledger"].full_name]

    def __init__(self, cfg: LedgerConfig) -> None:
        self.cfg = cfg
        # A bounded pool that makes a handler wait for a free connection: redis-py's default pool (100) fails a
        # call outright once that many handlers use Redis at once (e.g. 256 actors heartbeating together).
        plain_tcp = cfg.redis_url.startswith("redis://")  # (unix:// and rediss:// keep their own connections)
        pool = aioredis.BlockingConnectionPool.from_url(
            cfg.redis_url,
            max_connections=cfg.redis_max_connections,
            timeout=20,
            **({"connection_class": _HiredisPackingConnection} if plain_tcp else {}),
        )
        self.redis = aioredis.Redis.from_pool(pool)  # closes the pool with the client
        self.p = cfg.key_prefix
        self.scripts = LedgerScripts(self.redis, self.p)
        self.planner = StepPlanner(self.redis, self.scripts, self.p)
        self.signal = _Signal()
        self._reaper = Periodic(self.reap, cfg.reap_interval_seconds, name="ledger-reaper")
        self._last_trim = 0.0

    def k(self, name: str) -> str:
        return self.p + name

    # --------------------------------------------------------------------------------------------- lifecycle

    def add_to_server(self, server: aio.Server) -> None:
        lg.add_LedgerServicer_to_server(self, server)

    async def start(self) -> None:
        await self.redis.ping()
        await self.scripts.load()
        if self.cfg.job_id:
            job = cast(bytes | None, await self.redis.get(self.k("job")))
            if job is not None and job.decode() != self.cfg.job_id:
                raise RuntimeError(
                    f"the store under {self.p!r} belongs to job {job.decode()!r}, not {self.cfg.job_id!r}"
                )
        await self.scripts.ensure_policy(pol.defaults(self.cfg.job_id))
        self._reaper.start()

    async def on_serving(self, address: str) -> None:
        if not self.cfg.resource_manager:
            return
        worker = rm.Worker(
            worker_id=f"ledger-{self.cfg.job_id or 'default'}",
            role="ledger",
            endpoint=address,
            pool=self.cfg.rm_pool,
            hardware=common_pb2.Hardware(accelerator="cpu", count=1, tags=["ledger"]),
            ttl_seconds=10.0,
        )
        pool = rm.Pool(name=self.cfg.rm_pool, kind=common_pb2.POOL_KIND_CPU, capacity=64)
        self._registration = Registration(
            self.cfg.resource_manager, worker, token=self.cfg.token(), tls=self.cfg.tls, pool=pool
        )
        await self._registration.start()

    async def stop(self) -> None:
        if getattr(self, "_registration", None) is not None:
            await self._registration.stop()
        await self._reaper.stop()
        await self.redis.aclose()

    async def _policy(self, pending: bool = False) -> dict[str, float]:
        """The policy in force (or, with pending, the one the next PlanStep installs)."""
        h: dict = {}
        if pending:
            h = await self.redis.hgetall(self.k("pol:next"))
        if not h:
            h = await self.redis.hgetall(self.k("pol"))
        return pol.numbers(h)

    # ------------------------------------------------------------------------------------------------ reaper

    async def reap(self) -> None:
        reaped = await self.scripts.reap(
            lease_retention_ms=int(self.cfg.lease_retention_seconds * 1000),
            actor_retention_ms=int(self.cfg.actor_retention_seconds * 1000),
            score_deadline_ms=int(self.cfg.score_deadline_seconds * 1000),
        )
        expired, dead = reaped.expired, reaped.presumed_dead
        if expired or dead or reaped.unscored_expired:
            LEASES_EXPIRED.inc(expired)
            self.signal.fire()
            if dead:
                log.info("actors presumed dead", extra=log_fields(count=dead))
            if reaped.unscored_expired:
                SCORES_EXPIRED.inc(reaped.unscored_expired)
                log.warning("admitted samples left unscored past the score deadline: un-admitted as failed",
                            extra=log_fields(count=reaped.unscored_expired,
                                             deadline_seconds=self.cfg.score_deadline_seconds))
        if time.monotonic() - self._last_trim > 1.0:
            self._last_trim = time.monotonic()
            await self._trim_commands()

    async def _trim_commands(self) -> None:
        policy = await self._policy()
        cutoff = now_ms() - policy["ret"]
        key = self.k("cmds")
        start = "-"
        for _ in range(10):  # bounded work per tick
            entries = cast(_Entries, await self.redis.xrange(key, min=start, count=500))
            if not entries:
                break
            fresh = next((eid for eid, f in entries if float(f.get(b"ts", b"0")) >= cutoff), None)
            if fresh is not None:
                await self.redis.xtrim(key, minid=fresh.decode())
                break
            last = entries[-1][0].decode()
            start = "(" + last
            await self.redis.xtrim(key, minid=f"{int(last.split('-')[0]) + 1}-0")
        await self.redis.xtrim(key, maxlen=self.cfg.command_history, approximate=True)

    # ------------------------------------------------------------------------------------------------ policy

    @handler
    async def SetJobPolicy(
        self, request: lp.SetJobPolicyRequest, context: aio.ServicerContext
    ) -> lp.JobPolicy:
        if not request.HasField("policy"):
            raise invalid("policy is required")
        if not request.policy.job_id:
            raise invalid("policy.job_id is required")
        if self.cfg.job_id and request.policy.job_id != self.cfg.job_id:
            raise precondition(f"this ledger serves job {self.cfg.job_id}, not {request.policy.job_id}")
        try:
            filled = pol.fill(request.policy, "")
        except pol.PolicyError as exc:
            raise invalid(str(exc)) from None
        await self.scripts.set_policy(filled)
        log.info("job policy set", extra=log_fields(job_id=filled.job_id))
        return filled

    @handler
    async def GetJobPolicy(
        self, request: lp.GetJobPolicyRequest, context: aio.ServicerContext
    ) -> lp.JobPolicy:
        blob = cast(bytes | None, await self.redis.get(self.k("policy")))
        if blob is None:
            return pol.defaults(self.cfg.job_id)
        return lp.JobPolicy.FromString(blob)

    # ---------------------------------------------------------------------------------------------- versions

    @handler
    async def RegisterVersion(
        self, request: lp.RegisterVersionRequest, context: aio.ServicerContext
    ) -> lp.RegisterVersionResponse:
        v = common_pb2.PolicyVersion()
        v.CopyFrom(request.version)
        if not request.HasField("version"):
            raise invalid("version is required")
        if v.version < 0:
            raise invalid(f"version.version must be >= 0, got {v.version}")
        if v.version == 0 and v.base_version == 0:
            v.base_version = -1  # version 0 is the initial policy: it has no base
        if v.base_version < -1 or v.base_version >= v.version:
            raise invalid(f"version.base_version must be within [-1, {v.version - 1}], got {v.base_version}")
        if len(v.hash) != 32:
            raise invalid(f"version.hash must be the 32-byte SHA-256 h(v), got {len(v.hash)} bytes")
        for name in ("checkpoint_bytes", "delta_bytes", "delta_entries"):
            if getattr(v, name) < 0:
                raise invalid(f"version.{name} must be >= 0")
        latest_raw = await self.redis.get(self.k("latest"))
        latest = int(latest_raw) if latest_raw is not None else -1
        if v.version > latest + MAX_VERSION_STEP:
            # One call must not end a job: a version far ahead (2^63-1) would make every later one "not greater".
            raise precondition(
                f"version.version {v.version} is more than {MAX_VERSION_STEP} above the latest version ({latest})"
            )
        if not v.HasField("created_at"):
            v.created_at.CopyFrom(codec.ts_ms(now_ms()))
        registered = await self.scripts.register_version(v)
        created, stored = registered.created, registered.recorded
        if not created:
            mine = common_pb2.PolicyVersion()
            mine.CopyFrom(v)
            if not request.version.HasField("created_at"):
                mine.created_at.CopyFrom(stored.created_at)
            if mine != stored:
                raise precondition(f"version {v.version} is already registered with different content")
        else:
            log.info("version registered", extra=log_fields(version=v.version, base=v.base_version))
        return lp.RegisterVersionResponse(version=stored, created=bool(created))

    @handler
    async def GetVersion(
        self, request: lp.GetVersionRequest, context: aio.ServicerContext
    ) -> common_pb2.PolicyVersion:
        number: Any = request.version
        if request.latest:
            number = await self.redis.get(self.k("latest"))
            if number is None:
                raise Abort(grpc.StatusCode.NOT_FOUND, "no version is registered yet")
            number = number.decode()
        elif request.version < 0:
            raise invalid("version must be >= 0")
        blob = cast(bytes | None, await self.redis.hget(self.k("versions"), str(number)))
        if blob is None:
            raise Abort(grpc.StatusCode.NOT_FOUND, f"version {number} is not registered")
        return common_pb2.PolicyVersion.FromString(blob)

    @handler
    async def ListVersions(
        self, request: lp.ListVersionsRequest, context: aio.ServicerContext
    ) -> lp.ListVersionsResponse:
        if request.limit < 0 or request.limit > 10_000:
            raise invalid("limit must be within [0, 10000]")
        if request.from_version < 0:
            raise invalid("from_version must be >= 0")
        hi = str(request.to_version) if request.HasField("to_version") else "+inf"
        limit = request.limit or 100
        return lp.ListVersionsResponse(
            versions=await self._versions(request.from_version, hi, limit),
            latest_version=int(await self.redis.get(self.k("latest")) or -1),
        )

    async def _versions(self, lo: Any, hi: Any, limit: int) -> list[common_pb2.PolicyVersion]:
        numbers = cast(list[bytes], await self.redis.zrevrangebyscore(self.k("vers"), hi, lo, start=0, num=limit))
        if not numbers:
            return []
        blobs = cast(list[bytes | None], await self.redis.hmget(self.k("versions"), list(reversed(numbers))))
        return [common_pb2.PolicyVersion.FromString(b) for b in blobs if b is not None]

    # ------------------------------------------------------------------------------------------------ actors

    @handler
    async def RegisterActor(
        self, request: lp.RegisterActorRequest, context: aio.ServicerContext
    ) -> lp.RegisterActorResponse:
        a = request.actor
        _check_id("actor.actor_id", a.actor_id)
        if not a.endpoint or len(a.endpoint) > 512:
            raise invalid("actor.endpoint is required (host:port)")
        if len(a.region) > 128 or len(a.relay_id) > 200:
            raise invalid("actor.region or actor.relay_id is too long")
        if a.pd_role not in common_pb2.PdRole.values():
            raise invalid(f"actor.pd_role {a.pd_role} is not a PdRole")
        h = await self.scripts.register_actor(a)
        policy = await self._policy()
        log.info(
            "actor registered", extra=log_fields(actor_id=a.actor_id, endpoint=a.endpoint, region=a.region)
        )
        latest = await self.redis.get(self.k("latest"))
        return lp.RegisterActorResponse(
            actor=codec.actor_from(h, now_ms(), policy["tout"]),
            heartbeat_interval=codec.dur_ms(policy["tout"] / 3),
            latest_version=int(latest) if latest is not None else -1,
        )

    @handler
    async def ActorHeartbeat(
        self, request: lp.ActorHeartbeatRequest, context: aio.ServicerContext
    ) -> lp.ActorHeartbeatResponse:
        _check_id("actor_id", request.actor_id)
        obs = request.observed_tokens_per_s
        if not math.isfinite(obs) or obs < 0:
            raise invalid(f"observed_tokens_per_s must be a finite number >= 0, got {obs}")
        if request.in_flight_requests < 0:
            raise invalid("in_flight_requests must be >= 0")
        _check_id("relay_id", request.relay_id, required=False)
        now = now_ms()
        beat = await self.scripts.heartbeat(
            actor_id=request.actor_id,
            weights=request.weights if request.HasField("weights") else None,
            observed_tokens_per_s=obs,
            in_flight_requests=request.in_flight_requests,
            draining=request.draining,
            relay_id=request.relay_id,
        )
        if beat.status != "ok":
            if beat.status == "dead":
                self.signal.fire()
            raise Abort(
                grpc.StatusCode.NOT_FOUND,
                f"actor {request.actor_id} is not registered or was presumed dead; register again",
            )
        policy = await self._policy()
        return lp.ActorHeartbeatResponse(
            expires_at=codec.ts_ms(now + policy["tout"]),
            tau=beat.tau,
            latest_command_sequence=beat.latest_command_sequence,
        )

    @handler
    async def LeaveActor(
        self, request: lp.LeaveActorRequest, context: aio.ServicerContext
    ) -> lp.LeaveActorResponse:
        _check_id("actor_id", request.actor_id)
        left = await self.scripts.leave_actor(request.actor_id)
        if left.leases_returned:
            self.signal.fire()
        log.info("actor left", extra=log_fields(actor_id=request.actor_id, reason=request.reason[:200]))
        return lp.LeaveActorResponse(leases_returned=left.leases_returned, leases_unassigned=left.leases_unassigned)

    async def _actors(self, ids: list[str] | None = None) -> dict[str, lp.LedgerActor]:
        if ids is None:
            ids = sorted(m.decode() for m in cast(set[bytes], await self.redis.smembers(self.k("actors"))))
        pipe = self.redis.pipeline(transaction=False)
        for aid in ids:
            pipe.hgetall(self.k("a:" + aid))
        rows = await pipe.execute()
        policy = await self._policy()
        now = now_ms()
        return {
            aid: codec.actor_from(codec.hdict(h), now, policy["tout"])
            for aid, h in zip(ids, rows)
            if h.get(b"info")
        }

    @handler
    async def GetActor(self, request: lp.GetActorRequest, context: aio.ServicerContext) -> lp.LedgerActor:
        _check_id("actor_id", request.actor_id)
        actors = await self._actors([request.actor_id])
        if request.actor_id not in actors:
            raise Abort(grpc.StatusCode.NOT_FOUND, f"no actor {request.actor_id}")
        return actors[request.actor_id]

    @handler
    async def ListActors(
        self, request: lp.ListActorsRequest, context: aio.ServicerContext
    ) -> lp.ListActorsResponse:
        actors = await self._actors()
        live = (lp.ACTOR_LIVENESS_ALIVE, lp.ACTOR_LIVENESS_DRAINING)
        return lp.ListActorsResponse(
            actors=[
                a
                for a in actors.values()
                if (request.include_inactive or a.liveness in live)
                and (not request.region or a.region == request.region)
            ]
        )

    # -------------------------------------------------------------------------------------------- scheduling

    @handler
    async def PlanStep(self, request: lp.PlanStepRequest, context: aio.ServicerContext) -> lp.StepPlan:
        if request.step < 1:
            raise invalid(f"step must be >= 1, got {request.step}")
        if request.version < 0:
            raise invalid(f"version must be >= 0, got {request.version}")
        if not 1 <= request.batch_size <= MAX_BATCH:
            raise invalid(f"batch_size must be within [1, {MAX_BATCH}], got {request.batch_size}")
        planned = await self.planner.plan(
            step=request.step,
            version=request.version,
            batch_size=request.batch_size,
            commit_deadline=request.commit_deadline if request.HasField("commit_deadline") else None,
        )
        if planned.created:
            log.info(
                "step planned",
                extra=log_fields(
                    step=request.step,
                    version=request.version,
                    batch=request.batch_size,
                    allocations={a.actor_id: a.requests for a in planned.plan.allocations},
                ),
            )
            self.signal.fire()
        return planned.plan

    async def _plan(self, step: int) -> lp.StepPlan:
        if step < 0:
            raise invalid("step must be >= 0")
        return await self.planner.get(step)

    @handler
    async def GetStepPlan(self, request: lp.GetStepPlanRequest, context: aio.ServicerContext) -> lp.StepPlan:
        return await self._plan(request.step)

    @handler
    async def AwaitStepCommitted(
        self, request: lp.AwaitStepCommittedRequest, context: aio.ServicerContext
    ) -> lp.StepPlan:
        if request.step < 1:
            raise invalid("step must be >= 1")
        wait = self._bounded_wait(_check_duration("wait", request.wait), context)
        deadline = time.monotonic() + wait
        while True:
            plan = await self._plan(request.step)
            remaining = deadline - time.monotonic()
            if plan.all_committed or remaining <= 0:
                return plan
            await asyncio.sleep(min(remaining, self.cfg.poll_interval_seconds / 2))

    def _bounded_wait(self, wait: float, context: aio.ServicerContext) -> float:
        wait = min(wait, self.cfg.max_wait_seconds)
        remaining = context.time_remaining()
        if remaining is not None:
            wait = min(wait, max(remaining - 0.05, 0.0))  # answer before the caller's deadline
        return wait

    # ----------------------------------------------------------------------------------------------- commands

    async def WatchCommands(
        self, request: lp.WatchCommandsRequest, context: aio.ServicerContext
    ) -> AsyncIterator[lp.LedgerCommand]:
        sub, kind = request.subscriber_id, request.kind
        _check_id("subscriber_id", sub)
        if kind not in K.values() or kind == K.SUBSCRIBER_KIND_UNSPECIFIED:
            raise invalid("kind is required (ACTOR, RELAY, HOLDER, ROUTER or TRAINER)")
        if request.from_sequence < 0:
            raise invalid("from_sequence must be >= 0")
        key = self.k("cmds")
        if request.only_new:
            last = f"{int(await self.redis.get(self.k('cmd:seq')) or 0)}-1"
        elif request.from_sequence > 0:
            first = cast(_Entries, await self.redis.xrange(key, count=1))
            if first:
                oldest = int(first[0][0].decode().split("-")[0])
                if request.from_sequence < oldest - 1:
                    raise Abort(
                        grpc.StatusCode.OUT_OF_RANGE,
                        f"commands after {request.from_sequence} are no longer retained"
                        f" (oldest {oldest}); re-read the state (GetStepPlan) and watch with only_new",
                    )
            last = f"{request.from_sequence}-1"
        else:
            last = "0-0"
        conn = aioredis.from_url(self.cfg.redis_url)  # a blocking XREAD needs its own connection
        try:
            while True:
                reply = cast(  # an outage: UNAVAILABLE
                    list[tuple[bytes, _Entries]] | None, await conn.xread({key: last}, block=1000, count=256)
                )
                for _stream, entries in reply or ():
                    for entry_id, fields in entries:
                        last = entry_id.decode()
                        kinds = [int(x) for x in fields.get(b"k", b"").decode().split(",") if x]
                        if codec.addressed(fields.get(b"t", b"").decode(), kinds, sub, kind):
                            yield codec.command_from(entry_id, fields)
        finally:
            await conn.aclose()

    @handler
    async def AckCommand(
        self, request: lp.AckCommandRequest, context: aio.ServicerContext
    ) -> lp.AckCommandResponse:
        _check_id("subscriber_id", request.subscriber_id)
        if request.sequence < 1:
            raise invalid("sequence must be >= 1")
        entries = cast(
            _Entries,
            await self.redis.xrange(self.k("cmds"), min=f"{request.sequence}-1", max=f"{request.sequence}-1"),
        )
        if not entries:
            raise Abort(
                grpc.StatusCode.NOT_FOUND, f"command {request.sequence} is unknown or no longer retained"
            )
        cmd = codec.command_from(*entries[0])
        sub = request.subscriber_id
        if cmd.target and cmd.target != sub and not cmd.target.startswith(sub + "/"):
            raise precondition(f"command {request.sequence} is addressed to {cmd.target}, not {sub}")
        order_id = cmd.commit.order_id if cmd.WhichOneof("command") == "commit" else ""
        recorded = await self.scripts.ack_command(
            subscriber_id=request.subscriber_id,
            sequence=request.sequence,
            ok=request.ok,
            error=request.error[:1000],
            commit_order_id=order_id,
            weights=request.weights if request.HasField("weights") else None,
        )
        return lp.AckCommandResponse(recorded=recorded)

    # ------------------------------------------------------------------------------------------- prompt pool

    @handler
    async def AddPrompts(
        self, request: lp.AddPromptsRequest, context: aio.ServicerContext
    ) -> lp.AddPromptsResponse:
        n = len(request.prompts)
        if not 1 <= n <= MAX_PROMPTS:
            raise invalid(f"prompts must hold 1 to {MAX_PROMPTS} prompts, got {n}")
        if request.group_ids and len(request.group_ids) != n:
            raise invalid(
                f"group_ids must be empty or parallel to prompts ({n}), got {len(request.group_ids)}"
            )
        if not 0 <= request.group_size <= pol.MAX_GROUP:
            raise invalid(f"group_size must be within [1, {pol.MAX_GROUP}] (0: the policy's)")
        if request.HasField("redundancy") and not 0 <= request.redundancy <= pol.MAX_GROUP:
            raise invalid(f"redundancy must be within [0, {pol.MAX_GROUP}]")
        if abs(request.priority) > MAX_PRIORITY:
            raise invalid(f"priority must be within [-{MAX_PRIORITY}, {MAX_PRIORITY}]")
        if request.step < 0:
            raise invalid("step must be >= 0")
        policy = await self._policy()
        group = request.group_size or int(policy["G"])
        redundancy = request.redundancy if request.HasField("redundancy") else int(policy["R"])
        groups: list[NewGroup] = []
        for i, prompt in enumerate(request.prompts):
            _check_id(f"prompts[{i}].prompt_id", prompt.prompt_id)
            if len(prompt.task) > 256:
                raise invalid(f"prompts[{i}].task is longer than 256 characters")
            gid = request.group_ids[i] if request.group_ids else ""
            _check_id(f"group_ids[{i}]", gid, required=False)
            groups.append(NewGroup(gid, prompt.prompt_id, prompt.task, prompt.SerializeToString()))
        added = await self.scripts.add_prompts(
            group_size=group, redundancy=redundancy, step=request.step, priority=request.priority, groups=groups
        )
        self.signal.fire()
        return lp.AddPromptsResponse(
            group_ids=added.group_ids, groups_created=added.groups_created, samples_added=added.samples_added
        )

    @staticmethod
    def _acquire_args(request: lp.AcquireLeasesRequest, at: str = "") -> AcquireArgs:
        """An AcquireLeases request checked (INVALID_ARGUMENT); ``at`` prefixes field names (a batch item's)."""
        _check_id(f"{at}holder", request.holder)
        _check_id(f"{at}group_id", request.group_id, required=False)
        if not 0 <= request.max_leases <= MAX_LEASES_PER_CALL:
            raise invalid(
                f"{at}max_leases must be within [1, {MAX_LEASES_PER_CALL}] (0: 1), got {request.max_leases}"
            )
        if len(request.tasks) > 100 or any(len(t) > 256 for t in request.tasks):
            raise invalid(f"{at}tasks: at most 100 tags of at most 256 characters")
        if len(request.region) > 128:
            raise invalid(f"{at}region is too long")
        return AcquireArgs(
            holder=request.holder,
            max_leases=request.max_leases or 1,
            region=request.region,
            group_id=request.group_id,
            tasks=tuple(request.tasks),
        )

    @handler
    async def AcquireLeases(
        self, request: lp.AcquireLeasesRequest, context: aio.ServicerContext
    ) -> lp.AcquireLeasesResponse:
        args = self._acquire_args(request)
        wait = self._bounded_wait(_check_duration("wait", request.wait), context)
        deadline = time.monotonic() + wait
        while True:
            event = self.signal.current()
            got = await self.scripts.acquire(
                holder=args.holder,
                max_leases=args.max_leases,
                region=args.region,
                group_id=args.group_id,
                tasks=args.tasks,
            )
            if got.status == "ok":
                LEASES_ISSUED.inc(len(got.leases))
                return lp.AcquireLeasesResponse(leases=got.leases)
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return lp.AcquireLeasesResponse(retry_after=_retry_after(got))
            await self.signal.wait(event, min(remaining, self.cfg.poll_interval_seconds))

    @handler
    async def AcquireLeasesBatch(
        self, request: lp.AcquireLeasesBatchRequest, context: aio.ServicerContext
    ) -> lp.AcquireLeasesBatchResponse:
        n = len(request.requests)
        if not 1 <= n <= MAX_BATCH_ITEMS:
            raise invalid(f"requests must hold 1 to {MAX_BATCH_ITEMS} requests, got {n}")
        holders: dict[str, int] = {}
        for i, item in enumerate(request.requests):
            if item.holder in holders:
                raise invalid(
                    f"requests[{i}] names holder {errors.shorten(item.holder)} as requests[{holders[item.holder]}]"
                    " does: one request per holder in a batch"
                )
            holders[item.holder] = i
        args = [self._acquire_args(item, f"requests[{i}].") for i, item in enumerate(request.requests)]
        total = sum(a.max_leases for a in args)
        if total > MAX_LEASES_PER_CALL:
            raise invalid(f"requests ask for {total} leases in all, more than {MAX_LEASES_PER_CALL}")
        wait = self._bounded_wait(_check_duration("wait", request.wait), context)
        deadline = time.monotonic() + wait
        results = [lp.AcquireLeasesBatchResult() for _ in range(n)]
        open_items = list(range(n))  # requests without a lease or an error yet
        while True:
            event = self.signal.current()
            got = await self.scripts.acquire_batch([args[i] for i in open_items])
            leased = False
            for i, g in zip(open_items, got):
                if isinstance(g, LedgerError):
                    results[i].error.CopyFrom(_item_error(errors.error_for(g.code, f"requests[{i}]: {g.message}")))
                elif g.status == "ok":
                    LEASES_ISSUED.inc(len(g.leases))
                    results[i].response.leases.extend(g.leases)
                    leased = True
                else:
                    results[i].response.retry_after.CopyFrom(_retry_after(g))
            open_items = [i for i, g in zip(open_items, got) if not isinstance(g, LedgerError)]
            remaining = deadline - time.monotonic()
            if leased or not open_items or remaining <= 0:
                return lp.AcquireLeasesBatchResponse(results=results)
            await self.signal.wait(event, min(remaining, self.cfg.poll_interval_seconds))

    def _lease_args(self, lease_id: str, holder: str) -> None:
        if not lease_id or len(lease_id) > 256:
            raise invalid("lease_id is required")
        _check_id("holder", holder)

    @handler
    async def RenewLease(
        self, request: lp.RenewLeaseRequest, context: aio.ServicerContext
    ) -> lp.RenewLeaseResponse:
        self._lease_args(request.lease_id, request.holder)
        lease = await self.scripts.renew(lease_id=request.lease_id, holder=request.holder)
        if lease.state == lp.LEASE_STATE_EXPIRED:
            self.signal.fire()
        return lp.RenewLeaseResponse(lease=lease)

    @handler
    async def ReleaseLease(self, request: lp.ReleaseLeaseRequest, context: aio.ServicerContext) -> lp.Lease:
        self._lease_args(request.lease_id, request.holder)
        if request.reason not in lp.ReleaseReason.values():
            raise invalid(f"reason {request.reason} is not a ReleaseReason")
        if request.generated_tokens < 0:
            raise invalid("generated_tokens must be >= 0")
        released = await self.scripts.release(
            lease_id=request.lease_id,
            holder=request.holder,
            reason=request.reason or lp.RELEASE_REASON_ABANDONED,
            generated_tokens=request.generated_tokens,
        )
        if released.changed:
            self.signal.fire()
        return released.lease

    @handler
    async def CancelLeases(
        self, request: lp.CancelLeasesRequest, context: aio.ServicerContext
    ) -> lp.CancelLeasesResponse:
        if not request.lease_ids and not request.group_ids:
            raise invalid("name lease_ids or group_ids to cancel")
        if len(request.lease_ids) + len(request.group_ids) > 10_000:
            raise invalid("at most 10000 leases and groups per call")
        if request.reason not in lp.CancelReason.values():
            raise invalid(f"reason {request.reason} is not a CancelReason")
        for i, lid in enumerate(request.lease_ids):
            if not lid or len(lid) > 256:
                raise invalid(f"lease_ids[{i}] is empty or too long")
        for i, gid in enumerate(request.group_ids):
            _check_id(f"group_ids[{i}]", gid)
        cancelled = await self.scripts.cancel(
            reason=request.reason or lp.CANCEL_REASON_MANUAL,
            lease_ids=list(request.lease_ids),
            group_ids=list(request.group_ids),
        )
        self.signal.fire()
        return lp.CancelLeasesResponse(cancelled_lease_ids=cancelled)

    async def _lease(self, lease_id: str) -> lp.Lease | None:
        h = codec.hdict(await self.redis.hgetall(self.k("l:" + lease_id)))
        if not h:
            return None
        pipe = self.redis.pipeline(transaction=False)
        pipe.hget(self.k("g:" + h["gid"].decode()), "prompt")
        pipe.hget(self.k("vhash"), h["ver"].decode())
        prompt, vhash = await pipe.execute()
        return codec.lease_from(h, prompt or b"", vhash or b"")

    @handler
    async def GetLease(self, request: lp.GetLeaseRequest, context: aio.ServicerContext) -> lp.Lease:
        if not request.lease_id or len(request.lease_id) > 256:
            raise invalid("lease_id is required")
        lease = await self._lease(request.lease_id)
        if lease is None:
            raise Abort(grpc.StatusCode.NOT_FOUND, f"no lease {request.lease_id}")
        return lease

    @handler
    async def ListLeases(
        self, request: lp.ListLeasesRequest, context: aio.ServicerContext
    ) -> lp.ListLeasesResponse:
        if not 0 <= request.page_size <= 1000:
            raise invalid("page_size must be within [1, 1000] (0: 100)")
        if any(s not in lp.LeaseState.values() for s in request.states):
            raise invalid("states holds a value that is not a LeaseState")
        after = 0
        if request.page_token:
            if not request.page_token.isdigit():
                raise invalid("page_token is malformed")
            after = int(request.page_token)
        size = request.page_size or 100
        states = {str(s).encode() for s in request.states}
        holder = request.holder.encode()
        group = request.group_id.encode()
        out: list[lp.Lease] = []
        scanned = 0
        while len(out) < size and scanned < 50 * size:
            ids = cast(
                list[tuple[bytes, float]],
                await self.redis.zrangebyscore(
                    self.k("leases"), f"({after}", "+inf", start=0, num=size, withscores=True
                ),
            )
            if not ids:
                break
            pipe = self.redis.pipeline(transaction=False)
            for lid, _ in ids:
                pipe.hgetall(self.k("l:" + lid.decode()))
            rows = await pipe.execute()
            for (_lid, score), h in zip(ids, rows):
                scanned += 1
                after = int(score)
                if not h or (states and h[b"st"] not in states):
                    continue
                if (holder and h[b"holder"] != holder) or (group and h[b"gid"] != group):
                    continue
                out.append(codec.lease_from(codec.hdict(h), b"", b""))
                if len(out) == size:
                    break
        more = await self.redis.zcount(self.k("leases"), f"({after}", "+inf")
        next_token = str(after) if more else ""
        await self._fill_prompts(out)
        return lp.ListLeasesResponse(leases=out, next_page_token=next_token)

    async def _fill_prompts(self, leases: list[lp.Lease]) -> None:
        gids = sorted({le.group_id for le in leases})
        versions = sorted({str(le.version) for le in leases})
        if not leases:
            return
        pipe = self.redis.pipeline(transaction=False)
        for gid in gids:
            pipe.hget(self.k("g:" + gid), "prompt")
        prompts = dict(zip(gids, await pipe.execute()))
        hashes = dict(zip(versions, cast(list[bytes | None], await self.redis.hmget(self.k("vhash"), versions))))
        for le in leases:
            if prompts.get(le.group_id):
                le.prompt.ParseFromString(prompts[le.group_id])
            le.version_hash = hashes.get(str(le.version)) or b""

    # -------------------------------------------------------------------------------------------- settlement

    def _submission(self, request: lp.SubmitRequest, at: str = "") -> Submission:
        """A Submit request checked and flattened for the script; ``at`` prefixes field names (a batch item's).
        Raises INVALID_ARGUMENT for anything malformed."""
        t = request.trajectory
        if not request.HasField("trajectory"):
            raise invalid(f"{at}trajectory is required")
        if not t.lease_id or len(t.lease_id) > 256:
            raise invalid(f"{at}trajectory.lease_id is required")
        _check_id(f"{at}trajectory.trajectory_id", t.trajectory_id)
        _check_id(f"{at}holder", request.holder)
        if t.lease_version < 0:
            raise invalid(f"{at}trajectory.lease_version must be >= 0, got {t.lease_version}")
        if (
            t.status not in common_pb2.TrajectoryStatus.values()
            or t.status == common_pb2.TRAJECTORY_STATUS_UNSPECIFIED
        ):
            raise invalid(f"{at}trajectory.status is required (OK, CANCELLED, INFRA_FAILURE or TIMEOUT)")
        ok = t.status == common_pb2.TRAJECTORY_STATUS_OK
        if ok and not t.turns:
            raise invalid(f"{at}trajectory.turns is required")
        versions, problem = codec.turn_versions(t)
        if problem:
            raise invalid(f"{at}{problem}")
        if ok and not t.version_hashes:
            raise invalid(f"{at}trajectory.version_hashes is required (version -> h(v) of every version used)")
        missing = versions - set(t.version_hashes)
        if missing:
            raise invalid(
                f"{at}trajectory.version_hashes lacks versions {sorted(missing)[:10]} used by its turns"
            )
        for v, h in t.version_hashes.items():
            if v < 0 or not h or len(h) > 64:
                raise invalid(f"{at}trajectory.version_hashes[{v}] is malformed")
        scored, reward = False, 0.0
        if request.HasField("reward"):
            if request.reward.trajectory_id and request.reward.trajectory_id != t.trajectory_id:
                raise invalid(f"{at}reward.trajectory_id names another trajectory")
            scored, reward = True, request.reward.reward
        elif t.scored:
            scored, reward = True, t.reward
        if not math.isfinite(reward):
            raise invalid(f"{at}reward must be finite")
        work: list[WorkReport] = []
        for i, w in enumerate(request.work):
            _check_id(f"{at}work[{i}].actor_id", w.actor_id)
            if w.tokens < 0:
                raise invalid(f"{at}work[{i}].tokens must be >= 0")
            generation_s = _check_duration(f"{at}work[{i}].generation_time", w.generation_time)
            work.append(WorkReport(w.actor_id, w.tokens, int(generation_s * 1000)))
        return Submission(
            lease_id=t.lease_id,
            trajectory_id=t.trajectory_id,
            holder=request.holder,
            lease_version=t.lease_version,
            ok=ok,
            token_versions=(min(versions), max(versions)) if versions else None,
            scored=scored,
            reward=reward,
            trajectory=t.SerializeToString(),
            tau_window_ms=int(self.cfg.tau_window_seconds * 1000),
            version_hashes=dict(t.version_hashes),
            work=work,
            generated_tokens=sum(len(turn.action_token_ids) for turn in t.turns),
        )

    @staticmethod
    def _submit_response(verdict: Verdict, resp: lp.SubmitResponse | None = None) -> lp.SubmitResponse:
        """The verdict as a SubmitResponse, written into ``resp`` when given (a batch's result, no copy)."""
        if resp is None:
            resp = lp.SubmitResponse()
        resp.admitted = verdict.admitted
        resp.reason = verdict.reason
        resp.detail = verdict.detail
        resp.duplicate = verdict.duplicate
        resp.group_complete = verdict.group_complete
        resp.group_admitted = verdict.group_admitted
        resp.awaiting_reward = verdict.awaiting_reward
        if verdict.lease is not None:
            resp.lease.CopyFrom(verdict.lease)
        SUBMISSIONS.labels(
            "duplicate"
            if verdict.duplicate
            else ("admitted" if verdict.admitted else lp.RejectionReason.Name(verdict.reason))
        ).inc()
        return resp

    @handler
    async def Submit(self, request: lp.SubmitRequest, context: aio.ServicerContext) -> lp.SubmitResponse:
        verdict = await self.scripts.settle(self._submission(request))
        if not verdict.duplicate:
            self.signal.fire()
        return self._submit_response(verdict)

    @handler
    async def SubmitBatch(
        self, request: lp.SubmitBatchRequest, context: aio.ServicerContext
    ) -> lp.SubmitBatchResponse:
        n = len(request.submissions)
        if not 1 <= n <= MAX_BATCH_ITEMS:
            raise invalid(f"submissions must hold 1 to {MAX_BATCH_ITEMS} results, got {n}")
        leases: dict[str, int] = {}
        trajectories: dict[str, int] = {}
        for i, sub in enumerate(request.submissions):
            t = sub.trajectory
            for seen, key, what in ((leases, t.lease_id, "lease"), (trajectories, t.trajectory_id, "trajectory")):
                if key and key in seen:
                    raise invalid(
                        f"submissions[{i}] names {what} {errors.shorten(key)} as submissions[{seen[key]}] does:"
                        " one result per lease and trajectory in a batch"
                    )
                seen[key] = i
        # Malformed items are refused alone (as Submit would refuse them); the others are settled.
        results = [lp.SubmitBatchResult() for _ in range(n)]
        valid: list[tuple[int, Submission]] = []
        for i, sub in enumerate(request.submissions):
            try:
                valid.append((i, self._submission(sub, f"submissions[{i}].")))
            except errors.ServiceError as exc:
                results[i].error.CopyFrom(_item_error(exc))
        fire = False
        if valid:
            verdicts = await self.scripts.submit_batch([x for _, x in valid])
            for (i, _), verdict in zip(valid, verdicts):
                if isinstance(verdict, LedgerError):
                    results[i].error.CopyFrom(
                        _item_error(errors.error_for(verdict.code, f"submissions[{i}]: {verdict.message}"))
                    )
                    continue
                self._submit_response(verdict, results[i].response)
                fire = fire or not verdict.duplicate
        if fire:
            self.signal.fire()
        return lp.SubmitBatchResponse(results=results)

    @handler
    async def RecordReward(
        self, request: lp.RecordRewardRequest, context: aio.ServicerContext
    ) -> lp.RecordRewardResponse:
        _check_id("trajectory_id", request.trajectory_id)
        reward = request.reward.reward
        if not request.failed:
            if not request.HasField("reward"):
                raise invalid("reward is required unless failed is set")
            if request.reward.trajectory_id and request.reward.trajectory_id != request.trajectory_id:
                raise invalid("reward.trajectory_id names another trajectory")
            if not math.isfinite(reward):
                raise invalid("reward must be finite")
        out = await self.scripts.record_reward(
            trajectory_id=request.trajectory_id, failed=request.failed, reward=reward
        )
        if out.recorded:
            self.signal.fire()
        return lp.RecordRewardResponse(
            recorded=out.recorded,
            reward=out.reward,
            unknown_trajectory=out.unknown_trajectory,
            group_ready=out.group_ready,
        )

    @handler
    async def GetBatch(self, request: lp.GetBatchRequest, context: aio.ServicerContext) -> lp.Batch:
        if request.step < 0:
            raise invalid("step must be >= 0")
        if not 1 <= request.batch_size <= MAX_BATCH:
            raise invalid(f"batch_size must be within [1, {MAX_BATCH}], got {request.batch_size}")
        if request.current_version < 0:
            raise invalid("current_version must be >= 0")
        wait = self._bounded_wait(_check_duration("wait", request.wait), context)
        started = time.monotonic()
        deadline = started + wait
        evicted = evicted_tokens = 0
        while True:
            event = self.signal.current()
            current: int | None = request.current_version
            if current == 0:
                cur = await self.redis.hget(self.k("cur"), "v") or await self.redis.get(self.k("latest"))
                current = int(cur) if cur is not None else None
            policy = await self._policy()
            floor = None if current is None else int(current - policy["alpha"])
            remaining = deadline - time.monotonic()
            partial = request.allow_partial and remaining <= 0
            attempt = await self.scripts.get_batch(
                step=request.step,
                batch_size=request.batch_size,
                floor=floor,
                partial=partial,
                evicted_before=evicted,
                evicted_tokens_before=evicted_tokens,
            )
            if attempt.batch is not None:
                return await self._batch(request.step, attempt.batch, time.monotonic() - started)
            evicted += attempt.evicted_now
            evicted_tokens += attempt.evicted_tokens_now
            if attempt.evicted_now:
                self.signal.fire()
            if remaining <= 0:
                if request.allow_partial:
                    return lp.Batch(
                        step=request.step,
                        evicted=evicted,
                        evicted_tokens=evicted_tokens,
                        partial=True,
                        waited=codec.dur_ms((time.monotonic() - started) * 1000),
                        accounting=await self._accounting(),
                    )
                raise Abort(
                    grpc.StatusCode.DEADLINE_EXCEEDED,
                    f"{attempt.ready_samples} of {request.batch_size} samples are in complete, scored groups"
                    f" after {wait:.1f}s",
                )
            await self.signal.wait(event, min(remaining, self.cfg.poll_interval_seconds))

    async def _batch(self, step: int, record: BatchRecord, waited: float) -> lp.Batch:
        gids = record.group_ids
        pipe = self.redis.pipeline(transaction=False)
        for gid in gids:
            pipe.hgetall(self.k("g:" + gid))
        ghs = [codec.hdict(h) for h in await pipe.execute()]
        tids: list[list[str]] = []
        for h in ghs:
            slots = [codec.text(h.get(f"s{i}", b"X")) for i in range(int(codec.num(h, "n")))]
            tids.append([s[2:] for s in slots if s.startswith("D:")])
        pipe = self.redis.pipeline(transaction=False)
        for group in tids:
            for tid in group:
                pipe.hmget(self.k("s:" + tid), "blob", "rw", "idx")
        samples = iter(await pipe.execute())
        batch = lp.Batch(
            batch_id=record.batch_id,
            step=step,
            samples=record.samples,
            min_version=record.min_version,
            max_version=record.max_version,
            evicted=record.evicted,
            evicted_tokens=record.evicted_tokens,
            waited=codec.dur_ms(waited * 1000),
            partial=record.partial,
            accounting=await self._accounting(),
        )
        for gid, h, group in zip(gids, ghs, tids):
            trajectories = []
            for _tid in group:
                blob, rw, idx = next(samples)
                traj = common_pb2.Trajectory.FromString(blob or b"")
                traj.reward = float(rw or 0)
                traj.scored = True
                trajectories.append((int(idx or 0), traj))
            trajectories.sort(key=lambda x: x[0])
            batch.groups.append(
                lp.SampleGroup(
                    group_id=gid,
                    prompt_id=codec.text(h.get("pid", b"")),
                    trajectories=[t for _, t in trajectories],
                )
            )
        return batch

    async def _accounting(self) -> common_pb2.GenerationAccounting:
        stats = cast(dict[bytes, bytes], await self.redis.hgetall(self.k("stats")))
        return codec.accounting({k.decode(): int(v) for k, v in stats.items()})

    @handler
    async def AckBatch(
        self, request: lp.AckBatchRequest, context: aio.ServicerContext
    ) -> lp.AckBatchResponse:
        if request.step < 0:
            raise invalid("step must be >= 0")
        if not request.batch_id or len(request.batch_id) > 256:
            raise invalid("batch_id is required")
        released = await self.scripts.ack_batch(step=request.step, batch_id=request.batch_id)
        if released:
            self.signal.fire()
        return lp.AckBatchResponse(released=released)

    # ------------------------------------------------------------------------------------------------ status

    @handler
    async def GetStatus(
        self, request: lp.LedgerStatusRequest, context: aio.ServicerContext
    ) -> lp.LedgerStatus:
        if not 0 <= request.versions_limit <= 10_000:
            raise invalid("versions_limit must be within [0, 10000]")
        now = now_ms()
        pipe = self.redis.pipeline(transaction=True)  # one consistent snapshot of the counters
        for name in ("pol", "cur", "cnt", "stats"):
            pipe.hgetall(self.k(name))
        for name in (
            "latest",
            "buf:n",
            "buf:scored",
            "ready:n",
            "buf:reserved",
            "med",
            "ttl",
            "cmd:seq",
            "inflight",
        ):
            pipe.get(self.k(name))
        pipe.zcard(self.k("pool"))
        pipe.scard(self.k("gopen"))
        pipe.zcard(self.k("ready"))
        pipe.zrange(self.k("buf:byver"), 0, 0, withscores=True)
        pipe.zcount(self.k("holders"), now - 60_000, "+inf")
        pipe.zcard(self.k("active"))
        pipe.zrevrange(self.k("batches"), 0, 0, withscores=True)
        pipe.get(self.k("bsz"))
        (
            pol_h, cur, cnt, stats, latest, buf_n, buf_scored, ready_n, reserved, med, ttl, cmd_seq,
            _inflight, pending, open_groups, ready_groups, oldest, holders, active, last_batch, bsz,
        ) = await pipe.execute()  # fmt: skip
        policy = pol.numbers(pol_h)
        cur = codec.hdict(cur)
        batch = int(cur.get("B", 0) or 0)
        status = lp.LedgerStatus(
            current_step=int(cur.get("step", 0) or 0),
            current_version=int(cur["v"]) if "v" in cur else -1,
            latest_version=int(latest) if latest is not None else -1,
            open_groups=open_groups,
            latest_command_sequence=int(cmd_seq or 0),
            server_time=codec.ts_ms(now),
            lease_ttl=codec.dur_ms(float(ttl) if ttl is not None else policy["ttl0"]),
        )
        if pol_h.get(b"blob"):
            status.policy.ParseFromString(pol_h[b"blob"])
        if med is not None:
            status.median_completion_time.CopyFrom(codec.dur_ms(float(med)))
        status.versions.extend(await self._versions("-inf", "+inf", request.versions_limit or 10))
        actors = await self._actors()
        live = (lp.ACTOR_LIVENESS_ALIVE, lp.ACTOR_LIVENESS_DRAINING)
        status.actors.extend(
            a for a in actors.values() if request.include_inactive_actors or a.liveness in live
        )
        c = {int(k): int(v) for k, v in cnt.items()}
        status.leases.CopyFrom(
            lp.LeaseCounts(
                pending=pending,
                active=c.get(lp.LEASE_STATE_ACTIVE, 0),
                settled=c.get(lp.LEASE_STATE_SETTLED, 0),
                rejected=c.get(lp.LEASE_STATE_REJECTED, 0),
                expired=c.get(lp.LEASE_STATE_EXPIRED, 0),
                cancelled=c.get(lp.LEASE_STATE_CANCELLED, 0),
                released=c.get(lp.LEASE_STATE_RELEASED, 0),
            )
        )
        s = {k.decode(): int(v) for k, v in stats.items()}
        status.buffer.CopyFrom(
            lp.BufferStats(
                samples=int(buf_n or 0),
                scored_samples=int(buf_scored or 0),
                ready_groups=ready_groups,
                ready_samples=int(ready_n or 0),
                capacity=pol.derived_capacity(
                    policy,
                    max(holders, active),
                    batch or int(bsz or 0),
                    int(policy["G"]),
                    ahead=max(0, (int(last_batch[0][1]) if last_batch else -1) - int(cur.get("step", 0) or 0) + 1)
                    if "v" in cur
                    else None,
                ),
                evicted_total=s.get("evicted", 0),
                oldest_version=int(oldest[0][1]) if oldest else -1,
                reserved_samples=int(reserved or 0),
            )
        )
        status.accounting.CopyFrom(codec.accounting(s))
        status.settlement.CopyFrom(
            lp.SettlementStats(
                admitted=s.get("admitted", 0),
                duplicates=s.get("dup", 0),
                rejected={
                    lp.RejectionReason.Name(int(k[4:])): v
                    for k, v in s.items()
                    if k.startswith("rej:") and int(k[4:]) in lp.RejectionReason.values()
                },
            )
        )
        status.task_pools.extend(await task_pools(self.redis, self.p, status.policy))  # multi-task jobs
        return status
