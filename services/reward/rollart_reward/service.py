"""The Reward gRPC service: validation, scorer resolution, idempotency, the pool, and the inline scorers.

Request flow: validate -> resolve the scorer (spec, or derived from the trajectory) -> answer from the
idempotency cache when the trajectory was scored before -> join the in-flight scoring of the same trajectory
if there is one (single flight) -> otherwise score: pool kinds (math, reasoning_gym, code, custom) go to a
worker process, the game outcome and the LLM judge run here. The first OK answer is cached; failures are not,
so a retry scores again.
"""

from __future__ import annotations

import asyncio
import importlib.util
import logging
import os
import shutil
import socket
import time
from collections.abc import AsyncIterator
from dataclasses import asdict

from grpc import aio

from rollart.discovery import Registration, resource_manager_channel
from rollart.runtime import errors, ids, timeutil
from rollart.runtime.telemetry import log_fields, trajectory_scope
from rollart.v1 import common_pb2, reward_pb2, reward_pb2_grpc
from rollart.v1 import resource_manager_pb2 as rm
from rollart.v1 import resource_manager_pb2_grpc as rm_grpc

from . import metrics, validators
from .cache import ResultCache
from .config import RewardConfig
from .pool import ElasticPool, PoolSettings
from .sandbox import SandboxLimits
from .scorers import code as code_scorer
from .scorers import game as game_scorer
from .scorers import judge as judge_scorer
from .scorers import math as math_scorer
from .scorers import reasoning_gym as rg_scorer
from .scorers import registry
from .scorers.base import FAILED, INVALID, OK, TIMEOUT, InvalidRequest, ScorerFailure, Verdict

log = logging.getLogger(__name__)
SS = reward_pb2.ScoreStatus
STATUS = {
    OK: SS.SCORE_STATUS_OK,
    FAILED: SS.SCORE_STATUS_FAILED,
    TIMEOUT: SS.SCORE_STATUS_TIMEOUT,
    INVALID: SS.SCORE_STATUS_INVALID,
}
TS = common_pb2.TrajectoryStatus
NOT_SCORABLE = {TS.TRAJECTORY_STATUS_CANCELLED, TS.TRAJECTORY_STATUS_INFRA_FAILURE, TS.TRAJECTORY_STATUS_TIMEOUT}


def _deadline(context: aio.ServicerContext) -> float | None:
    """The call's deadline as a time.monotonic() value (None: the caller set none)."""
    remaining = context.time_remaining()
    if remaining is None or remaining > 1e8:  # "no deadline" shows up as a huge remainder
        return None
    return time.monotonic() + remaining


class RewardService(reward_pb2_grpc.RewardServicer):
    name = "reward"
    service_names = [reward_pb2.DESCRIPTOR.services_by_name["Reward"].full_name]

    def __init__(self, cfg: RewardConfig) -> None:
        self.cfg = cfg
        sandbox = SandboxLimits(
            **{**cfg.sandbox.model_dump(), "workdir": str(cfg.sandbox.workdir) if cfg.sandbox.workdir else None}
        )
        self.pool = ElasticPool(
            PoolSettings(
                min_workers=cfg.pool.min_workers,
                max_workers=cfg.pool.max_workers,
                idle_timeout=cfg.pool.idle_timeout_seconds,
                start_timeout=cfg.pool.start_timeout_seconds,
                crash_retries=cfg.pool.crash_retries,
                kill_grace=cfg.pool.kill_grace_seconds,
                worker_settings={
                    "sandbox": asdict(sandbox),
                    "custom_scorers": dict(cfg.custom_scorers),
                    "preload": list(cfg.pool.preload),
                },
            )
        )
        self.cache = ResultCache(cfg.cache_size, cfg.redis_url, cfg.redis_key_prefix, cfg.redis_ttl_seconds)
        self.judge = judge_scorer.JudgeClient(
            cfg.llmproxy,
            token=cfg.token(),
            tls=cfg.tls,
            settings=judge_scorer.JudgeSettings(route=cfg.judge_route, max_tokens=cfg.judge_max_tokens),
            resolve=self._discover_llmproxy if cfg.resource_manager and not cfg.llmproxy else None,
        )
        self.inflight: dict[str, asyncio.Future] = {}
        self.cache_hits = 0
        self.registration: Registration | None = None
        self._tasks: set[asyncio.Task] = set()

    # -------------------------------------------------------------------------------------------- lifecycle

    def add_to_server(self, server: aio.Server) -> None:
        reward_pb2_grpc.add_RewardServicer_to_server(self, server)

    async def start(self) -> None:
        await self.cache.start()
        await self.pool.start()

    async def stop(self) -> None:
        if self.registration is not None:
            await self.registration.stop()
        await self.pool.close()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        await self.judge.close()
        await self.cache.close()

    async def on_serving(self, address: str) -> None:
        if not self.cfg.resource_manager:
            return
        worker = rm.Worker(
            worker_id=self.cfg.instance_name or f"reward-{socket.gethostname()}-{os.getpid()}",
            role="reward",
            endpoint=address,
            pool=self.cfg.rm_pool,
            hardware=common_pb2.Hardware(accelerator="cpu", count=os.cpu_count() or 1),
            labels={"max_workers": str(self.pool.max_workers)},
            ttl_seconds=10.0,
        )
        pool = None
        if self.cfg.rm_register_pool:
            pool = rm.Pool(
                name=self.cfg.rm_pool, kind=common_pb2.POOL_KIND_SERVERLESS, capacity=max(self.pool.max_workers, 1)
            )
        self.registration = Registration(
            self.cfg.resource_manager, worker, token=self.cfg.token(), tls=self.cfg.tls, pool=pool
        )
        await self.registration.start()

    async def _discover_llmproxy(self) -> str | None:
        assert self.cfg.resource_manager is not None
        ch = resource_manager_channel(self.cfg.resource_manager, self.cfg.token(), self.cfg.tls)
        try:
            resp = await rm_grpc.ResourceManagerStub(ch).ListWorkers(rm.ListWorkersRequest(role="llmproxy"))
        except aio.AioRpcError as exc:
            log.warning("llmproxy discovery failed: %s", exc.details())
            return None
        finally:
            await ch.close()
        return resp.workers[0].endpoint if resp.workers else None

    # ----------------------------------------------------------------------------------------------- scoring

    def _validate(self, req: reward_pb2.ScoreRequest) -> tuple[common_pb2.RewardSpec, str, float]:
        traj = req.trajectory
        tid = ids.check_id("trajectory.trajectory_id", traj.trajectory_id)
        if traj.status in NOT_SCORABLE:
            why = f" ({traj.failure_cause})" if traj.failure_cause else ""
            raise InvalidRequest(f"trajectory {tid} ended with status {TS.Name(traj.status)}{why}: it is not scored")
        asked = timeutil.checked_duration("timeout", req.timeout)
        spec = registry.resolve(traj, req.spec)
        kind = registry.KIND_NAMES[spec.kind]
        if kind == "custom" and spec.scorer not in self.cfg.custom_scorers:
            raise InvalidRequest(
                f"no custom scorer named {spec.scorer!r} is registered (known: {sorted(self.cfg.custom_scorers)})"
            )
        if asked > self.cfg.max_timeout_seconds:
            raise InvalidRequest(f"timeout {asked:g}s exceeds the maximum of {self.cfg.max_timeout_seconds:g}s")
        budget = asked if asked > 0 else self.cfg.timeout_for(kind)
        return spec, kind, budget

    async def score(self, req: reward_pb2.ScoreRequest, deadline: float | None) -> reward_pb2.ScoreResult:
        """Score one request (InvalidRequest for a bad one). Idempotent by trajectory id."""
        spec, kind, budget = self._validate(req)
        tid = req.trajectory.trajectory_id
        cached = await self.cache.get(tid)
        if cached is not None:
            return self._hit(cached)
        shared = self.inflight.get(tid)
        if shared is None:
            shared = asyncio.get_running_loop().create_future()
            self.inflight[tid] = shared
            task = asyncio.create_task(self._compute(req, spec, kind, budget, deadline, shared), name=f"score-{tid}")
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)
        else:
            # Someone is scoring this trajectory right now: wait for that answer instead of scoring twice.
            result = await asyncio.shield(shared)
            return self._hit(result)
        # Shielded: a caller that goes away does not stop the scoring, whose answer is then cached for a retry.
        return await asyncio.shield(shared)

    def _hit(self, result: reward_pb2.ScoreResult) -> reward_pb2.ScoreResult:
        out = reward_pb2.ScoreResult()
        out.CopyFrom(result)
        out.cached = True
        out.attempts = 0
        self.cache_hits += 1
        metrics.CACHE_HITS.inc()
        return out

    async def _compute(
        self,
        req: reward_pb2.ScoreRequest,
        spec: common_pb2.RewardSpec,
        kind: str,
        budget: float,
        deadline: float | None,
        shared: asyncio.Future,
    ) -> None:
        traj = req.trajectory
        tid = traj.trajectory_id
        options = dict(spec.options)
        worker_id, queue_s, scoring_s, attempts = "", 0.0, 0.0, 0
        started = time.monotonic()
        try:
            with trajectory_scope(tid):
                if kind in registry.POOL_KINDS:
                    outcome = await self.pool.submit(
                        trajectory_id=tid,
                        kind=kind,
                        name=spec.scorer,
                        options=options,
                        trajectory=traj.SerializeToString(),
                        budget=budget,
                        deadline=deadline,
                    )
                    verdict = outcome.verdict
                    worker_id, queue_s, scoring_s, attempts = (
                        outcome.worker_id,
                        outcome.queue_seconds,
                        outcome.scoring_seconds,
                        outcome.attempts,
                    )
                else:
                    verdict = await self._inline(kind, traj, options, budget, deadline)
                    scoring_s = time.monotonic() - started
        except InvalidRequest as exc:
            verdict = Verdict(status=INVALID, error=str(exc), cause="invalid")
        except ScorerFailure as exc:
            verdict = exc.verdict()
        except Exception as exc:  # noqa: BLE001 - a bug here must still answer the waiting callers
            log.exception("scoring failed", extra=log_fields(trajectory_id=tid))
            verdict = Verdict(status=FAILED, error=f"internal error: {exc}", cause="internal", retryable=True)
        result = reward_pb2.ScoreResult(
            trajectory_id=tid,
            status=STATUS.get(verdict.status, SS.SCORE_STATUS_FAILED),
            worker_id=worker_id,
            queue_time=timeutil.duration(queue_s),
            attempts=attempts,
        )
        if verdict.status == OK:
            result.outcome.CopyFrom(
                common_pb2.RewardOutcome(
                    trajectory_id=tid,
                    reward=verdict.reward,
                    spec=spec,
                    components=verdict.components,
                    explanation=verdict.explanation[-4000:],
                    scored_at=timeutil.now(),
                    scoring_time=timeutil.duration(scoring_s),
                )
            )
        else:
            result.error = verdict.error + (
                f"\n--- output tail ---\n{verdict.explanation[-800:]}"
                if verdict.explanation and verdict.status != INVALID
                else ""
            )
            result.cause = verdict.cause
            result.retryable = verdict.retryable
        metrics.SCORED.labels(kind, verdict.status).inc()
        metrics.SCORING_SECONDS.labels(kind).observe(scoring_s)
        try:
            if verdict.status == OK:
                result = await self.cache.put(tid, result)
        finally:
            self.inflight.pop(tid, None)
            if not shared.done():
                shared.set_result(result)
        if verdict.status != OK:
            log.info(
                "not scored",
                extra=log_fields(trajectory_id=tid, kind=kind, status=verdict.status, cause=verdict.cause),
            )

    async def _inline(
        self, kind: str, traj: common_pb2.Trajectory, options: dict[str, str], budget: float, deadline: float | None
    ) -> Verdict:
        if deadline is not None:
            budget = min(budget, deadline - time.monotonic())
            if budget <= 0:
                return Verdict(status=TIMEOUT, error="the call's deadline passed", cause="deadline")
        if kind == "game":
            return game_scorer.score(traj, options)
        if kind == "llm_judge":
            if not self.judge.configured:
                return Verdict(
                    status=FAILED,
                    error="no LLMProxy configured for the judge (set llmproxy or resource_manager)",
                    cause="judge_not_configured",
                )
            try:
                return await asyncio.wait_for(self.judge.judge(traj, options, budget), budget + 0.5)
            except TimeoutError:
                return Verdict(status=TIMEOUT, error=f"the judge ran past its {budget:.2f}s budget", cause="deadline")
        raise InvalidRequest(f"scorer kind {kind!r} has no implementation")

    # ------------------------------------------------------------------------------------------------- RPCs

    async def Score(self, request: reward_pb2.ScoreRequest, context: aio.ServicerContext) -> reward_pb2.ScoreResult:
        result = await self.score(request, _deadline(context))  # a bad request raises InvalidArgument
        if result.status == SS.SCORE_STATUS_INVALID:
            raise errors.InvalidArgument("", result.error)
        return result

    async def ScoreMany(
        self, request_iterator: AsyncIterator[reward_pb2.ScoreRequest], context: aio.ServicerContext
    ) -> AsyncIterator[reward_pb2.ScoreResult]:
        deadline = _deadline(context)
        results: asyncio.Queue = asyncio.Queue()
        window = asyncio.Semaphore(self.cfg.stream_window)
        done = object()
        pending: set[asyncio.Task] = set()

        async def one(req: reward_pb2.ScoreRequest) -> None:
            try:
                res = await self.score(req, deadline)
            except errors.InvalidArgument as exc:  # one bad request is one INVALID result, not a failed stream
                res = reward_pb2.ScoreResult(
                    trajectory_id=req.trajectory.trajectory_id,
                    status=SS.SCORE_STATUS_INVALID,
                    error=exc.details(),
                    cause="invalid",
                )
            finally:
                window.release()
            await results.put(res)

        async def read() -> None:
            try:
                async for req in request_iterator:
                    await window.acquire()  # at most stream_window in flight: the rest wait in the stream
                    task = asyncio.create_task(one(req))
                    pending.add(task)
                    task.add_done_callback(pending.discard)
                while pending:
                    await asyncio.gather(*list(pending), return_exceptions=True)
                await results.put(done)
            except BaseException as exc:  # noqa: BLE001 - handed to the response side, which re-raises it
                await results.put(exc)

        reader = asyncio.create_task(read())
        try:
            while True:
                item = await results.get()
                if item is done:
                    return
                if isinstance(item, BaseException):
                    raise item
                yield item
        finally:
            reader.cancel()
            for task in list(pending):
                task.cancel()

    async def ListScorers(
        self, request: reward_pb2.ListScorersRequest, context: aio.ServicerContext
    ) -> reward_pb2.ListScorersResponse:
        SK = common_pb2.ScorerKind
        has = importlib.util.find_spec
        out = [
            reward_pb2.ScorerInfo(
                kind=SK.SCORER_KIND_MATH,
                description="math-verify: parse(gold) vs parse(final answer), in worker processes",
                options=math_scorer.OPTIONS,
                available=has("math_verify") is not None,
            ),
            reward_pb2.ScorerInfo(
                kind=SK.SCORER_KIND_REASONING_GYM,
                description="reasoning-gym's score_answer on the entry rebuilt from metadata dataset/seed/index "
                "(name: the dataset)",
                options=rg_scorer.OPTIONS,
                available=has("reasoning_gym") is not None,
            ),
            reward_pb2.ScorerInfo(
                kind=SK.SCORER_KIND_CODE,
                description="pytest file (metadata 'tests') run on the final answer's code in a bwrap sandbox",
                options=code_scorer.OPTIONS,
                available=shutil.which(self.cfg.sandbox.bwrap) is not None and has("pytest") is not None,
            ),
            reward_pb2.ScorerInfo(
                kind=SK.SCORER_KIND_GAME,
                description="the environment's own rewards, aggregated (sum, last, max, mean; optional threshold)",
                options=game_scorer.OPTIONS,
                available=True,
            ),
            reward_pb2.ScorerInfo(
                kind=SK.SCORER_KIND_LLM_JUDGE,
                description=f"an LLM judge through the LLMProxy (route {self.cfg.judge_route!r})",
                options=judge_scorer.OPTIONS,
                available=self.judge.configured,
            ),
        ]
        for name, target in sorted(self.cfg.custom_scorers.items()):
            module = target.partition(":")[0]
            try:
                found = has(module) is not None
            except (ImportError, ValueError):
                found = False
            out.append(
                reward_pb2.ScorerInfo(
                    kind=SK.SCORER_KIND_CUSTOM, name=name, description=f"user scorer {target}", available=found
                )
            )
        return reward_pb2.ListScorersResponse(scorers=out)

    def _pool_status(self) -> reward_pb2.RewardPoolStatus:
        status = self.pool.status()
        status.cache_hits = self.cache_hits
        status.cache_entries = len(self.cache)
        return status

    async def GetPoolStatus(
        self, request: reward_pb2.RewardPoolStatusRequest, context: aio.ServicerContext
    ) -> reward_pb2.RewardPoolStatus:
        return self._pool_status()

    async def ConfigurePool(
        self, request: reward_pb2.ConfigureRewardPoolRequest, context: aio.ServicerContext
    ) -> reward_pb2.RewardPoolStatus:
        idle = validators.configure_pool(request)
        self.pool.configure(request.min_workers, request.max_workers, idle if idle > 0 else None)
        log.info(
            "pool configured",
            extra=log_fields(min_workers=request.min_workers, max_workers=request.max_workers, idle_timeout=idle),
        )
        return self._pool_status()
