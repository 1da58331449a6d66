"""The step driver: one job, step after step, against the real services. The protocol (phases, modes,
restarts) is written once, in docs/trainer.md ("The step protocol", "Restarts"). Invariants:

- step s trains v_{s-1} into v_s; its checkpoint (when due) is written before its batch is acknowledged and
  before v_s is published, and holds the published bf16 weights of v_{s-1}, the base of D_s;
- a trainer killed before that checkpoint trains the same reserved batch again; killed after it, it republishes
  v_s from the restored weights (the same bits, the same h(v_s)): no version number names two different weights.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import grpc
from grpc import aio

from rollart.delta import WeightSet
from rollart.job.metrics import append_records, to_record
from rollart.runtime.telemetry import log_fields
from rollart.runtime.timeutil import duration as _dur
from rollart.runtime.timeutil import timestamp as _ts
from rollart.v1 import ledger_pb2, llmproxy_pb2, trainer_pb2

from . import checkpointing, stepmetrics, tasks
from .config import TrainerConfig
from .jobspec import LEDGER_NUMBERS, LEDGER_SECONDS, ONE_OFF, SYNC, JobError, Settings
from .peers import Peers, through_outage
from .prompts import PromptFeed
from .publishing import Publication
from .ranks import RankFailed
from .update import Updater

__all__ = ["JobError", "JobRunner", "Settings"]  # JobError and Settings live in jobspec

log = logging.getLogger(__name__)

T = trainer_pb2


class _StopBeforeBatch(Exception):
    """StopJob arrived while the step still waited for its batch: nothing was trained, stop now."""


class JobRunner:
    """Runs one job (see the module docstring). ``emit`` receives every TrainerEvent."""

    def __init__(
        self,
        spec: T.TrainerJobSpec,
        cfg: TrainerConfig,
        emit: Callable[[T.TrainerEvent], None],
        *,
        backend_factory: Callable[[T.TrainerJobSpec], Any] | None = None,
    ) -> None:
        self.spec = spec
        self.cfg = cfg
        self.settings = Settings.from_spec(spec, cfg)
        self.emit = emit
        self._backend_factory = backend_factory or functools.partial(_make_backend, torch_threads=cfg.torch_threads)
        self.job = T.TrainerJob(spec=spec, state=T.TRAINER_JOB_STATE_STARTING, latest_published_version=-1)
        self.job.started_at.CopyFrom(_ts())
        self.job.updated_at.CopyFrom(_ts())
        self.metrics: list[T.StepMetrics] = []
        self.backend: Any = None
        self.ckpt: Any = None
        self.peers: Peers | None = None
        self.updater: Updater | None = None
        self.state: Any = None  # checkpoint.TrainerState
        self.prompts = PromptFeed(spec, self.settings)
        self.publication = Publication(spec, emit, self._published)
        self._suspended = False
        self.stop_requested: int = T.STOP_MODE_UNSPECIFIED
        self.stop_checkpoint = False
        self.step_lock = asyncio.Lock()  # held while weights change (train, checkpoint): SaveCheckpoint waits

    @property
    def publisher(self) -> Any:
        """The weight-plane publisher of the running job (None before it starts); serves the Relay API."""
        return self.publication.publisher

    @property
    def published(self) -> list[T.PublishedVersion]:
        return self.publication.published

    @property
    def published_ws(self) -> WeightSet | None:
        """The bf16 weights of the newest published version."""
        return self.publication.weights

    def _published(self, v: int) -> None:
        assert self.state is not None
        self.state.last_published_version = max(self.state.last_published_version, v)
        self.job.latest_published_version = v

    # ------------------------------------------------------------------------------------------ plumbing

    @property
    def root(self) -> Path:
        return Path(self.cfg.work_dir) / "jobs" / self.spec.job_id

    def _set_state(self, state: T.TrainerJobState, error: str = "") -> None:
        self.job.state = state
        if error:
            self.job.error = error
        self.job.updated_at.CopyFrom(_ts())
        snap = T.TrainerJob()
        snap.CopyFrom(self.job)
        self.emit(T.TrainerEvent(at=_ts(), job=snap))

    def _phase(self, step: int, phase: T.StepPhase) -> None:
        self.job.current_step = step
        self.job.phase = phase
        self.emit(T.TrainerEvent(at=_ts(), phase=T.StepPhaseChange(step=step, phase=phase)))

    # --------------------------------------------------------------------------------------------- run

    async def run(self) -> None:
        try:
            await self._setup()
            self._set_state(T.TRAINER_JOB_STATE_RUNNING)
            while True:
                if self.settings.max_steps and self.state.step >= self.settings.max_steps:
                    await self._finish()
                    self._set_state(T.TRAINER_JOB_STATE_COMPLETED)
                    return
                if self.stop_requested:
                    await self._stopping()
                    return
                try:
                    await self._step(self.state.step + 1)
                except _StopBeforeBatch:
                    await self._stopping()
                    return
        except asyncio.CancelledError:
            # StopJob(NOW) or the process shutting down: the step is lost (its batch stays reserved).
            if self.stop_requested:
                self.job.state = T.TRAINER_JOB_STATE_STOPPED
            raise
        except JobError as exc:
            log.error("job failed: %s", exc)
            self._set_state(T.TRAINER_JOB_STATE_FAILED, f"{exc.code}: {exc}")
        except RankFailed as exc:  # a follower rank died: the message names it; the next StartJob resumes
            log.error("job failed: %s", exc)
            self._set_state(T.TRAINER_JOB_STATE_FAILED, f"ABORTED: {exc}")
        except aio.AioRpcError as exc:
            log.exception("job failed")
            self._set_state(T.TRAINER_JOB_STATE_FAILED, f"{exc.code().name}: {exc.details()}")
        except Exception as exc:  # noqa: BLE001 - the job's state says why; the service stays up
            log.exception("job failed")
            self._set_state(T.TRAINER_JOB_STATE_FAILED, f"INTERNAL: {type(exc).__name__}: {exc}")
        finally:
            await self._cleanup()

    async def _stopping(self) -> None:
        self._set_state(T.TRAINER_JOB_STATE_STOPPING)
        await self.publication.settle()
        if self.stop_checkpoint:
            await self.save_checkpoint()
        self._set_state(T.TRAINER_JOB_STATE_STOPPED)

    async def _cleanup(self) -> None:
        if self._suspended and self.peers is not None and self.peers.proxy is not None:
            with contextlib.suppress(Exception):
                await self.peers.proxy.Resume(
                    llmproxy_pb2.ResumeRequest(step=self.job.current_step, job_id=self.cfg.llmproxy_job_id), timeout=5
                )
            self._suspended = False
        await self.publication.stop()
        if self.updater is not None:
            await self.updater.close()  # lagged full-weight loads still in flight
        if self.peers is not None:
            await self.peers.close()
        close = getattr(self.backend, "close", None)  # a multi-rank backend: stop the follower ranks
        if close is not None:
            with contextlib.suppress(Exception):
                await asyncio.to_thread(close)
        self.job.phase = T.STEP_PHASE_IDLE

    # ------------------------------------------------------------------------------------------- setup

    async def _setup(self) -> None:
        from .checkpoint import CheckpointManager, TrainerState

        spec, st = self.spec, self.settings
        self.peers = Peers(self.cfg, spec)
        self.updater = Updater(spec, self.cfg, st, self.peers, self.publication)
        t0 = time.perf_counter()
        self.backend = await asyncio.to_thread(self._backend_factory, spec)
        log.info("policy loaded", extra=log_fields(model=spec.model, seconds=round(time.perf_counter() - t0, 2)))
        ckpt_root = spec.checkpoint.uri or str(self.root / "checkpoints")
        self.ckpt = CheckpointManager(ckpt_root, keep_last=max(spec.checkpoint.keep_last, 0))
        restored = await checkpointing.restore(self.ckpt, self.backend, spec.job_id) if spec.checkpoint.resume else None
        prev: WeightSet | None = None
        if restored is not None:
            self.state, rec, prev = restored
            self.job.resumed_from.CopyFrom(rec.to_proto())
        else:
            self.state = TrainerState(job_id=spec.job_id)
        self.job.steps_completed = self.state.step
        self.job.policy_version = self.state.policy_version
        self._load_metrics_history()

        await self._ledger_policy()
        latest = await self._ledger_latest()
        if latest > self.state.policy_version:
            raise JobError(
                "FAILED_PRECONDITION",
                f"the ledger has version {latest} registered but the newest checkpoint holds version "
                f"{self.state.policy_version}: resuming would publish a different v{self.state.policy_version + 1} "
                "(keep checkpoint.every_steps at 1, or start a new job id)",
            )
        await self.publication.start(self.cfg, st.weight_sync, self.root, self.peers.ledger, prev)
        if self.state.last_published_version < 0:
            # Version 0: the policy as loaded. Its hash is the digest of the full weights (no delta made it).
            ws0 = await asyncio.to_thread(self.backend.weight_set, 0)
            await self.publication.publish(0, ws0)
        else:
            self.publication.weights = prev
            if self.state.last_batch_id:
                await self._ack_batch(self.state.step, self.state.last_batch_id)
            if self.state.policy_version > self.state.last_published_version:
                ws = await asyncio.to_thread(self.backend.weight_set, self.state.policy_version)
                await self.publication.publish(self.state.policy_version, ws)
        await self.prompts.ensure(self.peers.ledger, self.state.extra, self.state.step + 1)
        if st.mode == SYNC:
            # Rollout for the next step runs on the version the policy is at.
            await self.updater.update(self.state.step + 1, self.state.policy_version)

    def _load_metrics_history(self) -> None:
        kept, lost = checkpointing.metrics_history(self.spec.metrics_path, self.state)
        self.metrics.extend(kept)
        if lost is not None:  # the checkpoint has the step's metrics, the file lost them: write the line again
            self._record_metrics(lost, announce=False)
        if self.metrics:
            self.job.last_step.CopyFrom(self.metrics[-1])

    async def _ledger_policy(self) -> None:
        st = self.settings
        pol = ledger_pb2.JobPolicy(
            job_id=st.job_id,
            admission=st.admission,
            alpha=st.alpha,
            group_size=st.group_size,
            redundancy=st.redundancy,
        )
        if len(self.spec.tasks):  # multi-task: the ledger fills each batch and the in-flight window by share
            pol.task_shares.update(tasks.shares(tasks.sources(self.spec)))
        opts = self.spec.options
        for name, conv in LEDGER_NUMBERS.items():  # checked at StartJob (jobspec)
            if f"ledger.{name}" in opts:
                setattr(pol, name, conv(opts[f"ledger.{name}"]))
        for name in LEDGER_SECONDS:
            if f"ledger.{name}" in opts:
                getattr(pol, name).CopyFrom(_dur(float(opts[f"ledger.{name}"])))
        pol.uniform_allocation = st.uniform_allocation
        assert self.peers is not None
        try:
            await self.peers.ledger.SetJobPolicy(ledger_pb2.SetJobPolicyRequest(policy=pol))
        except aio.AioRpcError as exc:
            raise JobError(exc.code().name, f"ledger SetJobPolicy: {exc.details()}") from None

    async def _ledger_latest(self) -> int:
        assert self.peers is not None
        resp = await self.peers.ledger.ListVersions(ledger_pb2.ListVersionsRequest(from_version=0, limit=1))
        return resp.latest_version

    # ---------------------------------------------------------------------------------------- the step

    async def _step(self, s: int) -> None:
        st = self.settings
        assert self.peers is not None and self.state is not None
        v = s - 1
        m = T.StepMetrics(step=s, version_trained=v, version_produced=s)
        # A step run again after a restart counts from its first start: the metrics show what the failure cost.
        first_start, restarts = checkpointing.step_started(self.root, self.spec.job_id, s)
        m.started_at.FromNanoseconds(int(first_start * 1e9))
        if restarts:
            m.extra["trainer_restarts"] = restarts
            m.extra["t_step_resumed"] = time.time()
        t_step = time.perf_counter()
        before = await stepmetrics.counters(self.peers.ledger)

        self._phase(s, T.STEP_PHASE_GET_BATCH)
        await self.prompts.ensure(self.peers.ledger, self.state.extra, s)
        t = time.perf_counter()
        batch = await self._get_batch(s, v)
        m.get_batch_time.CopyFrom(_dur(time.perf_counter() - t))
        m.extra["t_batch_ready"] = time.time()

        self._phase(s, T.STEP_PHASE_SUSPEND)
        t = time.perf_counter()
        await self._suspend(s)
        m.suspend_time.CopyFrom(_dur(time.perf_counter() - t))
        try:
            if st.mode != SYNC:
                await self._update_and_resume(m, s, s, v, drain=st.mode == ONE_OFF)

            # 5: the actors recompute the KV of in-flight requests at their commit; 6: train meanwhile.
            self._phase(s, T.STEP_PHASE_TRAIN)
            t = time.perf_counter()
            m.extra["t_train_start"] = time.time()
            async with self.step_lock:
                stats, ws_new = await asyncio.to_thread(self._train, batch, v, s)
                m.train_time.CopyFrom(_dur(time.perf_counter() - t))
                m.extra["t_train_end"] = time.time()
                self._phase(s, T.STEP_PHASE_CHECKPOINT)
                t = time.perf_counter()
                self.state.step = s
                self.state.policy_version = s
                self.state.last_batch_id = batch.batch_id
                stepmetrics.fill(
                    m,
                    stats,
                    batch,
                    multitask=len(self.spec.tasks) > 0,
                    max_tokens=self.spec.sampling.max_tokens,
                    max_seq_len=self.spec.grpo.max_seq_len,
                )
                # The checkpoint carries the step's metrics: a restart writes the line a kill lost.
                self.state.extra["metrics"] = to_record(m)
                if s % st.checkpoint_every_steps == 0 or (st.max_steps and s >= st.max_steps):
                    await self._save(published=self.published_ws)
                m.checkpoint_time.CopyFrom(_dur(time.perf_counter() - t))
            await self._ack_batch(s, batch.batch_id)
            self.job.steps_completed = s
            self.job.policy_version = s

            self._phase(s, T.STEP_PHASE_PUBLISH)
            if st.mode == SYNC:
                t = time.perf_counter()
                await self.publication.publish(s, ws_new)
                m.publish_time.CopyFrom(_dur(time.perf_counter() - t))
                # The rollout of the next step runs on v_s (after the last step: the actors end on it).
                await self._update_and_resume(m, s, s + 1, s)
            else:
                self.publication.run_in_background(s, ws_new)
        finally:
            if self._suspended:
                with contextlib.suppress(Exception):
                    await self._resume(s)

        after = await stepmetrics.counters(self.peers.ledger)
        elapsed = time.perf_counter() - t_step
        m.step_time.CopyFrom(_dur(max(time.time() - first_start, elapsed) if restarts else elapsed))
        stepmetrics.settle(m, before, after, elapsed)
        assert self.updater is not None
        for aid, ver in (await self.updater.actor_versions()).items():
            m.actor_versions[aid] = ver
        m.finished_at.CopyFrom(_ts())
        self._record_metrics(m)
        self._phase(s, T.STEP_PHASE_IDLE)
        log.info(
            "step finished",
            extra=log_fields(
                step=s,
                reward=round(m.reward_mean, 4),
                samples=m.samples,
                seconds=round(elapsed, 2),
                staleness=round(m.staleness_mean, 3),
            ),
        )

    async def _update_and_resume(self, m: T.StepMetrics, s: int, plan_step: int, v: int, drain: bool = False) -> None:
        """UPDATE (v active on the actors for the rollout of ``plan_step``; async: after v's publication) and
        RESUME, timed into the step's metrics."""
        self._phase(s, T.STEP_PHASE_UPDATE)
        t = time.perf_counter()
        m.extra["t_update_start"] = time.time()
        await self.publication.wait()  # nothing pending in SYNC: it published v itself
        if self.publication.last is not None:  # the version this update makes active: when it was published
            m.extra["t_publish_start"], m.extra["t_publish_end"] = self.publication.last
        assert self.updater is not None
        pause = await self.updater.update(plan_step, v, drain=drain)
        m.update_time.CopyFrom(_dur(time.perf_counter() - t))
        m.update_pause.CopyFrom(_dur(pause))
        m.extra["t_update_end"] = time.time()
        self._phase(s, T.STEP_PHASE_RESUME)
        t = time.perf_counter()
        await self._resume(s)
        m.resume_time.CopyFrom(_dur(time.perf_counter() - t))

    def _train(self, batch: ledger_pb2.Batch, v: int, s: int) -> tuple[Any, WeightSet]:
        from .grpo import TrainBatch

        trajs = [t for g in batch.groups for t in g.trajectories]
        stats = self.backend.train_step(TrainBatch.from_trajectories(trajs, batch.batch_id, policy_version=v))
        # Export now: the next step changes the master weights in place.
        return stats, self.backend.weight_set(s)

    def _record_metrics(self, m: T.StepMetrics, announce: bool = True) -> None:
        self.metrics.append(m)
        if len(self.metrics) > self.cfg.history:
            del self.metrics[: len(self.metrics) - self.cfg.history]
        self.job.last_step.CopyFrom(m)
        if self.spec.metrics_path:
            append_records(self.spec.metrics_path, [to_record(m)])
        if announce:
            self.emit(T.TrainerEvent(at=_ts(), step_finished=m))

    # -------------------------------------------------------------------------------- protocol pieces

    async def _get_batch(self, s: int, v: int) -> ledger_pb2.Batch:
        assert self.peers is not None and self.state is not None
        deadline = time.monotonic() + self.settings.batch_timeout
        # DAPO's dynamic sampling (docs/objective.md): the ledger consumes zero-variance groups as filtered and
        # fills the batch from further groups, at most max_groups drawn (0: 4 x the batch's groups).
        drop = self.spec.grpo.dynamic_sampling
        max_groups = (self.spec.grpo.max_groups_per_batch or 4 * self.settings.groups_per_step) if drop else 0
        while True:
            if self.stop_requested:
                raise _StopBeforeBatch()
            if drop:  # the pool refilled by the groups filtered so far (this step's included)
                await self.prompts.ensure(
                    self.peers.ledger, self.state.extra, s, extra_groups=await self._filtered_groups()
                )
            wait = max(0.0, min(2.0 if drop else 5.0, deadline - time.monotonic()))
            req = ledger_pb2.GetBatchRequest(
                step=s,
                batch_size=self.settings.batch_size,
                current_version=v,
                wait=_dur(wait),
                drop_zero_variance=drop,
                max_groups=max_groups,
            )
            try:
                return await self.peers.ledger.GetBatch(req, timeout=wait + 15.0)
            except aio.AioRpcError as exc:
                if exc.code() not in (grpc.StatusCode.DEADLINE_EXCEEDED, grpc.StatusCode.UNAVAILABLE):
                    raise
                if time.monotonic() >= deadline:
                    raise JobError(
                        "DEADLINE_EXCEEDED",
                        f"step {s}: no batch of {self.settings.batch_size} samples: {exc.details()}",
                    ) from None
                if exc.code() == grpc.StatusCode.UNAVAILABLE:
                    await asyncio.sleep(0.5)

    async def _filtered_groups(self) -> int:
        """Groups the ledger consumed as filtered so far (its accounting counts their samples)."""
        assert self.peers is not None
        st = await self.peers.ledger.GetStatus(ledger_pb2.LedgerStatusRequest(versions_limit=1), timeout=15.0)
        return st.accounting.filtered.samples // max(self.settings.group_size, 1)

    async def _ack_batch(self, s: int, batch_id: str) -> None:
        assert self.peers is not None
        try:
            await self.peers.ledger.AckBatch(ledger_pb2.AckBatchRequest(step=s, batch_id=batch_id))
        except aio.AioRpcError as exc:
            if exc.code() != grpc.StatusCode.FAILED_PRECONDITION:  # acknowledged before (a resumed step)
                raise

    async def _suspend(self, s: int) -> None:
        assert self.peers is not None
        if self.peers.proxy is None:
            return
        await self._proxy_call(
            self.peers.proxy.Suspend,
            llmproxy_pb2.SuspendRequest(reason="update", step=s, job_id=self.cfg.llmproxy_job_id),
        )
        self._suspended = True

    async def _resume(self, s: int) -> None:
        assert self.peers is not None
        if self.peers.proxy is None or not self._suspended:
            return
        await self._proxy_call(
            self.peers.proxy.Resume, llmproxy_pb2.ResumeRequest(step=s, job_id=self.cfg.llmproxy_job_id)
        )
        self._suspended = False

    async def _proxy_call(self, method: Callable[..., Any], request: Any) -> Any:
        """Suspend and Resume are idempotent and the LLMProxy may be across a link: an outage is waited out for as
        long as the job waits for a batch."""
        name = type(request).__name__.removesuffix("Request")
        return await through_outage(
            method, request, budget=self.settings.batch_timeout, attempt_timeout=self.cfg.rpc_timeout_seconds,
            what=f"LLMProxy {name}",
        )  # fmt: skip

    async def _finish(self) -> None:
        """After the last step: the last version out and active on every actor."""
        await self.publication.wait()  # a failed publication fails the job: actors cannot get v
        v = self.state.policy_version
        if self.settings.mode != SYNC and v > 0:
            self._phase(self.state.step, T.STEP_PHASE_UPDATE)
            assert self.updater is not None
            with contextlib.suppress(JobError, aio.AioRpcError):
                await self.updater.update(self.state.step + 1, v)
            self._phase(self.state.step, T.STEP_PHASE_IDLE)

    # ------------------------------------------------------------------------------------- checkpoints

    async def _save(self, *, published: WeightSet | None, weights_only: bool = False) -> Any:
        assert self.ckpt is not None and self.state is not None
        rec = await checkpointing.save(
            self.ckpt, self.backend, self.state, published=published, weights_only=weights_only
        )
        if rec is not None:
            self.emit(T.TrainerEvent(at=_ts(), checkpoint_saved=rec.to_proto()))
        return rec

    async def save_checkpoint(self, weights_only: bool = False) -> Any:
        """SaveCheckpoint between steps (waits for a running train/checkpoint phase)."""
        if self.backend is None or self.state is None:
            raise JobError("FAILED_PRECONDITION", "the job has not loaded its policy yet")
        async with self.step_lock:
            # published_ws is the newest published version: the base of the next delta after a restart.
            return await self._save(published=self.published_ws, weights_only=weights_only)

    # ------------------------------------------------------------------------------------------ status

    def current_version(self) -> T.CurrentVersionResponse:
        return self.publication.current_version(self.state.policy_version if self.state is not None else 0)


def _make_backend(spec: T.TrainerJobSpec, torch_threads: int = 1) -> Any:
    from .backends import make_backend
    from .grpo import GrpoSettings

    settings = GrpoSettings.from_job_spec(spec)
    kind = T.TrainerBackend.Name(spec.backend or T.TRAINER_BACKEND_TORCH)
    parallel: dict[str, Any] = {}
    if kind == "TRAINER_BACKEND_MEGATRON":
        parallel = {
            "tensor_parallel_size": spec.parallel.tensor_parallel_size or 1,
            "pipeline_parallel_size": spec.parallel.pipeline_parallel_size or 1,
        }
    world = parallel.get("tensor_parallel_size", 1) * parallel.get("pipeline_parallel_size", 1)
    if world > 1:
        # Rank 0 here; the other ranks are processes this trainer starts (rollart_trainer.ranks).
        from .ranks import MirroredBackend

        return MirroredBackend.build(
            world,
            {"kind": kind, "model_path": spec.model, "settings": settings, "device": spec.device or None, **parallel},
            torch_threads=torch_threads,
        )
    from .lora import settings_of

    lora = settings_of(spec)
    if lora is not None:  # StartJob refused LoRA on the other backends (spec.lora)
        return make_backend(kind, spec.model, settings, device=spec.device or None, lora=lora, seed=spec.seed)
    return make_backend(kind, spec.model, settings, device=spec.device or None, **parallel)
