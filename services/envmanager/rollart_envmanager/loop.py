"""One environment loop (:class:`Loop`) and the group of loops one StartLoops made (:class:`Group`).

A loop: take a lease from the ledger -> run the episode (episode.py) -> close -> send the trajectory to the
reward service without waiting -> settle with the ledger (Submit; the reward follows through RecordReward
when scoring finishes) -> next lease. A slow environment delays only its own loop. In batch-level interaction
the loops of a group run in lockstep waves (waves.py).

Failures: an infrastructure failure or timeout releases the lease with that reason and cause (the sample goes
back to the pool); it is never submitted as a zero reward. A cancelled lease aborts its trajectory at once and
releases it as CANCELLED. The ledger, reward and proxy calls go through the loop's :class:`~.manager.Manager`.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, fields
from typing import TYPE_CHECKING, Any, cast

import grpc
from grpc import aio

from rollart.runtime.telemetry import log_fields
from rollart.runtime.timeutil import duration as dur
from rollart.runtime.timeutil import seconds as secs
from rollart.v1 import common_pb2, envmanager_pb2
from rollart.v1 import ledger_pb2 as lp

from . import metrics
from .envs.registry import TaskConfig
from .episode import (
    TIMEOUT,
    Episode,
    EpisodeSpec,
    ExternalAbort,
    InfraFailure,
    new_trajectory_id,
    now_ts,
)
from .latency import LatencySampler
from .peers import PeerUnavailable
from .waves import ENDED, SCORED, Waves

if TYPE_CHECKING:
    from .manager import Manager

log = logging.getLogger(__name__)

LS = envmanager_pb2.LoopState
GS = envmanager_pb2.LoopGroupState
STOPPED_STATES = (LS.LOOP_STATE_STOPPED, LS.LOOP_STATE_FAILED)
# A loop whose environment cannot even be opened this many times in a row stops as FAILED.
MAX_CONSECUTIVE_SETUP_FAILURES = 5
SETUP_CAUSES = ("env-unavailable",)
# "expired": the lease is final already; releasing it only reports the tokens spent on it.
RELEASE_FOR = {"cancelled": lp.RELEASE_REASON_CANCELLED, "aborted": lp.RELEASE_REASON_ABANDONED,
               "shutdown": lp.RELEASE_REASON_SHUTDOWN, "external": lp.RELEASE_REASON_ABANDONED,
               "expired": lp.RELEASE_REASON_ABANDONED}


class LedgerError(Exception):
    """The ledger could not be reached or refused a call the loop cannot do without.

    ``unreachable``: it did not answer (UNAVAILABLE, DEADLINE_EXCEEDED, no address), as opposed to an answer
    that refused the call; either way a settlement that ends so is an infrastructure failure, never a
    rejection (only the ledger rejects, with a reason)."""

    def __init__(self, message: str, unreachable: bool = True) -> None:
        super().__init__(message)
        self.unreachable = unreachable


@dataclass
class Counters:
    trajectories: int = 0
    admitted: int = 0
    rejected: int = 0
    cancelled: int = 0
    infra_failures: int = 0
    timeouts: int = 0
    turns: int = 0
    tokens_generated: int = 0

    def add(self, other: Counters) -> None:
        for f in fields(self):
            setattr(self, f.name, getattr(self, f.name) + getattr(other, f.name))

    def proto(self) -> envmanager_pb2.LoopCounters:
        return envmanager_pb2.LoopCounters(**{f.name: getattr(self, f.name) for f in fields(self)})


class Group:
    def __init__(self, request: envmanager_pb2.StartLoopsRequest, config: TaskConfig, holder_prefix: str,
                 lease_tasks: list[str]) -> None:
        self.request = request
        self.group_id = request.group_id
        self.config = config
        self.holder_prefix = holder_prefix
        self.lease_tasks = lease_tasks
        self.loops: list[Loop] = []
        self.started_at = now_ts()
        self.stop_requested = False
        self.key = request.SerializeToString(deterministic=True)
        # Lockstep waves for batch-level interaction; None keeps the trajectory-level path untouched.
        batch = request.env.interaction == envmanager_pb2.INTERACTION_MODE_BATCH
        self.waves: Waves | None = Waves() if batch else None

    def state(self) -> envmanager_pb2.LoopGroupState:
        states = [lo.state for lo in self.loops]
        if all(s == LS.LOOP_STATE_FAILED for s in states):
            return GS.LOOP_GROUP_STATE_FAILED
        if all(s in STOPPED_STATES for s in states):
            return GS.LOOP_GROUP_STATE_STOPPED
        return GS.LOOP_GROUP_STATE_STOPPING if self.stop_requested else GS.LOOP_GROUP_STATE_RUNNING

    def counters(self) -> Counters:
        total = Counters()
        for lo in self.loops:
            total.add(lo.counters)
        return total

    def proto(self) -> envmanager_pb2.LoopGroup:
        return envmanager_pb2.LoopGroup(group_id=self.group_id, env=self.request.env, count=len(self.loops),
                                        loop_ids=[lo.loop_id for lo in self.loops], state=self.state(),
                                        counters=self.counters().proto(), started_at=self.started_at)


class Loop:
    def __init__(self, manager: Manager, group: Group, index: int) -> None:
        self.m = manager
        self.group = group
        self.index = index
        self.loop_id = f"{group.group_id}/{index}"
        self.holder = f"{group.holder_prefix}/{index}"
        self.state = LS.LOOP_STATE_STARTING
        self.state_since = now_ts()
        self.counters = Counters()
        self.last_error = ""
        self.episode: Episode | None = None
        self.inner: asyncio.Task | None = None
        self.task: asyncio.Task | None = None
        self.stop_mode = ""  # "", "graceful" or "abort"
        self.done = 0
        self.reusable: Any = None  # EnvHandle kept for the next trajectory (reuse_environments)
        self.wake = asyncio.Event()  # set by stop(): ends a backoff at once
        spec = group.config.latency
        # Stream per loop index: groups with the same seed draw the same latencies (same-batch comparisons).
        self.latency: LatencySampler | None = spec.sampler(str(index)) if spec.enabled else None
        if group.waves is not None:
            group.waves.register(self)  # a member of the group's first wave
        metrics.LOOPS.labels(LS.Name(self.state)).inc()

    # -- state -------------------------------------------------------------------------------------------------
    def set_state(self, state: envmanager_pb2.LoopState | str) -> None:
        if isinstance(state, str):
            state = cast(envmanager_pb2.LoopState, LS.Value(f"LOOP_STATE_{state}"))
        if state != self.state:
            metrics.LOOPS.labels(LS.Name(self.state)).dec()
            metrics.LOOPS.labels(LS.Name(state)).inc()
            self.state = state
            self.state_since = now_ts()

    def proto(self) -> envmanager_pb2.LoopStatus:
        ep = self.episode
        return envmanager_pb2.LoopStatus(
            loop_id=self.loop_id, group_id=self.group.group_id, holder=self.holder, state=self.state,
            state_since=self.state_since, lease_id=ep.lease_id if ep else "", trajectory_id=ep.trajectory_id if ep
            else "", turn=ep.turns if ep else 0, sandbox_id=ep.sandbox_id if ep else "",
            counters=self.counters.proto(), last_error=self.last_error[:2000])

    @property
    def stopped(self) -> bool:
        return self.state in STOPPED_STATES

    # -- control -----------------------------------------------------------------------------------------------
    def abort_episode(self, kind: str, reason: str) -> bool:
        """Aborts the trajectory in flight (True if there was one to abort)."""
        ep, inner = self.episode, self.inner
        if ep is None or inner is None or inner.done():
            return False
        if not ep.abort_kind:
            ep.abort_kind, ep.abort_reason, ep.abort_at = kind, reason, time.monotonic()
            if self.state == LS.LOOP_STATE_GENERATING:
                # Abort on the proxy first: it ends the request on the actor (cancelling our stream first would
                # leave the proxy nothing to abort); the episode is cancelled right after (one round trip).
                self.m.spawn(self._abort_generation_then_cancel(ep, inner))
                return True
        inner.cancel()
        return True

    async def _abort_generation_then_cancel(self, ep: Episode, inner: asyncio.Task) -> None:
        try:
            await asyncio.wait_for(self.m.ctx.abort_generation(ep.trajectory_id, f"{ep.abort_kind}: {ep.abort_reason}"),
                                   1.0)
        except (TimeoutError, Exception):  # noqa: BLE001 - cancelling the episode ends the stream anyway
            pass
        inner.cancel()

    def stop(self, mode: str) -> bool:
        """Asks the loop to stop; True when it had a trajectory that this aborts."""
        if self.stopped:
            return False
        self.stop_mode = "abort" if mode == "abort" or self.stop_mode == "abort" else "graceful"
        self.wake.set()
        if self.group.waves is not None:
            self.group.waves.notify()  # a loop waiting for the next wave gives up
        if self.stop_mode == "abort":
            return self.abort_episode("shutdown", "loop stopped")
        return False

    # -- the loop ----------------------------------------------------------------------------------------------
    async def _sleep(self, seconds: float) -> None:
        try:
            await asyncio.wait_for(self.wake.wait(), seconds)
        except TimeoutError:
            pass

    async def run(self) -> None:
        cfg = self.m.cfg
        backoff = cfg.backoff_seconds
        limit = self.group.request.max_trajectories_per_loop
        setup_failures = 0
        waves = self.group.waves
        try:
            await self.m.reclaim(self)
            while not self.stop_mode and (limit == 0 or self.done < limit):
                if self.m.draining:
                    if waves is not None:
                        waves.leave(self)
                    self.set_state("BACKOFF")
                    await self._sleep(0.25)
                    continue
                self.set_state("ACQUIRING")
                if waves is not None and await waves.start(self, lambda: bool(self.stop_mode)) is None:
                    break
                try:
                    lease = await self.m.acquire(self)
                except LedgerError as exc:
                    if waves is not None:
                        waves.leave(self)
                    self.last_error = str(exc)
                    self.set_state("BACKOFF")
                    await self._sleep(backoff)
                    backoff = min(backoff * 2, cfg.max_backoff_seconds)
                    continue
                backoff = cfg.backoff_seconds
                if lease is None:
                    if waves is not None:
                        waves.leave(self)  # the wave goes on with the loops that have leases
                    continue
                if self.stop_mode:
                    await self.m.release(lease, self.holder, lp.RELEASE_REASON_SHUTDOWN, "loop stopping")
                    break
                try:
                    outcome = await self.run_lease(lease)
                finally:
                    if waves is not None:
                        waves.leave(self)  # settled, failed or cancelled: the next wave may start
                metrics.task_trajectory(lease.prompt.task or self.group.request.env.task, outcome)
                self.done += 1
                if outcome in SETUP_CAUSES:
                    setup_failures += 1
                    if setup_failures >= MAX_CONSECUTIVE_SETUP_FAILURES:
                        self.set_state("FAILED")
                        return
                else:
                    setup_failures = 0
                if outcome not in ("ok", "cancelled", "rejected"):  # a failure: do not hammer a broken setup
                    self.set_state("BACKOFF")
                    await self._sleep(min(cfg.backoff_seconds * 2 ** max(setup_failures - 1, 0),
                                            cfg.max_backoff_seconds) if setup_failures else 0.05)
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # a bug: say so, stop this loop only
            log.exception("loop failed", extra=log_fields(loop_id=self.loop_id))
            self.last_error = f"internal error: {exc}"
            self.set_state("FAILED")
        finally:
            if waves is not None:
                waves.unregister(self)
            if self.reusable is not None:
                self.m.dispose(self.reusable, kill=False)
                self.reusable = None
            if self.state != LS.LOOP_STATE_FAILED:
                self.set_state("STOPPED")

    async def run_lease(self, lease: lp.Lease) -> str:
        """One trajectory for one lease, settled. Returns the outcome ("ok", "rejected", "cancelled", a cause)."""
        m = self.m
        started = time.monotonic()
        try:
            spec = m.episode_spec(self.group, lease)
        except InfraFailure as exc:
            ep = Episode(new_trajectory_id(), self.loop_id, lease.prompt.environment, lease.prompt.task, lease=lease)
            await self._failed(ep, exc)
            return exc.cause
        ep = Episode(new_trajectory_id(), self.loop_id, spec.config.environment, spec.task, lease=lease)
        self.episode = ep
        m.by_lease[lease.lease_id] = self
        m.by_trajectory[ep.trajectory_id] = self
        waves = self.group.waves
        # Batch-level: the episode task also waits for the wave and scores, so a cancellation lands anywhere
        # in it and the lease stays renewed while the loop waits for the others.
        work = self._episode(ep, spec) if waves is None else self._batch_episode(ep, spec, waves)
        self.inner = asyncio.create_task(work, name=f"episode-{ep.trajectory_id}")
        renew = asyncio.create_task(self._renew(ep), name=f"renew-{lease.lease_id}")
        try:
            try:
                await asyncio.wait({self.inner})
            except asyncio.CancelledError:  # the manager is stopping: abort, release, re-raise
                self.abort_episode("shutdown", "envmanager stopping")
                await asyncio.shield(self._aborted(ep))
                raise
            finally:
                renew.cancel()
                m.by_lease.pop(lease.lease_id, None)
                m.by_trajectory.pop(ep.trajectory_id, None)
                inner = self.inner
                if waves is not None and not (inner.done() and not inner.cancelled() and inner.exception() is None):
                    waves.leave(self)  # failed or aborted: the wave must not wait for its release
            if inner.cancelled() or (ep.abort_kind and inner.exception() is not None):
                await self._aborted(ep)  # ours (the stream may have ended ABORTED before the cancel landed)
                return "cancelled"
            error = inner.exception()
            if error is None:
                if waves is not None:
                    traj, scoring = inner.result()
                    return await self._settle(ep, spec, traj, scoring)
                return await self._settle(ep, spec, inner.result())
            if isinstance(error, ExternalAbort):
                ep.abort_kind, ep.abort_reason = "external", str(error)
                await self._aborted(ep)
                return "cancelled"
            if not isinstance(error, InfraFailure):
                log.error("episode failed unexpectedly", exc_info=error,
                          extra=log_fields(trajectory_id=ep.trajectory_id))
                error = InfraFailure("internal", f"{type(error).__name__}: {error}")
            await self._failed(ep, error)
            return error.cause
        finally:
            metrics.EPISODE_SECONDS.observe(time.monotonic() - started)
            self.episode, self.inner = None, None

    async def _episode(self, ep: Episode, spec: EpisodeSpec,
                       before_turn: Callable[[int], Awaitable[None]] | None = None) -> common_pb2.Trajectory:
        m = self.m
        handle = self.reusable
        self.reusable = None
        if handle is not None and (handle.broken or handle.env.config != spec.config):
            m.dispose(handle, kill=False)
            handle = None
        try:
            traj, handle = await m.ctx.run(ep, spec, handle, self.latency, self.set_state, before_turn)
        except BaseException:
            if ep.handle is not None:  # abandoned or failed: kill and close it without blocking this loop
                m.dispose(ep.handle, kill=True)
            raise
        if m.cfg.reuse_environments and not handle.broken:
            self.reusable = handle
        else:
            self.set_state("CLOSING")
            try:
                await handle.call(handle.env.close)
            except Exception as exc:  # noqa: BLE001 - the episode is complete; a failing close is only logged
                log.warning("closing the environment failed: %s", exc, extra=log_fields(trajectory_id=ep.trajectory_id))
        return traj

    async def _batch_episode(self, ep: Episode, spec: EpisodeSpec, waves: Waves
                             ) -> tuple[common_pb2.Trajectory, asyncio.Task]:
        """The episode in lockstep with its wave, then scored once every episode of the wave ended; returns
        the trajectory and its (finished) scoring once the whole wave is scored."""

        async def barrier(turn: int) -> None:
            await waves.arrive(self, turn)  # turn t waits until the wave's steps of turn t-1 are done

        traj = await self._episode(ep, spec, barrier)
        self.set_state("SETTLING")
        await waves.arrive(self, ENDED)
        self._stamp(ep, traj)
        scoring = self.m.start_scoring(traj, spec.reward)
        await scoring  # a cancellation of this task cancels the scoring too
        await waves.arrive(self, SCORED)
        return traj, scoring

    async def _renew(self, ep: Episode) -> None:
        lease = ep.lease
        assert lease is not None
        # The lease's time-to-live on the ledger's clock; after a renewal, also what is left of the new expiry
        # on ours (the ledger's TTL adapts and may have shrunk): renew at the earlier of the two.
        ttl = max(secs(lease.expires_at) - secs(lease.issued_at), 0.3)
        left = ttl
        while True:
            await asyncio.sleep(max(min(ttl, left) * self.m.cfg.renew_fraction, 0.1))
            try:
                stub = await self.m.peers.ledger.stub()
                resp = await stub.RenewLease(lp.RenewLeaseRequest(lease_id=lease.lease_id, holder=self.holder),
                                             timeout=self.m.cfg.rpc_timeout_seconds)
            except (aio.AioRpcError, PeerUnavailable) as exc:
                details = exc.details() if isinstance(exc, aio.AioRpcError) else str(exc)
                if isinstance(exc, aio.AioRpcError) and exc.code() == grpc.StatusCode.FAILED_PRECONDITION:
                    self.abort_episode("expired", f"lease {lease.lease_id} is held by someone else: {details}")
                    return
                log.warning("lease renewal failed: %s", details, extra=log_fields(lease_id=lease.lease_id))
                continue
            state = resp.lease.state
            if state == lp.LEASE_STATE_ACTIVE:
                lease.expires_at.CopyFrom(resp.lease.expires_at)
                left = secs(lease.expires_at) - time.time()
                continue
            if state == lp.LEASE_STATE_CANCELLED:
                self.abort_episode("cancelled", f"lease cancelled ({lp.CancelReason.Name(resp.lease.cancel_reason)})")
            else:
                self.abort_episode("expired", f"lease is {lp.LeaseState.Name(state)}")
            return

    # -- settlement ------------------------------------------------------------------------------------------
    @staticmethod
    def _stamp(ep: Episode, traj: common_pb2.Trajectory) -> None:
        lease = ep.lease
        assert lease is not None
        traj.lease_id = lease.lease_id
        traj.prompt_id = lease.prompt.prompt_id
        traj.group_id = lease.group_id
        traj.sample_index = lease.sample_index
        traj.lease_version = lease.version

    async def _settle(self, ep: Episode, spec: EpisodeSpec, traj: common_pb2.Trajectory,
                      scoring: asyncio.Task | None = None) -> str:
        """Submits the trajectory; ``scoring``: already scored (batch-level), else scoring starts now."""
        m = self.m
        lease = ep.lease
        assert lease is not None
        self._stamp(ep, traj)
        self.counters.trajectories += 1
        self.counters.turns += ep.turns
        self.counters.tokens_generated += ep.tokens_generated
        self.set_state("SETTLING")
        if scoring is None:
            scoring = m.start_scoring(traj, spec.reward)  # scoring runs while the ledger settles
        work = [lp.ActorWork(actor_id=a, tokens=int(w[0]), generation_time=dur(w[1])) for a, w in ep.work.items()
                if a and a != "unknown"]
        m.recording.add(traj.trajectory_id)  # from before its admission: score_orphans must not score it too
        try:
            resp = await m.submit(traj, self.holder, work, lease)
        except LedgerError as exc:
            # Not a rejection: the ledger never answered (or refused the call itself). Counted as an
            # infrastructure failure with its cause, the lease given back so the sample is redone at once
            # (unless a lost reply hid its admission: _release_unsettled).
            cause = "ledger-unavailable" if exc.unreachable else "settle-failed"
            self.counters.infra_failures += 1
            m.failures[cause] += 1
            metrics.FAILURES.labels(cause).inc()
            metrics.TRAJECTORIES.labels("infra_failure").inc()
            self.last_error = f"trajectory {traj.trajectory_id}: settlement failed: {exc}"
            log.warning("settlement failed", extra=log_fields(trajectory_id=traj.trajectory_id, cause=cause,
                                                               lease_id=lease.lease_id, error=str(exc)[:500]))
            m.spawn(self._release_unsettled(traj.trajectory_id, lease, f"{cause}: {exc}"[:1000], ep.tokens_generated,
                                            scoring))
            return cause
        if resp.admitted:
            self.counters.admitted += 1
            metrics.TRAJECTORIES.labels("admitted").inc()
            m.record_when_scored(traj.trajectory_id, scoring)
            return "ok"
        scoring.cancel()
        m.recording.discard(traj.trajectory_id)
        self.counters.rejected += 1
        reason = lp.RejectionReason.Name(resp.reason)
        self.last_error = f"trajectory {traj.trajectory_id} rejected: {reason} {resp.detail}".strip()
        metrics.TRAJECTORIES.labels("rejected").inc()
        log.info("trajectory rejected", extra=log_fields(trajectory_id=traj.trajectory_id, reason=reason,
                                                          detail=resp.detail))
        return "rejected"

    async def _release_unsettled(self, tid: str, lease: lp.Lease, cause: str, tokens: int,
                                 scoring: asyncio.Task) -> None:
        """Releases the lease of a Submit that got no answer. A lost reply may hide an admission, whose reward
        nobody else would record before the ledger's score deadline. The release makes the lease final (no Submit
        admits it after that) and answers its state: SETTLED with this trajectory is that admission, whose
        reward is recorded now (once: the ledger keeps the first); anything else admitted nothing."""
        m = self.m
        recorded = False
        try:
            after = await m.release_eventually(lease, self.holder, lp.RELEASE_REASON_INFRA_FAILURE, cause, tokens)
            if after is not None and after.state == lp.LEASE_STATE_SETTLED and after.trajectory_id == tid:
                log.warning("admitted after all: its reward is recorded", extra=log_fields(trajectory_id=tid,
                                                                                          lease_id=lease.lease_id))
                m.record_when_scored(tid, scoring)
                recorded = True
        finally:
            if not recorded:
                scoring.cancel()
                m.recording.discard(tid)

    async def _failed(self, ep: Episode, exc: InfraFailure) -> None:
        """An infrastructure failure or timeout: reported with its cause, the sample goes back to the pool."""
        self.counters.trajectories += 1
        self.counters.turns += ep.turns
        self.counters.tokens_generated += ep.tokens_generated
        if exc.status == TIMEOUT:
            self.counters.timeouts += 1
        else:
            self.counters.infra_failures += 1
        self.m.failures[exc.cause] += 1
        metrics.FAILURES.labels(exc.cause).inc()
        metrics.TRAJECTORIES.labels("timeout" if exc.status == TIMEOUT else "infra_failure").inc()
        self.last_error = f"trajectory {ep.trajectory_id}: {exc}"
        log.warning("trajectory failed", extra=log_fields(trajectory_id=ep.trajectory_id, cause=exc.cause,
                                                           error=exc.message[:500]))
        if ep.tokens_generated:  # tokens of a failed turn may still be generating on an actor
            self.m.spawn(self.m.ctx.abort_generation(ep.trajectory_id, f"failed: {exc.cause}"))
        reason = lp.RELEASE_REASON_TIMEOUT if exc.status == TIMEOUT else lp.RELEASE_REASON_INFRA_FAILURE
        if ep.lease is not None:
            await self.m.release(ep.lease, self.holder, reason, str(exc)[:1000], ep.tokens_generated)

    async def _aborted(self, ep: Episode) -> None:
        """The trajectory was aborted: stop its generation, give the lease back (an expired one: only its tokens)."""
        kind = ep.abort_kind or "shutdown"
        self.counters.trajectories += 1
        self.counters.cancelled += 1
        self.counters.turns += ep.turns
        self.counters.tokens_generated += ep.tokens_generated
        metrics.TRAJECTORIES.labels("cancelled").inc()
        if ep.abort_at:
            metrics.CANCEL_SECONDS.observe(time.monotonic() - ep.abort_at)
        self.m.spawn(self.m.ctx.abort_generation(ep.trajectory_id, f"{kind}: {ep.abort_reason}"))
        self.last_error = f"trajectory {ep.trajectory_id} aborted ({kind}): {ep.abort_reason}"
        log.info("trajectory aborted", extra=log_fields(trajectory_id=ep.trajectory_id, kind=kind,
                                                         reason=ep.abort_reason, lease_id=ep.lease_id))
        if ep.lease is not None and kind in RELEASE_FOR:
            await self.m.release(ep.lease, self.holder, RELEASE_FOR[kind], ep.abort_reason[:1000], ep.tokens_generated)
