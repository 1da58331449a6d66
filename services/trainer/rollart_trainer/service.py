"""The trainer's gRPC service (``rollart.v1.Trainer``): one job at a time, driven by :mod:`.driver`.

The service also serves the ``rollart.v1.Relay`` API of the running job's weight publisher, so actors whose
relay died fetch deltas from the trainer itself (their fallback source).

The spec of the running job is kept in ``<work_dir>/job.json`` until the job ends; a trainer restarted
after a crash (or SIGKILL) finds it and resumes the job from its newest checkpoint without being asked.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

from google.protobuf import json_format
from grpc import aio

from rollart.runtime import errors
from rollart.runtime.telemetry import log_fields
from rollart.v1 import relay_pb2, relay_pb2_grpc, trainer_pb2, trainer_pb2_grpc

from . import validators
from .config import TrainerConfig
from .driver import JobError, JobRunner

log = logging.getLogger(__name__)
T = trainer_pb2
_ENDED = (T.TRAINER_JOB_STATE_STOPPED, T.TRAINER_JOB_STATE_COMPLETED, T.TRAINER_JOB_STATE_FAILED)


class _RelayFacade(relay_pb2_grpc.RelayServicer):
    """The Relay API of the running job's publisher (UNAVAILABLE between jobs)."""

    def __init__(self, svc: TrainerService) -> None:
        self.svc = svc

    async def _target(self, context: aio.ServicerContext) -> Any:
        runner = self.svc.runner
        pub = runner.publisher if runner is not None else None
        if pub is None:
            raise errors.Unavailable("no job is publishing on this trainer")
        return pub.servicer

    async def Subscribe(self, request, context):  # noqa: N802 - gRPC method names
        return await (await self._target(context)).Subscribe(request, context)

    async def Unsubscribe(self, request, context):  # noqa: N802
        return await (await self._target(context)).Unsubscribe(request, context)

    async def WatchEvents(self, request, context) -> AsyncIterator[relay_pb2.RelayEvent]:  # noqa: N802
        async for ev in (await self._target(context)).WatchEvents(request, context):
            yield ev

    async def SetUpstream(self, request, context):  # noqa: N802
        return await (await self._target(context)).SetUpstream(request, context)

    async def PushSegments(self, request_iterator, context):  # noqa: N802
        return await (await self._target(context)).PushSegments(request_iterator, context)

    async def FetchDeltas(self, request, context):  # noqa: N802
        async for seg in (await self._target(context)).FetchDeltas(request, context):
            yield seg

    async def Commit(self, request, context):  # noqa: N802
        return await (await self._target(context)).Commit(request, context)

    async def GetStatus(self, request, context):  # noqa: N802
        return await (await self._target(context)).GetStatus(request, context)

    async def PruneCache(self, request, context):  # noqa: N802
        return await (await self._target(context)).PruneCache(request, context)


class TrainerService(trainer_pb2_grpc.TrainerServicer):
    name = "trainer"
    service_names = [
        T.DESCRIPTOR.services_by_name["Trainer"].full_name,
        relay_pb2.DESCRIPTOR.services_by_name["Relay"].full_name,
    ]

    def __init__(self, cfg: TrainerConfig, *, backend_factory: Any = None) -> None:
        self.cfg = cfg
        self.runner: JobRunner | None = None
        self.task: asyncio.Task | None = None
        self._backend_factory = backend_factory
        self._events: list[T.TrainerEvent] = []
        self._changed = asyncio.Condition()
        self._generation = 0

    # ------------------------------------------------------------------------------------------ lifecycle

    def add_to_server(self, server: aio.Server) -> None:
        trainer_pb2_grpc.add_TrainerServicer_to_server(self, server)
        relay_pb2_grpc.add_RelayServicer_to_server(_RelayFacade(self), server)

    async def start(self) -> None:
        import torch

        torch.set_num_threads(self.cfg.torch_threads)
        Path(self.cfg.work_dir).mkdir(parents=True, exist_ok=True)
        saved = self._read_job()
        if saved is not None and self.cfg.resume and saved.get("state") == "running":
            spec = json_format.Parse(json.dumps(saved["spec"]), T.TrainerJobSpec())
            log.info("resuming job", extra=log_fields(job_id=spec.job_id))
            try:
                self._launch(spec)
            except JobError as exc:
                log.error("cannot resume job %s: %s", spec.job_id, exc)

    async def stop(self) -> None:
        # SIGTERM: the job stays "running" in job.json, so the next start resumes it from its checkpoint.
        if self.task is not None and not self.task.done():
            self.task.cancel()
            with contextlib.suppress(BaseException):
                await self.task

    async def on_draining(self) -> None:
        async with self._changed:
            self._generation += 1
            self._changed.notify_all()

    def ready_info(self) -> dict[str, Any]:
        return {"job_id": self.cfg.job_id}

    # --------------------------------------------------------------------------------------- job file

    @property
    def _job_file(self) -> Path:
        return Path(self.cfg.work_dir) / "job.json"

    def _read_job(self) -> dict[str, Any] | None:
        try:
            return json.loads(self._job_file.read_text())
        except (OSError, ValueError):
            return None

    def _write_job(self, spec: T.TrainerJobSpec, state: str) -> None:
        doc = {"spec": json_format.MessageToDict(spec, preserving_proto_field_name=True), "state": state}
        tmp = self._job_file.with_suffix(".tmp")
        with open(tmp, "w") as fh:
            fh.write(json.dumps(doc, indent=1))
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, self._job_file)

    # ------------------------------------------------------------------------------------------ events

    def _emit(self, ev: T.TrainerEvent) -> None:
        self._events.append(ev)
        if len(self._events) > self.cfg.history:
            del self._events[: len(self._events) - self.cfg.history]

        async def notify() -> None:
            async with self._changed:
                self._generation += 1
                self._changed.notify_all()

        with contextlib.suppress(RuntimeError):
            asyncio.get_running_loop().create_task(notify())

    def _launch(self, spec: T.TrainerJobSpec) -> JobRunner:
        runner = JobRunner(spec, self.cfg, self._emit, backend_factory=self._backend_factory)
        self._write_job(spec, "running")
        self.runner = runner
        self._events = []
        runner._set_state(T.TRAINER_JOB_STATE_STARTING)
        self.task = asyncio.ensure_future(self._run(runner))
        return runner

    async def _run(self, runner: JobRunner) -> None:
        try:
            await runner.run()
        except asyncio.CancelledError:
            if runner.stop_requested:
                runner._set_state(T.TRAINER_JOB_STATE_STOPPED)
                self._write_job(runner.spec, "stopped")
            raise
        state = runner.job.state
        if state in _ENDED:
            self._write_job(runner.spec, T.TrainerJobState.Name(state).removeprefix("TRAINER_JOB_STATE_").lower())
        async with self._changed:
            self._generation += 1
            self._changed.notify_all()

    # --------------------------------------------------------------------------------------------- RPCs

    async def StartJob(self, request: T.StartJobRequest, context: aio.ServicerContext) -> T.TrainerJob:
        spec = request.spec
        validators.check_spec(spec)  # the whole spec, before anything is accepted
        cur = self.runner
        if cur is not None and cur.job.state not in _ENDED:
            if cur.spec.job_id == spec.job_id and cur.spec == spec:
                return cur.job  # idempotent while it runs
            raise errors.FailedPrecondition(f"job {cur.spec.job_id!r} is running; stop it first")
        runner = self._launch(spec)  # JobError: a runtime.errors.Coded error, mapped by the server
        return runner.job

    async def StopJob(self, request: T.StopJobRequest, context: aio.ServicerContext) -> T.TrainerJob:
        runner = self.runner
        if runner is None:
            raise errors.NotFound("no job was started")
        if request.job_id and request.job_id != runner.spec.job_id:
            raise errors.NotFound(f"job {errors.shorten(request.job_id)} is not this trainer's job")
        if runner.job.state in _ENDED:
            return runner.job
        runner.stop_checkpoint = request.checkpoint
        runner.stop_requested = request.mode or T.STOP_MODE_AFTER_STEP
        if runner.stop_requested == T.STOP_MODE_NOW and self.task is not None and not self.task.done():
            self.task.cancel()
            with contextlib.suppress(BaseException):
                await self.task
            if request.checkpoint and runner.backend is not None:
                with contextlib.suppress(Exception):
                    await runner.save_checkpoint()
        elif runner.job.state != T.TRAINER_JOB_STATE_STOPPING:
            runner._set_state(T.TRAINER_JOB_STATE_STOPPING)
        return runner.job

    async def GetJob(self, request: T.GetTrainerJobRequest, context: aio.ServicerContext) -> T.TrainerJob:
        if self.runner is None:
            raise errors.NotFound("no job was started")
        return self.runner.job

    async def WatchJob(
        self, request: T.WatchTrainerJobRequest, context: aio.ServicerContext
    ) -> AsyncIterator[T.TrainerEvent]:
        if self.runner is None:
            raise errors.NotFound("no job was started")
        runner = self.runner
        yield T.TrainerEvent(job=runner.job)
        if request.from_step > 0:
            for m in list(runner.metrics):
                if m.step >= request.from_step:
                    yield T.TrainerEvent(at=m.finished_at, step_finished=m)
        sent = len(self._events)
        gen = self._generation
        while True:
            if runner is not self.runner:
                return
            events = self._events
            if sent > len(events):
                sent = len(events)  # trimmed history
            for ev in events[sent:]:
                yield ev
            sent = len(events)
            if runner.job.state in _ENDED and (self.task is None or self.task.done()):
                return
            async with self._changed:
                if self._generation == gen:
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(self._changed.wait(), 5.0)
                gen = self._generation

    async def GetCurrentVersion(self, request, context) -> T.CurrentVersionResponse:
        if self.runner is None:
            raise errors.NotFound("no job was started")
        return self.runner.current_version()

    async def ListPublishedVersions(self, request, context) -> T.ListPublishedVersionsResponse:
        if self.runner is None:
            raise errors.NotFound("no job was started")
        validators.check_list_published(request)
        limit = request.limit or 100
        out = [
            p
            for p in self.runner.published
            if p.version.version >= request.from_version or p.step >= request.from_version
        ]
        return T.ListPublishedVersionsResponse(versions=out[-limit:])

    async def GetStepMetrics(self, request, context) -> T.GetStepMetricsResponse:
        if self.runner is None:
            raise errors.NotFound("no job was started")
        validators.check_step_metrics(request)
        hi = request.to_step or (1 << 62)
        return T.GetStepMetricsResponse(steps=[m for m in self.runner.metrics if request.from_step <= m.step <= hi])

    async def SaveCheckpoint(self, request, context) -> T.CheckpointInfo:
        if self.runner is None:
            raise errors.NotFound("no job was started")
        rec = await self.runner.save_checkpoint(weights_only=request.weights_only)
        return rec.to_proto()

    async def ListCheckpoints(self, request, context) -> T.ListCheckpointsResponse:
        runner = self.runner
        if runner is None or runner.ckpt is None:
            raise errors.NotFound("no job has checkpoints here")
        records = await asyncio.to_thread(runner.ckpt.list)
        return T.ListCheckpointsResponse(checkpoints=[r.to_proto() for r in records])
