"""The ledger's control state: the job policy, policy versions, actors, step plans and the command stream.

Each method does one request's work on the store, after the servicer checked the request
(``validators``); refusals that depend on the state raise ``rollart.runtime.errors`` errors (or the scripts'
``LedgerError``). See docs/ledger.md.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator
from typing import Any, cast

import redis.asyncio as aioredis

from rollart.runtime import errors
from rollart.runtime.telemetry import log_fields
from rollart.v1 import common_pb2
from rollart.v1 import ledger_pb2 as lp

from . import codec
from . import policy as pol
from .scripts import now_ms
from .store import LATEST_VERSION, Entries, Part

log = logging.getLogger(__name__)
# A new version is at most this far above the latest (the first at most this far above -1).
MAX_VERSION_STEP = 1024


class Control(Part):
    """Policy, versions, actors, steps and commands."""

    async def set_policy(self, request: lp.SetJobPolicyRequest) -> lp.JobPolicy:
        if self.cfg.job_id and request.policy.job_id != self.cfg.job_id:
            raise errors.FailedPrecondition(f"this ledger serves job {self.cfg.job_id}, not {request.policy.job_id}")
        try:
            filled = pol.fill(request.policy, "")
        except pol.PolicyError as exc:
            raise errors.InvalidArgument("", str(exc)) from None
        await self.scripts.set_policy(filled)
        log.info("job policy set", extra=log_fields(job_id=filled.job_id))
        return filled

    async def get_policy(self) -> lp.JobPolicy:
        blob = cast(bytes | None, await self.redis.get(self.k("policy")))
        if blob is None:
            return pol.defaults(self.cfg.job_id)
        return lp.JobPolicy.FromString(blob)

    async def register_version(
        self, request: lp.RegisterVersionRequest, v: common_pb2.PolicyVersion
    ) -> lp.RegisterVersionResponse:
        """Registers ``v`` (the request's version, checked by ``validators.register_version``)."""
        latest_raw = await self.redis.get(self.k("latest"))
        latest = int(latest_raw) if latest_raw is not None else -1
        if v.version > latest + MAX_VERSION_STEP:
            # One call must not end a job: a version far ahead (2^63-1) would make every later one "not greater".
            raise errors.FailedPrecondition(
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
                raise errors.FailedPrecondition(f"version {v.version} is already registered with different content")
        else:
            log.info("version registered", extra=log_fields(version=v.version, base=v.base_version))
        LATEST_VERSION.set(max(latest, stored.version))
        return lp.RegisterVersionResponse(version=stored, created=bool(created))

    async def get_version(self, request: lp.GetVersionRequest) -> common_pb2.PolicyVersion:
        number: Any = request.version
        if request.latest:
            number = await self.redis.get(self.k("latest"))
            if number is None:
                raise errors.NotFound("no version is registered yet")
            number = number.decode()
        blob = cast(bytes | None, await self.redis.hget(self.k("versions"), str(number)))
        if blob is None:
            raise errors.NotFound(f"version {number} is not registered")
        return common_pb2.PolicyVersion.FromString(blob)

    async def list_versions(self, request: lp.ListVersionsRequest) -> lp.ListVersionsResponse:
        hi = str(request.to_version) if request.HasField("to_version") else "+inf"
        limit = request.limit or 100
        return lp.ListVersionsResponse(
            versions=await self.versions(request.from_version, hi, limit),
            latest_version=int(await self.redis.get(self.k("latest")) or -1),
        )

    # ------------------------------------------------------------------------------------------------ actors

    async def register_actor(self, request: lp.RegisterActorRequest) -> lp.RegisterActorResponse:
        a = request.actor
        h = await self.scripts.register_actor(a)
        policy = await self.policy()
        log.info(
            "actor registered", extra=log_fields(actor_id=a.actor_id, endpoint=a.endpoint, region=a.region)
        )
        latest = await self.redis.get(self.k("latest"))
        return lp.RegisterActorResponse(
            actor=codec.actor_from(h, now_ms(), policy["tout"]),
            heartbeat_interval=codec.dur_ms(policy["tout"] / 3),
            latest_version=int(latest) if latest is not None else -1,
        )

    async def heartbeat(self, request: lp.ActorHeartbeatRequest) -> lp.ActorHeartbeatResponse:
        now = now_ms()
        beat = await self.scripts.heartbeat(
            actor_id=request.actor_id,
            weights=request.weights if request.HasField("weights") else None,
            observed_tokens_per_s=request.observed_tokens_per_s,
            in_flight_requests=request.in_flight_requests,
            draining=request.draining,
            relay_id=request.relay_id,
        )
        if beat.status != "ok":
            if beat.status == "dead":
                self.signal.fire()
            raise errors.NotFound(
                f"actor {request.actor_id} is not registered or was presumed dead; register again",
            )
        policy = await self.policy()
        return lp.ActorHeartbeatResponse(
            expires_at=codec.ts_ms(now + policy["tout"]),
            tau=beat.tau,
            latest_command_sequence=beat.latest_command_sequence,
        )

    async def leave_actor(self, request: lp.LeaveActorRequest) -> lp.LeaveActorResponse:
        left = await self.scripts.leave_actor(request.actor_id)
        if left.leases_returned:
            self.signal.fire()
        log.info("actor left", extra=log_fields(actor_id=request.actor_id, reason=request.reason[:200]))
        return lp.LeaveActorResponse(leases_returned=left.leases_returned, leases_unassigned=left.leases_unassigned)

    async def get_actor(self, actor_id: str) -> lp.LedgerActor:
        actors = await self.actors([actor_id])
        if actor_id not in actors:
            raise errors.NotFound(f"no actor {actor_id}")
        return actors[actor_id]

    async def list_actors(self, request: lp.ListActorsRequest) -> lp.ListActorsResponse:
        actors = await self.actors()
        live = (lp.ACTOR_LIVENESS_ALIVE, lp.ACTOR_LIVENESS_DRAINING)
        return lp.ListActorsResponse(
            actors=[
                a
                for a in actors.values()
                if (request.include_inactive or a.liveness in live)
                and (not request.region or a.region == request.region)
            ]
        )

    # ------------------------------------------------------------------------------------------------ steps

    async def plan_step(self, request: lp.PlanStepRequest) -> lp.StepPlan:
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

    async def get_plan(self, step: int) -> lp.StepPlan:
        return await self.planner.get(step)

    async def await_step_committed(self, step: int, wait: float) -> lp.StepPlan:
        """The step's plan once every commit is done, or when ``wait`` (seconds, bounded) has passed."""
        deadline = time.monotonic() + wait
        while True:
            plan = await self.get_plan(step)
            remaining = deadline - time.monotonic()
            if plan.all_committed or remaining <= 0:
                return plan
            await asyncio.sleep(min(remaining, self.cfg.poll_interval_seconds / 2))

    # ----------------------------------------------------------------------------------------------- commands

    async def watch_commands(self, request: lp.WatchCommandsRequest) -> AsyncIterator[lp.LedgerCommand]:
        sub, kind = request.subscriber_id, request.kind
        key = self.k("cmds")
        if request.only_new:
            last = f"{int(await self.redis.get(self.k('cmd:seq')) or 0)}-1"
        elif request.from_sequence > 0:
            first = cast(Entries, await self.redis.xrange(key, count=1))
            if first:
                oldest = int(first[0][0].decode().split("-")[0])
                if request.from_sequence < oldest - 1:
                    raise errors.OutOfRange(
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
                    list[tuple[bytes, Entries]] | None, await conn.xread({key: last}, block=1000, count=256)
                )
                for _stream, entries in reply or ():
                    for entry_id, fields in entries:
                        last = entry_id.decode()
                        kinds = [int(x) for x in fields.get(b"k", b"").decode().split(",") if x]
                        if codec.addressed(fields.get(b"t", b"").decode(), kinds, sub, kind):
                            yield codec.command_from(entry_id, fields)
        finally:
            await conn.aclose()

    async def ack_command(self, request: lp.AckCommandRequest) -> lp.AckCommandResponse:
        entries = cast(
            Entries,
            await self.redis.xrange(self.k("cmds"), min=f"{request.sequence}-1", max=f"{request.sequence}-1"),
        )
        if not entries:
            raise errors.NotFound(
                f"command {request.sequence} is unknown or no longer retained"
            )
        cmd = codec.command_from(*entries[0])
        sub = request.subscriber_id
        if cmd.target and cmd.target != sub and not cmd.target.startswith(sub + "/"):
            raise errors.FailedPrecondition(f"command {request.sequence} is addressed to {cmd.target}, not {sub}")
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
