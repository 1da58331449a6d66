"""UPDATE: make version ``v`` active on the actors for the rollout of a step (docs/trainer.md, "The step
protocol", 3). Delta mode plans the step in the ledger (Commit(v) on every eligible actor); full-weight modes
first make every live actor pull or load ``v``. An actor that does not apply the commit within the grace is left
behind and catches up through its relay."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time

import grpc
from grpc import aio

from rollart.runtime.telemetry import log_fields
from rollart.runtime.timeutil import seconds as _seconds
from rollart.runtime.timeutil import timestamp as _ts
from rollart.v1 import actor_pb2, common_pb2, ledger_pb2, llmproxy_pb2, trainer_pb2

from .config import TrainerConfig
from .jobspec import BUCKETS, DELTA, JobError, Settings
from .peers import Peers
from .publishing import Publication

log = logging.getLogger(__name__)

T = trainer_pb2


class Updater:
    """The UPDATE phase against the ledger, the proxy and the actors."""

    def __init__(
        self, spec: T.TrainerJobSpec, cfg: TrainerConfig, settings: Settings, peers: Peers, publication: Publication
    ) -> None:
        self.spec = spec
        self.cfg = cfg
        self.settings = settings
        self.peers = peers
        self.publication = publication

    async def _drain(self) -> None:
        """ONE_OFF: wait until no generation is in flight, so the update preempts nothing."""
        if self.peers.proxy is None:
            return
        deadline = time.monotonic() + self.cfg.drain_wait_seconds
        while time.monotonic() < deadline:
            st = await self.peers.proxy.GetStatus(llmproxy_pb2.ProxyStatusRequest())
            if st.admission.in_flight_requests == 0:
                return
            await asyncio.sleep(0.02)
        log.warning("in-flight requests did not drain within %.0fs; updating anyway", self.cfg.drain_wait_seconds)

    async def live_actors(self) -> list[ledger_pb2.LedgerActor]:
        resp = await self.peers.ledger.ListActors(ledger_pb2.ListActorsRequest())
        return [
            a
            for a in resp.actors
            if a.liveness in (ledger_pb2.ACTOR_LIVENESS_ALIVE, ledger_pb2.ACTOR_LIVENESS_DRAINING)
        ]

    @staticmethod
    def _ready_for(a: ledger_pb2.LedgerActor, v: int) -> bool:
        w = a.weights
        if w.loaded and w.active_version >= v:
            return True
        return (
            w.loaded
            and w.active_version == v - 1
            and any(s.version == v and s.complete and not s.error for s in w.staged)
        )

    async def update(self, step: int, v: int, *, drain: bool = False) -> float:
        """Make ``v`` active on the actors for the rollout of ``step``; returns the longest update pause."""
        st = self.settings
        if drain:
            await self._drain()
        version = await self.version(v)
        if st.weight_sync != DELTA and v > 0:
            await self._load_full(v, version)
        elif v > 0 and self.cfg.stage_wait_seconds > 0:
            deadline = time.monotonic() + self.cfg.stage_wait_seconds
            while time.monotonic() < deadline:
                actors = await self.live_actors()
                if actors and all(self._ready_for(a, v) for a in actors):
                    break
                await asyncio.sleep(0.1)
        plan = await self._plan(step, v)
        if not plan.all_committed:
            plan = await self._await_commits(step, v, plan)
        if plan.excluded and st.weight_sync == DELTA and v > 0:
            # Actors that fell behind (restarted, missed a delta) catch up through their relay; they rejoin
            # the plan of a later step.
            await self.publication.relay_commit(v, step)
        pauses = [0.0]
        for a in await self.live_actors():
            if a.weights.active_version == v and a.weights.HasField("last_pause"):
                pauses.append(_seconds(a.weights.last_pause))
        return max(pauses)

    async def _await_commits(self, step: int, v: int, plan: ledger_pb2.StepPlan) -> ledger_pb2.StepPlan:
        """Until every allocated actor has v active. An actor that has not after ``commit_grace_seconds``
        while others have (it died and the ledger does not know yet, or it is stuck) is left behind: it
        gets no work it can be admitted for, and it catches up through its relay or is declared dead."""
        t0 = time.monotonic()
        while True:
            if plan.all_committed:
                return plan
            waited = time.monotonic() - t0
            done = [a.actor_id for a in plan.allocations if a.committed]
            if (done and waited >= self.cfg.commit_grace_seconds) or waited >= self.cfg.commit_wait_seconds:
                errors = {a.actor_id: a.commit_error or "no answer" for a in plan.allocations if not a.committed}
                if not done:
                    raise JobError("DEADLINE_EXCEEDED", f"step {step}: no actor applied Commit(v{v}): {errors}")
                log.warning("step %d: going on without %s (Commit(v%d) not applied); %s did", step, errors, v, done)
                return plan
            await asyncio.sleep(0.05)
            plan = await self.peers.ledger.GetStepPlan(ledger_pb2.GetStepPlanRequest(step=step))

    async def _plan(self, step: int, v: int) -> ledger_pb2.StepPlan:
        deadline = time.monotonic() + self.cfg.commit_wait_seconds
        req = ledger_pb2.PlanStepRequest(step=step, version=v, batch_size=self.settings.batch_size)
        req.commit_deadline.CopyFrom(_ts(time.time() + self.cfg.commit_wait_seconds))
        relayed = False
        while True:
            try:
                plan = await self.peers.ledger.PlanStep(req)
                log.info(
                    "step planned",
                    extra=log_fields(
                        step=step,
                        version=v,
                        allocations={a.actor_id: a.requests for a in plan.allocations},
                        excluded={a.actor_id: ledger_pb2.ExclusionReason.Name(a.reason) for a in plan.excluded},
                    ),
                )
                return plan
            except aio.AioRpcError as exc:
                if exc.code() != grpc.StatusCode.FAILED_PRECONDITION or "no actor is eligible" not in (
                    exc.details() or ""
                ):
                    raise
                if time.monotonic() >= deadline:
                    raise JobError("FAILED_PRECONDITION", f"step {step}: {exc.details()}") from None
                if not relayed and v > 0 and self.settings.weight_sync == DELTA:
                    await self.publication.relay_commit(v, step)  # actors that are behind catch up from the relay cache
                    relayed = True
                await asyncio.sleep(0.5)

    async def _load_full(self, v: int, version: common_pb2.PolicyVersion) -> None:
        """Full-weight update: every live actor pulls v's buckets or loads v's checkpoint, applied at once."""
        actors = [a for a in await self.live_actors() if a.weights.active_version != v and a.endpoint]

        async def one(a: ledger_pb2.LedgerActor) -> None:
            stub = self.peers.actor(a.endpoint)
            if self.settings.weight_sync == BUCKETS:
                await stub.PullBuckets(
                    actor_pb2.PullBucketsRequest(
                        version=v,
                        hash=version.hash,
                        bucket_keys=version.bucket_keys,
                        mooncake_master=self.spec.publish.mooncake_master or self.cfg.mooncake_master or "",
                        apply=True,
                    ),
                    timeout=self.cfg.commit_wait_seconds,
                )
            else:
                await stub.LoadCheckpoint(
                    actor_pb2.LoadCheckpointRequest(
                        uri=self.spec.publish.checkpoint_store, version=v, hash=version.hash
                    ),
                    timeout=self.cfg.commit_wait_seconds,
                )

        results = await asyncio.gather(*(one(a) for a in actors), return_exceptions=True)
        for a, r in zip(actors, results):
            if isinstance(r, BaseException):
                log.warning("full-weight update of %s to v%d failed: %s", a.actor_id, v, r)

    async def version(self, v: int) -> common_pb2.PolicyVersion:
        return await self.peers.ledger.GetVersion(ledger_pb2.GetVersionRequest(version=v))

    async def actor_versions(self) -> dict[str, int]:
        with contextlib.suppress(aio.AioRpcError):
            return {a.actor_id: a.weights.active_version for a in await self.live_actors()}
        return {}
