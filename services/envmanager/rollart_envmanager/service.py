"""The EnvManager gRPC service (``rollart.v1.EnvManager``): loop groups, trajectories in flight, one-off episodes.

Validation happens before any state changes: a bad request is INVALID_ARGUMENT (unknown environment, a
backend the environment does not support, bad numbers), FAILED_PRECONDITION when it cannot run here (the
environment's package or sandbox backend is missing, no ledger to take leases from, a group id reused with
another spec), NOT_FOUND for unknown loop or group ids.
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket

from grpc import aio

from rollart.discovery import Registration
from rollart.runtime import errors
from rollart.runtime.telemetry import log_fields
from rollart.v1 import common_pb2, envmanager_pb2, envmanager_pb2_grpc
from rollart.v1 import resource_manager_pb2 as rm

from . import validators
from .config import EnvManagerConfig
from .convert import list_environments
from .envs.base import EnvConfigError, UnknownEnvironment
from .envs.registry import TaskConfig
from .episode import INFRA, Episode, InfraFailure, new_trajectory_id, now_ts
from .evaluation import Evaluator
from .manager import Group, Manager
from .sandbox import availability

log = logging.getLogger(__name__)
LS = envmanager_pb2.LoopState


class EnvManagerService(envmanager_pb2_grpc.EnvManagerServicer):
    name = "envmanager"
    service_names = [envmanager_pb2.DESCRIPTOR.services_by_name["EnvManager"].full_name]

    def __init__(self, cfg: EnvManagerConfig) -> None:
        self.cfg = cfg
        self.manager = Manager(cfg)
        self.registration: Registration | None = None
        self._start_lock = asyncio.Lock()

    # -- lifecycle -------------------------------------------------------------------------------------------------
    def add_to_server(self, server: aio.Server) -> None:
        envmanager_pb2_grpc.add_EnvManagerServicer_to_server(self, server)

    async def start(self) -> None:
        pass

    async def on_draining(self) -> None:
        await self.manager.close()

    async def stop(self) -> None:
        await self.manager.close()
        if self.registration is not None:
            await self.registration.stop()

    async def on_serving(self, address: str) -> None:
        if not self.cfg.resource_manager:
            return
        worker = rm.Worker(
            worker_id=self.manager.manager_id,
            role="envmanager",
            endpoint=address,
            pool=self.cfg.rm_pool,
            region=self.cfg.region,
            hardware=common_pb2.Hardware(accelerator="cpu", count=os.cpu_count() or 1, tags=["envmanager"]),
            labels={"host": socket.gethostname(), "max_loops": str(self.cfg.max_loops)},
            ttl_seconds=10.0,
        )
        pool = None
        if self.cfg.rm_register_pool:
            pool = rm.Pool(name=self.cfg.rm_pool, kind=common_pb2.POOL_KIND_CPU, capacity=max(os.cpu_count() or 1, 1),
                           region=self.cfg.region)
        self.registration = Registration(self.cfg.resource_manager, worker, token=self.cfg.token(), tls=self.cfg.tls,
                                         pool=pool)
        await self.registration.start()

    # -- helpers -------------------------------------------------------------------------------------------------
    def _config(self, env: envmanager_pb2.EnvironmentSpec) -> TaskConfig:
        validators.check_env(env)
        try:
            config = self.manager.task_config(env)
            info, backend, _turns = config.resolve(self.manager.registry)
        except UnknownEnvironment as exc:
            raise errors.InvalidArgument("", str(exc)) from None
        except (EnvConfigError, ValueError) as exc:
            raise errors.InvalidArgument("", str(exc)) from None
        ok, why = info.availability()
        if not ok:
            raise errors.FailedPrecondition(f"{info.id} cannot run here: {why}")
        ok, why = availability(backend)
        if not ok:
            raise errors.FailedPrecondition(f"the {backend} sandbox backend is unavailable: {why}")
        return config

    # -- RPCs ------------------------------------------------------------------------------------------------------
    async def ListEnvironments(self, request, context):
        try:
            return list_environments(request, self.manager.registry)
        except ValueError as exc:
            raise errors.InvalidArgument("", str(exc)) from None

    async def StartLoops(self, request: envmanager_pb2.StartLoopsRequest, context) -> envmanager_pb2.LoopGroup:
        m = self.manager
        validators.check_start_loops(request)
        async with self._start_lock:
            existing = m.groups.get(request.group_id)
            if existing is not None:
                if existing.key != request.SerializeToString(deterministic=True):
                    raise errors.FailedPrecondition(f"loop group {request.group_id!r} exists with another spec")
                return existing.proto()
            config = self._config(request.env)
            if not m.peers.ledger.known:
                raise errors.FailedPrecondition(
                    "no ledger configured (set `ledger` or `resource_manager`): loops take leases from it")
            if m.active_loops() + request.count > self.cfg.max_loops:
                raise errors.ResourceExhausted(
                              f"{request.count} more loops exceed max_loops={self.cfg.max_loops} "
                              f"({m.active_loops()} running)")
            group = m.start_group(request, config)
        return group.proto()

    def _targets(self, group_ids, loop_ids) -> list:
        m = self.manager
        out = []
        for gid in group_ids:
            group = m.groups.get(gid)
            if group is None:
                raise errors.NotFound(f"no loop group {errors.shorten(gid)}")
            out += group.loops
        by_id = {lo.loop_id: lo for lo in m.loops()}
        for lid in loop_ids:
            if lid not in by_id:
                raise errors.NotFound(f"no loop {errors.shorten(lid)}")
            out.append(by_id[lid])
        return list(dict.fromkeys(out))

    async def StopLoops(self, request: envmanager_pb2.StopLoopsRequest, context) -> envmanager_pb2.StopLoopsResponse:
        validators.check_stop_loops(request)
        loops = self._targets(request.group_ids, request.loop_ids)
        mode = "abort" if request.mode == envmanager_pb2.LOOP_STOP_MODE_ABORT else "graceful"
        released = sum(1 for lo in loops if lo.stop(mode))
        for gid in request.group_ids:
            self.manager.groups[gid].stop_requested = True
        stopped = all(lo.stopped for lo in loops)
        if request.wait and not stopped:
            tasks = [lo.task for lo in loops if lo.task is not None and not lo.task.done()]
            remaining = context.time_remaining()
            timeout = None if remaining is None or remaining > 1e8 else max(remaining - 0.2, 0.0)
            if tasks:
                await asyncio.wait(tasks, timeout=timeout)
            stopped = all(lo.stopped for lo in loops)
        return envmanager_pb2.StopLoopsResponse(loop_ids=[lo.loop_id for lo in loops], leases_released=released,
                                                stopped=stopped)

    async def ListLoopGroups(self, request, context) -> envmanager_pb2.ListLoopGroupsResponse:
        groups = [g for g in self.manager.groups.values()
                  if request.include_stopped or g.state() not in (envmanager_pb2.LOOP_GROUP_STATE_STOPPED,
                                                                  envmanager_pb2.LOOP_GROUP_STATE_FAILED)]
        return envmanager_pb2.ListLoopGroupsResponse(groups=[g.proto() for g in groups])

    async def ListLoops(self, request: envmanager_pb2.ListLoopsRequest, context) -> envmanager_pb2.ListLoopsResponse:
        validators.check_list_loops(request)
        if request.group_id and request.group_id not in self.manager.groups:
            raise errors.NotFound(f"no loop group {errors.shorten(request.group_id)}")
        states = set(request.states)
        loops = [lo for lo in self.manager.loops()
                 if (not request.group_id or lo.group.group_id == request.group_id)
                 and (not states or lo.state in states)]
        return envmanager_pb2.ListLoopsResponse(loops=[lo.proto() for lo in loops])

    async def ListTrajectories(self, request, context) -> envmanager_pb2.ListTrajectoriesResponse:
        return envmanager_pb2.ListTrajectoriesResponse(trajectories=self.manager.in_flight(request.group_id))

    async def AbortTrajectories(self, request: envmanager_pb2.AbortTrajectoriesRequest,
                                context) -> envmanager_pb2.AbortTrajectoriesResponse:
        validators.check_abort_trajectories(request)
        aborted = []
        reason = request.reason or "aborted through AbortTrajectories"
        for tid in dict.fromkeys(request.trajectory_ids):
            loop = self.manager.by_trajectory.get(tid)
            if loop is not None and loop.abort_episode("aborted", reason):
                aborted.append(tid)
            elif tid in self.manager.oneoff:
                task = self.manager.oneoff_tasks.get(tid)
                if task is not None and not task.done():
                    task.cancel()
                    aborted.append(tid)
        return envmanager_pb2.AbortTrajectoriesResponse(aborted=aborted)

    async def RunEpisode(self, request: envmanager_pb2.RunEpisodeRequest, context) -> envmanager_pb2.RunEpisodeResponse:
        m = self.manager
        tid = validators.check_run_episode(request, request.trajectory_id or new_trajectory_id())
        if tid in m.oneoff or tid in m.by_trajectory:
            raise errors.AlreadyExists(f"trajectory {tid} is in flight")
        config = self._config(request.env)
        group = Group(envmanager_pb2.StartLoopsRequest(group_id="episode", env=request.env, count=1), config,
                      "", [])
        spec = m.episode_spec(group, None, seed=request.seed, prompt_text=request.prompt_text,
                              metadata=dict(request.metadata))
        ep = Episode(tid, "", config.environment, spec.task)
        latency = config.latency.sampler(tid) if config.latency.enabled else None
        m.oneoff[tid] = ep
        task = asyncio.create_task(m.ctx.run(ep, spec, None, latency, lambda _s: None))
        m.oneoff_tasks[tid] = task
        try:
            try:
                traj, handle = await asyncio.shield(task)
            except asyncio.CancelledError:
                task.cancel()
                raise
            finally:
                m.oneoff.pop(tid, None)
                m.oneoff_tasks.pop(tid, None)
            m.dispose(handle, kill=False)
        except asyncio.CancelledError:
            if ep.handle is not None:
                m.dispose(ep.handle, kill=True)
            if task.cancelled():  # aborted through AbortTrajectories: the generation is ended before the answer
                await m.ctx.abort_generation(tid, "aborted through AbortTrajectories")
                traj = common_pb2.Trajectory(trajectory_id=tid, task=spec.task, started_at=ep.started_at,
                                             status=common_pb2.TRAJECTORY_STATUS_CANCELLED,
                                             failure_cause="aborted through AbortTrajectories")
                return envmanager_pb2.RunEpisodeResponse(trajectory=traj)
            m.spawn(m.ctx.abort_generation(tid, "RunEpisode cancelled by its caller"))
            raise
        except InfraFailure as exc:
            if ep.handle is not None:
                m.dispose(ep.handle, kill=True)
            m.failures[exc.cause] += 1
            traj = common_pb2.Trajectory(trajectory_id=tid, task=spec.task, started_at=ep.started_at,
                                         finished_at=now_ts(), status=exc.status or INFRA, failure_cause=str(exc))
            return envmanager_pb2.RunEpisodeResponse(trajectory=traj)
        except Exception as exc:  # noqa: BLE001 - ExternalAbort and friends: reported, not raised
            if ep.handle is not None:
                m.dispose(ep.handle, kill=True)
            traj = common_pb2.Trajectory(trajectory_id=tid, task=spec.task, started_at=ep.started_at,
                                         finished_at=now_ts(), status=common_pb2.TRAJECTORY_STATUS_CANCELLED,
                                         failure_cause=f"{type(exc).__name__}: {exc}")
            return envmanager_pb2.RunEpisodeResponse(trajectory=traj)
        resp = envmanager_pb2.RunEpisodeResponse(trajectory=traj)
        if request.score:
            outcome, cause = await m.start_scoring(traj, spec.reward)
            if outcome is not None:
                resp.trajectory.reward = outcome.reward
                resp.trajectory.scored = True
                resp.reward.CopyFrom(outcome)
            else:
                resp.trajectory.metadata["reward_failure"] = cause[:1000]
        log.info("episode run", extra=log_fields(trajectory_id=tid, environment=config.environment,
                                                  turns=len(traj.turns)))
        return resp

    async def Evaluate(self, request: envmanager_pb2.EvaluateRequest, context) -> envmanager_pb2.EvaluateResponse:
        # Validation: the episode loop without the ledger (evaluation.py); checks in validators.check_evaluate.
        return await Evaluator(self.manager, self._config).run(request)

    async def GetStatus(self, request, context) -> envmanager_pb2.EnvManagerStatus:
        return self.manager.status()


__all__ = ["EnvManagerService"]
