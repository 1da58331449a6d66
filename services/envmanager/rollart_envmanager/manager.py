"""The EnvManager: many independent environment loops in one process, each on its own timeline.

Each loop (loop.py) takes a lease, runs the episode, sends the trajectory to scoring without waiting and
settles it, on its own; the manager holds what they share: the ledger, reward and proxy calls, the command
stream, the scoring tasks, the groups and the status.

Batch-level interaction (``EnvironmentSpec.interaction = BATCH``, the synchronous baseline): the loops of a
group run in waves (waves.py): every turn waits for the steps of the whole wave, reward is requested once every
episode of the wave ended, trajectories are settled once all are scored, and the next wave starts after that.

Cancellations: the manager watches the ledger's command stream as a HOLDER (one stream for all its loops,
whose holders are ``<manager id>/...``); a cancelled lease aborts its trajectory at once (the proxy is told to
abort the trajectory's generation, the episode task is cancelled, the lease is released as CANCELLED, the
environment is killed and closed in the background). Lease renewals also report cancellations and expiry,
which covers a command stream that was down.

Failures: an infrastructure failure or timeout releases the lease with that reason and cause (the sample goes
back to the pool); it is never submitted as a zero reward. Scoring failures are reported to the ledger as
failures (RecordReward failed=true), never as rewards.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextvars
import logging
import os
import socket
import time
from collections import Counter
from typing import Any

import grpc
from grpc import aio

from rollart.runtime.telemetry import log_fields
from rollart.runtime.timeutil import duration as dur
from rollart.runtime.timeutil import seconds as secs
from rollart.v1 import common_pb2, envmanager_pb2
from rollart.v1 import ledger_pb2 as lp
from rollart.v1 import reward_pb2 as rp

from . import metrics
from .config import EnvManagerConfig
from .convert import reward_spec
from .envs.registry import EnvRegistry, TaskConfig, default_registry
from .episode import (
    Episode,
    EpisodeContext,
    EpisodeSpec,
    InfraFailure,
    now_ts,
    run_blocking,
)
from .ledger_batch import LedgerBatcher
from .loop import LS, Counters, Group, LedgerError, Loop  # service.py, evaluation.py and tests import them from here
from .peers import Peers, PeerUnavailable
from .sandbox import SandboxLimits, live_sandboxes

log = logging.getLogger(__name__)


async def _unscorable(cause: str) -> tuple[None, str]:
    return None, cause


class Manager:
    def __init__(self, cfg: EnvManagerConfig, registry: EnvRegistry | None = None) -> None:
        self.cfg = cfg
        self.manager_id = cfg.manager_id or f"envmanager-{socket.gethostname()}-{os.getpid()}"
        self.registry = registry or default_registry()
        for entry in cfg.environments:
            self.registry.register_from_mapping(entry, replace=True)
        self.peers = Peers(cfg)
        # The loops' AcquireLeases and Submit go out together as AcquireLeasesBatch / SubmitBatch (ledger_batch.py).
        self.ledger_calls = LedgerBatcher(self._ledger)
        self.executor = concurrent.futures.ThreadPoolExecutor(cfg.env_threads, thread_name_prefix="env")
        self.ctx = EpisodeContext(cfg, self.peers, self.registry, self.executor)
        self.base_limits = SandboxLimits(**cfg.sandbox.model_dump())
        self.groups: dict[str, Group] = {}
        self.by_lease: dict[str, Loop] = {}
        self.by_trajectory: dict[str, Loop] = {}
        self.oneoff: dict[str, Episode] = {}  # RunEpisode trajectories in flight
        self.oneoff_tasks: dict[str, asyncio.Task] = {}
        self.failures: Counter[str] = Counter()
        self.rewards_pending = 0
        # Admitted (or being settled) trajectories whose reward this process records: score_orphans skips them.
        self.recording: set[str] = set()
        self.draining = False
        self.started_at = now_ts()
        self._tasks: set[asyncio.Task] = set()
        self._watches: dict[str, asyncio.Task] = {}
        self._closing = False

    # -- background work ---------------------------------------------------------------------------------------
    def spawn(self, coro: Any, *, fresh_context: bool = False) -> asyncio.Task:
        # Loops start from an empty context: their spans and baggage are their own, not the RPC's that started them.
        task = asyncio.create_task(coro, context=contextvars.Context() if fresh_context else None)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    def dispose(self, handle: Any, kill: bool) -> None:
        """Kills (when asked) and closes an environment in the background, after its in-flight call returned."""
        wait_s = self.base_limits.step_timeout_s + 5

        async def run() -> None:
            if kill:
                await run_blocking(self.executor, handle.kill)
            await run_blocking(self.executor, handle.close_blocking, wait_s)

        self.spawn(run())

    # -- ledger calls -----------------------------------------------------------------------------------------
    async def _ledger(self) -> Any:
        try:
            return await self.peers.ledger.stub()
        except PeerUnavailable as exc:
            raise LedgerError(str(exc)) from None

    async def acquire(self, loop: Loop) -> lp.Lease | None:
        await self._ledger()
        self.ensure_watch(loop.group.holder_prefix)
        wait = self.cfg.lease_wait_seconds
        t0 = time.monotonic()
        try:
            resp = await self.ledger_calls.acquire(
                lp.AcquireLeasesRequest(holder=loop.holder, max_leases=1, tasks=loop.group.lease_tasks,
                                        region=self.cfg.region),
                wait=wait, timeout=wait + self.cfg.rpc_timeout_seconds)
        except aio.AioRpcError as exc:
            if exc.code() == grpc.StatusCode.UNAVAILABLE:
                await self.peers.ledger.forget()
            raise LedgerError(f"AcquireLeases: {exc.code().name}: {exc.details()}") from None
        if resp.leases:
            return resp.leases[0]
        if time.monotonic() - t0 < 0.05:  # the ledger answered at once (e.g. no version yet): do not spin
            await asyncio.sleep(min(max(secs(resp.retry_after), 0.05), 1.0))
        return None

    async def release(
        self, lease: lp.Lease, holder: str, reason: lp.ReleaseReason, cause: str, tokens: int = 0
    ) -> bool:
        """Gives the lease back; ``tokens`` generated for the abandoned trajectory go into the job's generation
        accounting (the ledger counts them once per lease, also for a lease it had cancelled or expired).
        False when the ledger did not answer (retryable)."""
        return await self.release_lease(lease, holder, reason, cause, tokens) is not None

    async def release_lease(
        self, lease: lp.Lease, holder: str, reason: lp.ReleaseReason, cause: str, tokens: int = 0
    ) -> lp.Lease | None:
        """:meth:`release`, answering the lease as the ledger left it (final: a final lease is left as it was; an
        empty Lease when the ledger refused the release), None when it did not answer."""
        try:
            stub = await self._ledger()
            return await stub.ReleaseLease(lp.ReleaseLeaseRequest(lease_id=lease.lease_id, holder=holder,
                                                                  reason=reason, cause=cause, generated_tokens=tokens),
                                           timeout=self.cfg.rpc_timeout_seconds)
        except (aio.AioRpcError, LedgerError) as exc:
            # The lease then expires by itself and goes back to the pool.
            log.warning("release failed: %s", exc, extra=log_fields(lease_id=lease.lease_id))
            if isinstance(exc, LedgerError):
                return None
            if exc.code() == grpc.StatusCode.UNAVAILABLE:
                await self.peers.ledger.forget()
            unanswered = exc.code() in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED)
            return None if unanswered else lp.Lease()

    async def reclaim(self, loop: Loop) -> int:
        """Releases the leases a previous process left under this loop's holder name (a restart with the same
        ``manager_id`` runs the same groups under the same holders), so their samples return to the pool now
        rather than when the leases expire. Returns how many; best effort (0 when the ledger does not answer)."""
        try:
            stub = await self._ledger()
            resp = await stub.ListLeases(lp.ListLeasesRequest(holder=loop.holder, states=[lp.LEASE_STATE_ACTIVE]),
                                         timeout=self.cfg.rpc_timeout_seconds)
        except (aio.AioRpcError, LedgerError) as exc:
            log.info("leases of a previous process not checked: %s", exc, extra=log_fields(holder=loop.holder))
            return 0
        released = 0
        for lease in resp.leases:
            if lease.lease_id in self.by_lease:  # ours already
                continue
            if await self.release(lease, loop.holder, lp.RELEASE_REASON_ABANDONED,
                                  "held by a previous process of this envmanager"):
                released += 1
        if released:
            log.info("released the leases of a previous process", extra=log_fields(holder=loop.holder,
                                                                                    leases=released))
        return released

    async def release_eventually(self, lease: lp.Lease, holder: str, reason: lp.ReleaseReason, cause: str,
                                 tokens: int = 0) -> lp.Lease | None:
        """:meth:`release_lease`, retried with backoff for ``release_retry_seconds`` while the ledger is unreachable
        (ReleaseLease is idempotent); if it never answers (None), the lease expires back to the pool by itself."""
        deadline = time.monotonic() + self.cfg.release_retry_seconds
        delay = 0.2
        while (after := await self.release_lease(lease, holder, reason, cause, tokens)) is None:
            if time.monotonic() >= deadline:
                break
            await asyncio.sleep(delay)
            delay = min(delay * 2, 2.0)
        return after

    async def submit(self, traj: common_pb2.Trajectory, holder: str, work: list[lp.ActorWork],
                     lease: lp.Lease) -> lp.SubmitResponse:
        """Submit, retried with backoff while the ledger is unreachable: for at least ``settle_retry_seconds``
        and while the lease may still be settled. Safe to repeat: the ledger's Submit is idempotent per lease
        and trajectory (a repeat gets the first answer, nothing is counted twice)."""
        deadline = max(secs(lease.expires_at) + 1.0, time.time() + self.cfg.settle_retry_seconds)
        delay = 0.2
        while True:
            try:
                return await self.ledger_calls.submit(lp.SubmitRequest(trajectory=traj, holder=holder, work=work),
                                                      timeout=self.cfg.rpc_timeout_seconds)
            except aio.AioRpcError as exc:
                retryable = exc.code() in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED)
                if not retryable or time.time() > deadline:
                    raise LedgerError(f"Submit: {exc.code().name}: {exc.details()}", unreachable=retryable) from None
                if exc.code() == grpc.StatusCode.UNAVAILABLE:
                    await self.peers.ledger.forget()
            except LedgerError:
                if time.time() > deadline:
                    raise
            await asyncio.sleep(delay)
            delay = min(delay * 2, 2.0)

    # -- lease cancellations ---------------------------------------------------------------------------------
    def ensure_watch(self, holder_prefix: str) -> None:
        """One HOLDER stream covers every holder under the subscriber id: ours, or a group's own prefix."""
        sub = self.manager_id if (holder_prefix + "/").startswith(self.manager_id + "/") else holder_prefix
        task = self._watches.get(sub)
        if (task is None or task.done()) and not self._closing:
            self._watches[sub] = self.spawn(self._watch(sub))

    async def _watch(self, subscriber: str) -> None:
        seq: int | None = None
        backoff = 0.2
        while not self._closing:
            try:
                stub = await self._ledger()
                if seq is None:  # start from now: older commands concern leases this process does not hold
                    status = await stub.GetStatus(lp.LedgerStatusRequest(versions_limit=1),
                                                  timeout=self.cfg.rpc_timeout_seconds)
                    seq = status.latest_command_sequence
                call = stub.WatchCommands(lp.WatchCommandsRequest(
                    subscriber_id=subscriber, kind=lp.SUBSCRIBER_KIND_HOLDER, from_sequence=seq,
                    only_new=seq == 0))
                async for cmd in call:
                    seq = max(seq, cmd.sequence)
                    backoff = 0.2
                    self._command(cmd)
            except asyncio.CancelledError:
                raise
            except aio.AioRpcError as exc:
                if exc.code() == grpc.StatusCode.OUT_OF_RANGE:
                    seq = None  # missed commands: renewals will report those cancellations
                elif exc.code() == grpc.StatusCode.UNAVAILABLE:
                    await self.peers.ledger.forget()
                log.info("command stream ended: %s %s", exc.code().name, exc.details())
            except LedgerError as exc:
                log.info("command stream: %s", exc)
            await asyncio.sleep(backoff)
            backoff = min(backoff * 2, 5.0)

    def _command(self, cmd: lp.LedgerCommand) -> None:
        what = cmd.WhichOneof("command")
        if what == "cancel_leases":
            why = lp.CancelReason.Name(cmd.cancel_leases.reason)
            for lid in cmd.cancel_leases.lease_ids:
                loop = self.by_lease.get(lid)
                if loop is not None:
                    loop.abort_episode("cancelled", f"lease cancelled by the ledger ({why})")
            for tid in cmd.cancel_leases.trajectory_ids:
                loop = self.by_trajectory.get(tid)
                if loop is not None:
                    loop.abort_episode("cancelled", f"trajectory cancelled by the ledger ({why})")
        elif what == "drain":
            self.draining = True
            log.info("draining: no new leases (%s)", cmd.drain.reason)
        elif what == "undrain":
            self.draining = False

    # -- reward ------------------------------------------------------------------------------------------------
    def start_scoring(self, traj: common_pb2.Trajectory, spec: common_pb2.RewardSpec) -> asyncio.Task:
        self.rewards_pending += 1
        metrics.REWARDS_PENDING.inc()
        task = asyncio.create_task(self._score(traj, spec), name=f"score-{traj.trajectory_id}")

        def done(_t: asyncio.Task) -> None:
            self.rewards_pending -= 1
            metrics.REWARDS_PENDING.dec()

        task.add_done_callback(done)
        return task

    async def _score(self, traj: common_pb2.Trajectory, spec: common_pb2.RewardSpec
                     ) -> tuple[common_pb2.RewardOutcome | None, str]:
        """(outcome, "") or (None, failure cause); retryable failures are retried a bounded number of times."""
        cause = ""
        req = rp.ScoreRequest(trajectory=traj, spec=spec, timeout=dur(self.cfg.reward_timeout_seconds))
        for attempt in range(1 + self.cfg.reward_retries):
            if attempt:
                await asyncio.sleep(min(0.5 * 2 ** (attempt - 1), 5.0))
            try:
                stub = await self.peers.reward.stub()
                res = await stub.Score(req, timeout=self.cfg.reward_timeout_seconds + 5)
            except PeerUnavailable as exc:
                cause = f"reward-unavailable: {exc}"
                continue
            except aio.AioRpcError as exc:
                cause = f"reward-{exc.code().name.lower()}: {exc.details()}"
                if exc.code() == grpc.StatusCode.UNAVAILABLE:
                    await self.peers.reward.forget()
                    continue
                if exc.code() in (grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.UNAUTHENTICATED,
                                  grpc.StatusCode.FAILED_PRECONDITION):
                    break
                continue
            if res.status == rp.SCORE_STATUS_OK:
                return res.outcome, ""
            cause = f"{res.cause or rp.ScoreStatus.Name(res.status)}: {res.error[:300]}"
            if not res.retryable:
                break
        return None, cause

    def record_when_scored(self, trajectory_id: str, scoring: asyncio.Task) -> None:
        self.recording.add(trajectory_id)

        async def record() -> None:
            try:
                await _record()
            finally:
                self.recording.discard(trajectory_id)

        async def _record() -> None:
            try:
                outcome, cause = await scoring
            except asyncio.CancelledError:
                return
            req = (lp.RecordRewardRequest(trajectory_id=trajectory_id, reward=outcome) if outcome is not None
                   else lp.RecordRewardRequest(trajectory_id=trajectory_id, failed=True, failure_cause=cause[:1000]))
            metrics.REWARDS.labels("scored" if outcome is not None else "failed").inc()
            if outcome is None:
                self.failures["reward-failed"] += 1
                log.warning("scoring failed", extra=log_fields(trajectory_id=trajectory_id, cause=cause[:300]))
            for attempt in range(5):
                try:
                    stub = await self._ledger()
                    await stub.RecordReward(req, timeout=self.cfg.rpc_timeout_seconds)
                    return
                except (aio.AioRpcError, LedgerError) as exc:
                    log.warning("RecordReward failed (attempt %d): %s", attempt + 1, exc)
                    await asyncio.sleep(0.5 * 2 ** attempt)

        self.spawn(record())

    async def score_orphans(self, group: Group) -> int:
        """Scores the samples a previous process of this envmanager admitted under the group's holders but never
        scored (killed between Submit and RecordReward): nobody else would, and they would hold their groups until
        the ledger's score deadline. Their trajectories come back from the ledger, which keeps the first reward
        recorded: a late one from the old process counts nothing. Returns how many it scores; asks for up to
        ``settle_retry_seconds`` while the ledger does not answer (then the score deadline is the fallback)."""
        req = lp.ListUnscoredRequest(holder_prefix=group.holder_prefix + "/", max_samples=1000)
        deadline = time.monotonic() + self.cfg.settle_retry_seconds
        delay, scored = 0.2, 0
        while True:
            try:
                stub = await self._ledger()
                resp = await stub.ListUnscored(req, timeout=self.cfg.rpc_timeout_seconds)
            except (aio.AioRpcError, LedgerError) as exc:
                code = exc.code() if isinstance(exc, aio.AioRpcError) else grpc.StatusCode.UNAVAILABLE
                if code == grpc.StatusCode.UNAVAILABLE and isinstance(exc, aio.AioRpcError):
                    await self.peers.ledger.forget()
                if (code not in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED)
                        or time.monotonic() > deadline or self._closing):
                    log.info("unscored samples of a previous process not checked: %s", exc,
                             extra=log_fields(group_id=group.group_id))
                    break
                await asyncio.sleep(delay)
                delay = min(delay * 2, 2.0)
                continue
            for sample in resp.samples:
                scored += self._score_orphan(group, sample)
            if not resp.next_page_token:
                break
            req.page_token = resp.next_page_token
        if scored:
            log.info("scoring the samples a previous process admitted unscored",
                     extra=log_fields(group_id=group.group_id, samples=scored))
        return scored

    def _score_orphan(self, group: Group, sample: lp.UnscoredSample) -> bool:
        tid = sample.lease.trajectory_id or sample.trajectory.trajectory_id
        if not tid or tid in self.recording:  # settled by this process: its own scoring records it
            return False
        try:
            scoring = self.start_scoring(sample.trajectory, self.episode_spec(group, sample.lease).reward)
        except InfraFailure as exc:  # no reward spec here: scoring failed, the ledger re-pools the sample
            scoring = asyncio.ensure_future(_unscorable(f"{exc.cause}: {exc.message}"))
        self.record_when_scored(tid, scoring)
        return True

    # -- groups and loops --------------------------------------------------------------------------------------
    def episode_spec(self, group: Group, lease: lp.Lease | None, *, seed: int | None = None,
                     prompt_text: str = "", metadata: dict[str, str] | None = None) -> EpisodeSpec:
        env = group.request.env
        config = group.config
        prompt = lease.prompt if lease is not None else None
        if prompt is not None and prompt.environment and prompt.environment != config.environment:
            # The prompt names another environment: run it with the group's sandbox and latency settings.
            config = TaskConfig(environment=prompt.environment, limits=config.limits, latency=config.latency,
                                backend="")
        try:
            info, _backend, _turns = config.resolve(self.registry)
        except Exception as exc:  # noqa: BLE001 - unknown environment or options: the sample cannot run here
            raise InfraFailure("env-unavailable", str(exc)) from None
        if prompt is not None and prompt.reward.kind:
            reward = prompt.reward
        elif env.reward.kind:
            reward = env.reward
        else:
            reward = reward_spec(info)
        sampling = common_pb2.SamplingParams()
        sampling.CopyFrom(env.sampling)
        sampling.logprobs = True  # RL needs the behaviour logprobs
        md = dict(prompt.metadata) if prompt is not None else {}
        md.update(metadata or {})
        return EpisodeSpec(
            config=config,
            task=env.task or (prompt.task if prompt is not None and prompt.task else config.environment),
            sampling=sampling,
            max_context_tokens=env.max_context_tokens,
            generation_timeout_s=secs(env.generation_timeout) or self.cfg.generation_timeout_seconds,
            reward=reward,
            seed=(prompt.seed if prompt is not None else seed),
            prompt_text=prompt.text if prompt is not None else prompt_text,
            prompt_messages=list(prompt.messages) if prompt is not None else [],
            metadata=md,
            preferred_actor=lease.assigned_actor_id if lease is not None else "",
        )

    def task_config(self, spec: envmanager_pb2.EnvironmentSpec) -> TaskConfig:
        """The TaskConfig of an EnvironmentSpec (ValueError for anything invalid)."""
        return TaskConfig.from_proto(spec, self.base_limits)

    def start_group(self, request: envmanager_pb2.StartLoopsRequest, config: TaskConfig) -> Group:
        prefix = request.holder_prefix or f"{self.manager_id}/{request.group_id}"
        tasks = list(request.lease_tasks) or [request.env.task or request.env.environment]
        group = Group(request, config, prefix, tasks)
        self.groups[request.group_id] = group
        for i in range(request.count):
            loop = Loop(self, group, i)
            group.loops.append(loop)
            loop.task = self.spawn(loop.run(), fresh_context=True)
        self.spawn(self.score_orphans(group), fresh_context=True)
        log.info("loops started", extra=log_fields(group_id=request.group_id, count=request.count,
                                                    environment=config.environment))
        return group

    def loops(self) -> list[Loop]:
        return [lo for g in self.groups.values() for lo in g.loops]

    def active_loops(self) -> int:
        return sum(1 for lo in self.loops() if not lo.stopped)

    def counters(self) -> Counters:
        total = Counters()
        for g in self.groups.values():
            total.add(g.counters())
        return total

    def in_flight(self, group_id: str = "") -> list[envmanager_pb2.TrajectoryInFlight]:
        out = []
        for lo in self.loops():
            ep = lo.episode
            if ep is None or (group_id and lo.group.group_id != group_id):
                continue
            out.append(self._in_flight(ep, lo.state))
        if not group_id:
            out += [self._in_flight(ep, LS.LOOP_STATE_GENERATING) for ep in self.oneoff.values()]
        return out

    @staticmethod
    def _in_flight(ep: Episode, state: envmanager_pb2.LoopState) -> envmanager_pb2.TrajectoryInFlight:
        lease = ep.lease
        t = envmanager_pb2.TrajectoryInFlight(
            trajectory_id=ep.trajectory_id, lease_id=ep.lease_id, loop_id=ep.loop_id, task=ep.task,
            environment=ep.environment, turns=ep.turns, tokens_generated=ep.tokens_generated,
            versions=sorted(ep.versions), actor_id=ep.actor_id, state=state, started_at=ep.started_at)
        if lease is not None:
            t.prompt_id, t.group_id, t.sample_index = lease.prompt.prompt_id, lease.group_id, lease.sample_index
            t.lease_version = lease.version
            t.lease_expires_at.CopyFrom(lease.expires_at)
        return t

    def status(self) -> envmanager_pb2.EnvManagerStatus:
        by_state = Counter(LS.Name(lo.state) for lo in self.loops())
        sandboxes = {f"SANDBOX_BACKEND_{b.upper()}": n for b, n in live_sandboxes().items()}
        return envmanager_pb2.EnvManagerStatus(
            manager_id=self.manager_id, loops_active=self.active_loops(), loops_by_state=dict(by_state),
            trajectories_in_flight=len(self.in_flight()), sandboxes=sandboxes, counters=self.counters().proto(),
            rewards_pending=self.rewards_pending, failures_by_cause=dict(self.failures), started_at=self.started_at)

    async def close(self) -> None:
        """Aborts every loop (leases released as SHUTDOWN), stops the watches, closes the environments."""
        self._closing = True
        loops = [lo for lo in self.loops() if lo.task is not None and not lo.task.done()]
        for lo in loops:
            lo.stop("abort")
        if loops:
            done, pending = await asyncio.wait([lo.task for lo in loops if lo.task is not None], timeout=5)
            for t in pending:
                t.cancel()
            if pending:
                await asyncio.wait(pending, timeout=5)
        for w in self._watches.values():
            w.cancel()
        if self._tasks:
            await asyncio.wait(list(self._tasks), timeout=5)
        await self.ledger_calls.close()
        await self.peers.close()
        self.executor.shutdown(wait=False, cancel_futures=True)
