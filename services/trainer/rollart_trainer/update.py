"""UPDATE: make version ``v`` active on the actors for the rollout of a step (docs/trainer.md, "The step
protocol", 3). Delta mode plans the step in the ledger (Commit(v) on every eligible actor); full-weight modes
first make every live actor pull or load ``v``. An actor that does not apply the commit within the grace is left
behind and catches up through its relay.

Lagged full weights (ASYNC, alpha > 1, ``buckets`` or ``full_checkpoint``): the same load RPC runs in the
background from the moment ``v`` is registered, while the actors generate on their old weights. The samples of
the rollout after UPDATE(v) are trained from version v + 1 on, so an actor may stay on v + 1 - alpha (``need``)
or newer; the UPDATE waits only for actors below it. The step is planned on the version most actors can run it
on (the ledger plans one version per step), not below ``need``. Lag 1, SYNC, ONE_OFF and AREAL (whose admission
has no version floor to bound a lagging actor) load every step as before, and so does the update after the
last step."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import Counter
from dataclasses import dataclass

import grpc
from grpc import aio

from rollart.runtime.telemetry import log_fields
from rollart.runtime.timeutil import seconds as _seconds
from rollart.runtime.timeutil import timestamp as _ts
from rollart.v1 import actor_pb2, common_pb2, ledger_pb2, llmproxy_pb2, trainer_pb2

from .config import TrainerConfig
from .jobspec import ASYNC, BUCKETS, DELTA, JobError, Settings
from .peers import Peers, through_outage
from .publishing import Publication

log = logging.getLogger(__name__)

T = trainer_pb2


@dataclass
class _Load:
    """One background full-weight load RPC of an actor (at most one in flight per actor)."""

    actor_id: str
    version: int
    task: asyncio.Task | None = None
    error: str = ""

    @property
    def running(self) -> bool:
        return self.task is not None and not self.task.done()


def lags_full_weights(settings: Settings) -> bool:
    """Whether full-weight loads run in the background (ASYNC with alpha > 1; AREAL's admission bounds no
    version, so a lagging actor there would add its lag to the staleness unchecked)."""
    return settings.weight_sync != DELTA and settings.mode == ASYNC and settings.alpha > 1


def oldest_allowed(v: int, alpha: int) -> int:
    """The oldest version an actor may generate on after UPDATE(v): its samples are trained from v + 1 on,
    and the ledger admits to that batch versions >= (v + 1) - alpha."""
    return v + 1 - alpha


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
        self.lagged = lags_full_weights(settings)
        self._loads: dict[str, _Load] = {}  # actor id -> its newest background load
        # actor id -> (registered_at, version a background load applied): the ledger's report may trail it
        self._reached: dict[str, tuple[int, int]] = {}
        self._latest: common_pb2.PolicyVersion | None = None  # the newest version to load
        self._prefetches: set[asyncio.Task] = set()  # held: the loop keeps only weak references
        if self.lagged:
            # Start the download as soon as v is registered, not at the next UPDATE (after GetBatch).
            previous = publication.on_published

            def published(v: int) -> None:
                previous(v)
                self.published(v)

            publication.on_published = published

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
        final = bool(st.max_steps) and step > st.max_steps  # after the last step: v on every actor
        if self.lagged and v > 0 and not final:
            planned, plan = await self._update_lagged(step, v, version)
            return await self._finish_plan(step, v, planned, plan)
        if st.weight_sync != DELTA and v > 0:
            if self._loads:  # loads still in flight from lagged steps: let them end first (no second download)
                await self._settle_loads(time.monotonic() + self.cfg.commit_wait_seconds)
            await self._load_full(v, version)
        elif v > 0 and self.cfg.stage_wait_seconds > 0:
            deadline = time.monotonic() + self.cfg.stage_wait_seconds
            while time.monotonic() < deadline:
                actors = await self.live_actors()
                if actors and all(self._ready_for(a, v) for a in actors):
                    break
                await asyncio.sleep(0.1)
        plan = await self._plan(step, v)
        return await self._finish_plan(step, v, v, plan)

    async def _finish_plan(self, step: int, v: int, pv: int, plan: ledger_pb2.StepPlan) -> float:
        """Wait for the commits of the plan (of version ``pv``); returns the longest update pause of the actors
        on ``pv``."""
        if not plan.all_committed:
            plan = await self._await_commits(step, pv, plan)
        if plan.excluded and self.settings.weight_sync == DELTA and v > 0:
            # Actors that fell behind (restarted, missed a delta) catch up through their relay; they rejoin
            # the plan of a later step.
            await self.publication.relay_commit(v, step)
        pauses = [0.0]
        for a in await self.live_actors():
            if a.weights.active_version == pv and a.weights.HasField("last_pause"):
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

    async def _plan_once(self, step: int, v: int, commit_deadline: float) -> ledger_pb2.StepPlan:
        req = ledger_pb2.PlanStepRequest(step=step, version=v, batch_size=self.settings.batch_size)
        req.commit_deadline.CopyFrom(_ts(commit_deadline))
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

    @staticmethod
    def _no_eligible(exc: aio.AioRpcError) -> bool:
        return exc.code() == grpc.StatusCode.FAILED_PRECONDITION and "no actor is eligible" in (exc.details() or "")

    async def _plan(self, step: int, v: int) -> ledger_pb2.StepPlan:
        deadline = time.monotonic() + self.cfg.commit_wait_seconds
        commit_deadline = time.time() + self.cfg.commit_wait_seconds
        relayed = False
        while True:
            try:
                return await self._plan_once(step, v, commit_deadline)
            except aio.AioRpcError as exc:
                if not self._no_eligible(exc):
                    raise
                if time.monotonic() >= deadline:
                    raise JobError("FAILED_PRECONDITION", f"step {step}: {exc.details()}") from None
                if not relayed and v > 0 and self.settings.weight_sync == DELTA:
                    await self.publication.relay_commit(v, step)  # actors that are behind catch up from the relay cache
                    relayed = True
                await asyncio.sleep(0.5)

    async def _load_rpc(
        self, endpoint: str, v: int, version: common_pb2.PolicyVersion, timeout: float | None = None
    ) -> None:
        """One actor pulls v's buckets or loads v's checkpoint, applied at its next safe point."""
        stub = self.peers.actor(endpoint)
        timeout = self.cfg.commit_wait_seconds if timeout is None else timeout
        if self.settings.weight_sync == BUCKETS:
            await stub.PullBuckets(
                actor_pb2.PullBucketsRequest(
                    version=v,
                    hash=version.hash,
                    bucket_keys=version.bucket_keys,
                    mooncake_master=self.spec.publish.mooncake_master or self.cfg.mooncake_master or "",
                    apply=True,
                ),
                timeout=timeout,
            )
        else:
            await stub.LoadCheckpoint(
                actor_pb2.LoadCheckpointRequest(uri=self.spec.publish.checkpoint_store, version=v, hash=version.hash),
                timeout=timeout,
            )

    async def _load_full(self, v: int, version: common_pb2.PolicyVersion) -> None:
        """Full-weight update: every live actor pulls v's buckets or loads v's checkpoint, applied at once."""
        actors = [a for a in await self.live_actors() if self._known(a) != v and a.endpoint]

        results = await asyncio.gather(
            *(self._load_through_outage(a, v, version) for a in actors), return_exceptions=True
        )
        for a, r in zip(actors, results):
            if isinstance(r, BaseException):
                log.warning("full-weight update of %s to v%d failed: %s", a.actor_id, v, r)

    async def _load_through_outage(self, a: ledger_pb2.LedgerActor, v: int, version: common_pb2.PolicyVersion) -> None:
        """A load refused because the actor (or the store, from the actor) is unreachable, as across a link that is
        down, is asked again until the commit wait ends: the load is idempotent (v, hash-checked), and without
        it every actor behind the link would miss the step. (Lagged loads retry in the background instead.)"""

        async def load(_: None, timeout: float) -> None:
            await self._load_rpc(a.endpoint, v, version, timeout=timeout)

        wait = self.cfg.commit_wait_seconds
        await through_outage(
            load, None, budget=wait, attempt_timeout=wait, what=f"full-weight load of {a.actor_id} to v{v}"
        )

    # ----------------------------------------------------------------------------- lagged full weights

    @staticmethod
    def _registered(a: ledger_pb2.LedgerActor) -> int:
        return a.registered_at.seconds * 1_000_000_000 + a.registered_at.nanos

    def _known(self, a: ledger_pb2.LedgerActor) -> int:
        """The actor's active version: the ledger's report, or what a background load applied since (the report
        trails it); a re-registered actor (restarted) counts only by its report."""
        reg, applied = self._reached.get(a.actor_id, (0, -1))
        if reg != self._registered(a):
            return a.weights.active_version
        return max(a.weights.active_version, applied)

    def published(self, v: int) -> None:
        """Publication hook: v is registered; start its background loads (lagged mode only)."""
        if not self.lagged or v <= 0:
            return
        with contextlib.suppress(RuntimeError):  # no running loop: the next UPDATE starts them
            task = asyncio.ensure_future(self._prefetch_loads(v))
            self._prefetches.add(task)
            task.add_done_callback(self._prefetches.discard)

    async def _prefetch_loads(self, v: int) -> None:
        try:
            await self._start_loads(v)
        except Exception as exc:  # noqa: BLE001 - the next UPDATE starts them
            log.warning("background full-weight loads of v%d not started: %s", v, exc)

    async def _start_loads(
        self, v: int, version: common_pb2.PolicyVersion | None = None
    ) -> list[ledger_pb2.LedgerActor]:
        """A background load of v for every live actor below it that has none in flight; returns the actors
        (with an endpoint)."""
        if version is None:
            version = await self.version(v)
        actors = [a for a in await self.live_actors() if a.endpoint]
        if self._latest is None or version.version > self._latest.version:
            self._latest = version
        for a in actors:
            load = self._loads.get(a.actor_id)
            if self._known(a) < v and not (load is not None and load.running):
                self._start(a.actor_id, a.endpoint, self._registered(a), version)
        return actors

    def _start(self, actor_id: str, endpoint: str, reg: int, version: common_pb2.PolicyVersion) -> _Load:
        v = version.version
        load = _Load(actor_id, v)
        if actor_id in self._loads and self._loads[actor_id].error:
            log.info("retrying the full-weight load of %s (to v%d)", actor_id, v)

        async def run() -> None:
            try:
                await self._load_rpc(endpoint, v, version)
            except Exception as exc:  # noqa: BLE001 - logged and kept: the UPDATE retries or leaves it behind
                load.error = (exc.details() if isinstance(exc, aio.AioRpcError) else str(exc)) or type(exc).__name__
                log.warning("background full-weight load of %s to v%d failed: %s", actor_id, v, load.error)
                return
            prev = self._reached.get(actor_id)
            self._reached[actor_id] = (reg, max(v, prev[1] if prev and prev[0] == reg else -1))
            latest = self._latest
            if latest is not None and latest.version > v and self._loads.get(actor_id) is load:
                self._start(actor_id, endpoint, reg, latest)  # a newer version was published meanwhile

        load.task = asyncio.ensure_future(run())
        self._loads[actor_id] = load
        return load

    async def close(self) -> None:
        """The job ends: cancel the background loads still in flight (before the channels close under them)."""
        tasks = [*self._prefetches, *(ld.task for ld in self._loads.values() if ld.running and ld.task is not None)]
        for task in tasks:
            task.cancel()
        if tasks:
            await asyncio.gather(*tasks, return_exceptions=True)

    async def _settle_loads(self, deadline: float) -> None:
        """Until the loads in flight end (their outcome is logged by each), at most until ``deadline``."""
        while True:
            running = [ld.task for ld in self._loads.values() if ld.running and ld.task is not None]
            remaining = deadline - time.monotonic()
            if not running or remaining <= 0:
                return
            await asyncio.wait(running, timeout=remaining)

    async def _catch_up(self, a: ledger_pb2.LedgerActor, need: int, deadline: float) -> None:
        """Until ``a`` runs ``need`` or newer: its background load is awaited; a failed one is retried once
        (awaited); past that or the deadline the actor is left behind (the ledger plans without it)."""
        retried = False
        while self._known(a) < need:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                log.warning("%s is still below v%d; going on without it", a.actor_id, need)
                return
            load = self._loads.get(a.actor_id)
            if load is None or not load.running:
                if load is not None and load.error:
                    if retried:
                        log.warning("%s stays below v%d: its full-weight load failed again", a.actor_id, need)
                        return
                    retried = True
                assert self._latest is not None
                load = self._start(a.actor_id, a.endpoint, self._registered(a), self._latest)
            assert load.task is not None
            await asyncio.wait([load.task], timeout=remaining)

    async def _update_lagged(
        self, step: int, v: int, version: common_pb2.PolicyVersion
    ) -> tuple[int, ledger_pb2.StepPlan]:
        """Loads of v in the background; wait only for actors below the oldest allowed version; plan the step
        on the version most actors can run it on."""
        need = oldest_allowed(v, self.settings.alpha)
        deadline = time.monotonic() + self.cfg.commit_wait_seconds
        actors = await self._start_loads(v, version)
        behind = [a for a in actors if self._known(a) < need]
        if behind:
            log.info(
                "waiting for full weights",
                extra=log_fields(step=step, version=v, need=need, actors={a.actor_id: self._known(a) for a in behind}),
            )
            await asyncio.gather(*(self._catch_up(a, need, deadline) for a in behind))
        return await self._plan_lagged(step, v, need)

    def _eligible(self, a: ledger_pb2.LedgerActor, c: int) -> bool:
        """The ledger's eligibility of ``a`` for a plan of version ``c`` (scheduling.classify)."""
        if a.liveness != ledger_pb2.ACTOR_LIVENESS_ALIVE or not a.weights.loaded:
            return False
        return a.weights.active_version == c or self._ready_for(a, c)

    def plan_version(self, actors: list[ledger_pb2.LedgerActor], v: int, lo: int) -> int:
        """The version in [lo, v] the most actors are eligible for, the newest on ties (v when none is)."""
        counts: Counter[int] = Counter()
        for a in actors:
            for c in {a.weights.active_version, a.weights.active_version + 1}:
                if lo <= c <= v and self._eligible(a, c):
                    counts[c] += 1
        return max(counts, key=lambda c: (counts[c], c)) if counts else v

    async def _plan_lagged(self, step: int, v: int, need: int) -> tuple[int, ledger_pb2.StepPlan]:
        """(the version planned, the plan)."""
        floor = 0  # the ledger plans no version older than the current plan's
        try:
            cur = await self.peers.ledger.GetStepPlan(ledger_pb2.GetStepPlanRequest(step=0))
        except aio.AioRpcError as exc:
            if exc.code() != grpc.StatusCode.NOT_FOUND:
                raise
        else:
            if cur.step == step:  # planned before a restart: the same plan again
                return cur.version, await self._plan(step, cur.version)
            floor = cur.version
        deadline = time.monotonic() + self.cfg.commit_wait_seconds
        commit_deadline = time.time() + self.cfg.commit_wait_seconds
        while True:
            w = self.plan_version(await self.live_actors(), v, max(need, floor))
            try:
                return w, await self._plan_once(step, w, commit_deadline)
            except aio.AioRpcError as exc:  # an actor moved between the read and the plan: read again
                if not self._no_eligible(exc):
                    raise
                if time.monotonic() >= deadline:
                    raise JobError("FAILED_PRECONDITION", f"step {step}: {exc.details()}") from None
                await asyncio.sleep(0.5)

    async def version(self, v: int) -> common_pb2.PolicyVersion:
        return await self.peers.ledger.GetVersion(ledger_pb2.GetVersionRequest(version=v))

    async def actor_versions(self) -> dict[str, int]:
        with contextlib.suppress(aio.AioRpcError):
            return {a.actor_id: a.weights.active_version for a in await self.live_actors()}
        return {}
