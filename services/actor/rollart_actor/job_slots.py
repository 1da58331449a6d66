"""Jobs attached to a LoRA actor besides its own: several jobs on one fleet (docs/lora.md).

The base model is loaded once. Each attached job is a :class:`JobSlot` with what the actor's own job has:
- its adapter host (a zero template of its rank and modules until its first version, the base check on every
  full set: ``adapters.AdapterHost``);
- its :class:`~rollart_actor.weights.WeightManager`, whose staging accepts only segments naming the job and
  signed with its key; commits switch the job's adapter at a safe point through :class:`JobEngine`;
- its relay subscription (optional) and its checkpoint store (its first version, catch-up);
- its ledger agent (optional): the actor registers in the job's ledger under its own id and endpoint, and
  reports the job's weights there.

A slot never touches another job's adapters, and its failures (a refused adapter, an unreachable ledger) stay
its own. Detaching stops its subscriptions and drops its adapters once no request uses them. A job whose ledger
has not answered for ``attached_job_orphan_seconds`` is detached by the actor itself (its run was killed before
it could call DetachJob).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rollart.runtime import ids
from rollart.v1 import actor_pb2, common_pb2, ledger_pb2

from .adapters import AdapterHost, await_first_adapter, template
from .config import ActorLoraConfig
from .engine import KEEP
from .host_weights import WeightError
from .ledger_agent import ActorReport, LedgerAgent
from .weights import WeightManager

if TYPE_CHECKING:
    from .engine import ActorEngine

log = logging.getLogger(__name__)


class JobEngine:
    """The shared engine as one attached job's weight manager sees it: the job's version and safe point."""

    def __init__(self, engine: ActorEngine, job: str) -> None:
        self.engine, self.job = engine, job

    @property
    def version(self) -> int:
        return self.engine.adapters.of(self.job).version

    @version.setter
    def version(self, value: int) -> None:  # an empty delta moves the version without a new adapter
        self.engine.adapters.of(self.job).version = value

    async def update_weights(
        self,
        payload: str,
        to_version: int,
        *,
        mode: str = KEEP,
        wait_timeout: float | None = 60.0,
        after_load: Callable[[], None] | None = None,
    ) -> Any:
        return await self.engine.update_weights(
            payload, to_version, mode=mode, wait_timeout=wait_timeout, after_load=after_load, job=self.job
        )


@dataclass(frozen=True)
class JobSpec:
    """What AttachJob asked for; a second AttachJob of the job must ask the same."""

    job_id: str
    key: bytes
    rank: int
    alpha: float
    target_modules: tuple[str, ...]
    relay_endpoint: str
    fallback_endpoints: tuple[str, ...]
    streams: int
    checkpoint_store: str
    ledger: str

    @classmethod
    def from_request(cls, req: actor_pb2.AttachJobRequest, default_targets: Sequence[str]) -> JobSpec:
        """Checked: WeightError INVALID_ARGUMENT naming the field."""

        def bad(field: str, why: str) -> WeightError:
            return WeightError("INVALID_ARGUMENT", f"{field}: {why}")

        why = ids.name_problem(req.job_id)
        if why:
            raise bad("job_id", why)
        if not 16 <= len(req.job_key) <= 64:
            raise bad("job_key", f"{len(req.job_key)} bytes (16 to 64)")
        if not 1 <= req.rank <= 256:
            raise bad("rank", f"{req.rank} (1 to 256)")
        if not 0 < req.alpha <= 1e6:
            raise bad("alpha", f"{req.alpha} (> 0)")
        targets = tuple(req.target_modules) or tuple(default_targets)
        try:
            ActorLoraConfig(rank=req.rank, alpha=req.alpha, target_modules=list(targets))
        except ValueError as exc:
            raise bad("target_modules", str(exc).splitlines()[-1]) from None
        ws = req.weight_source
        if not ws.checkpoint_store:
            raise bad("weight_source.checkpoint_store", "required (the job's first adapter version is loaded there)")
        return cls(
            job_id=req.job_id,
            key=bytes(req.job_key),
            rank=req.rank,
            alpha=float(req.alpha),
            target_modules=targets,
            relay_endpoint=ws.relay_endpoint,
            fallback_endpoints=tuple(ws.fallback_endpoints),
            streams=ws.streams or 4,
            checkpoint_store=ws.checkpoint_store,
            ledger=req.ledger,
        )

    def lora(self) -> ActorLoraConfig:
        return ActorLoraConfig(rank=self.rank, alpha=self.alpha, target_modules=list(self.target_modules))


class JobSlot:
    """One attached job (see the module docstring). ``actor`` is the service: identity, token, TLS, region."""

    def __init__(self, actor: Any, spec: JobSpec, host: AdapterHost, work_dir: Path) -> None:
        self.actor, self.spec, self.host = actor, spec, host
        engine: ActorEngine = actor.engine
        engine.adapters.add_job(spec.job_id)
        self.manager = WeightManager(
            host,
            JobEngine(engine, spec.job_id),
            work_dir,
            key=spec.key,
            job=spec.job_id,
            max_staged_versions=actor.cfg.max_staged_versions,
            gauge=False,  # the actor's version gauge is its own job's
        )
        from rollart.weights.checkpoint_store import open_store

        self.manager.adapter_store = self.manager.checkpoint_store = open_store(spec.checkpoint_store)
        self.ledger: LedgerAgent | None = None
        self.draining = False
        self._tasks: set[asyncio.Task] = set()
        self._orphaned: asyncio.Future | None = None

    @classmethod
    async def create(cls, actor: Any, spec: JobSpec, base: Any) -> JobSlot:
        """``base``: the served base's WeightSet (names and shapes) and its h(v0) come from the actor's own host."""
        own: AdapterHost = actor.host
        ws = await asyncio.to_thread(template, base, spec.lora(), own.base_hash)
        host = AdapterHost(
            ws, 0, None, settings=spec.lora(), base_hash=own.base_hash, base_model=own.base_model, pending=True
        )
        return cls(actor, spec, host, Path(actor.engine.work_dir) / "jobs" / spec.job_id)

    # -------------------------------------------------------------------------------------------- lifecycle

    def start(self) -> None:
        spec, actor = self.spec, self.actor
        if spec.relay_endpoint:
            self.manager.follow(
                subscriber_id=f"{actor.actor_id}/{spec.job_id}",
                token=actor.cfg.token(),
                sources=[spec.relay_endpoint, *spec.fallback_endpoints],
                streams=spec.streams,
                region=actor.cfg.region,
                tls=actor.cfg.tls,
                checkpoint_store=self.manager.checkpoint_store,
            )
        self._spawn(await_first_adapter(self.manager, self.host, self.spec.job_id))
        if spec.ledger:
            self.ledger = LedgerAgent(
                endpoint=spec.ledger,
                actor_id=actor.actor_id,
                actor=self,
                token=actor.cfg.token(),
                tls=actor.cfg.tls,
                heartbeat_seconds=actor.cfg.ledger_heartbeat_seconds,
            )
            self.ledger.start()
            self._spawn(self._watch_ledger(actor.cfg.attached_job_orphan_seconds))

    async def stop(self) -> None:
        for t in list(self._tasks):
            t.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        with contextlib.suppress(Exception):
            await self.manager.unfollow()
        if self.ledger is not None:
            await self.ledger.stop("detached")
        await self.actor.engine.adapters.drop_job(self.spec.job_id)

    async def _watch_ledger(self, orphan_after: float) -> None:
        """Detach the job once its ledger has not answered for ``orphan_after`` seconds (its run is gone)."""
        assert self.ledger is not None
        while time.monotonic() - self.ledger.answered_at <= orphan_after:
            await asyncio.sleep(min(orphan_after / 4, 5.0))
        log.warning("job %s: its ledger has not answered for %.0fs; detaching it", self.spec.job_id, orphan_after)
        # Not one of this slot's tasks: stop() cancels those, and this detach is what calls stop().
        self._orphaned = asyncio.ensure_future(detach(self.actor, actor_pb2.DetachJobRequest(job_id=self.spec.job_id)))

    def _spawn(self, coro: Any) -> None:
        task = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    # ------------------------------------------------------------------------------ state and commands

    def weight_state(self) -> common_pb2.ActorWeightState:
        engine = self.actor.engine
        st = common_pb2.ActorWeightState(
            loaded=engine.ready and not self.host.pending,
            active_version=self.host.version,
            active_hash=self.host.hash or b"",
            staged=self.manager.staged(),
        )
        if self.manager.updating_to is not None:
            st.updating, st.updating_to = True, self.manager.updating_to
        last = self.manager.last_update
        if last is not None:
            st.last_update_at.CopyFrom(last.completed_at)
            st.last_pause.CopyFrom(last.pause_window)
        return st

    def ledger_actor(self) -> ledger_pb2.LedgerActor:
        out = self.actor.ledger_actor()
        out.weights.CopyFrom(self.weight_state())
        return out

    def report(self) -> ActorReport:
        engine = self.actor.engine
        mine = [t for t in engine.tracks.values() if t.job == self.spec.job_id]
        return ActorReport(
            weights=self.weight_state(),
            generated_tokens=engine.generated_total,
            in_flight_requests=sum(1 for t in mine if not t.finished),
            draining=self.draining or self.actor.draining,
        )

    async def commit(self, order: common_pb2.CommitOrder) -> str:
        outcome, _ = await self.manager.commit(order)
        return "" if outcome.error is None else f"{outcome.error.code}: {outcome.error}"

    async def cancel_leases(self, trajectory_ids: Sequence[str]) -> str:
        await self.actor.engine.abort((), trajectory_ids)
        return ""

    async def set_draining(self, draining: bool) -> str:
        self.draining = draining
        return ""

    async def switch_relay(self, endpoint: str) -> str:
        await self.manager.unfollow()
        if endpoint:
            actor = self.actor
            try:
                self.manager.follow(
                    subscriber_id=f"{actor.actor_id}/{self.spec.job_id}",
                    token=actor.cfg.token(),
                    sources=[endpoint, *self.spec.fallback_endpoints],
                    streams=self.spec.streams,
                    region=actor.cfg.region,
                    tls=actor.cfg.tls,
                    checkpoint_store=self.manager.checkpoint_store,
                )
            except WeightError as exc:
                return str(exc)
        return ""


# ----------------------------------------------------------------------------------- the servicer's RPCs


async def attach(actor: Any, req: actor_pb2.AttachJobRequest) -> actor_pb2.AttachJobResponse:
    """AttachJob on ``actor`` (the servicer): see actor.proto."""
    if actor.cfg.lora is None or not isinstance(actor.host, AdapterHost):
        raise WeightError("FAILED_PRECONDITION", "a full-weight actor serves its own job only (model.lora not set)")
    if req.job_id == actor.cfg.job_id:
        raise WeightError("ALREADY_EXISTS", f"job {req.job_id!r} is this actor's own job")
    spec = JobSpec.from_request(req, actor.cfg.lora.target_modules)
    slot = actor.jobs.get(spec.job_id)
    if slot is not None:
        if slot.spec != spec:
            raise WeightError("ALREADY_EXISTS", f"job {spec.job_id!r} is attached with other settings: detach it first")
        return actor_pb2.AttachJobResponse(weights=slot.weight_state(), attached=False)
    jobs = len(actor.jobs) + 2  # with the own job and this one
    if jobs > actor.cfg.lora.max_loras:  # each job's active version must fit one batch (requests in flight on an
        # older version wait for a free adapter slot in vLLM's scheduler: slower, not wrong)
        raise WeightError(
            "FAILED_PRECONDITION",
            f"{jobs} jobs need {jobs} adapters in one batch; the engine holds {actor.cfg.lora.max_loras} "
            "(the actor's lora.max_loras)",
        )
    from .host_weights import load_weight_files

    base, _ = await asyncio.to_thread(load_weight_files, str(actor.cfg.model))
    slot = await JobSlot.create(actor, spec, base)
    actor.jobs[spec.job_id] = slot
    slot.start()
    log.info("job %s attached (rank %d, store %s)", spec.job_id, spec.rank, spec.checkpoint_store)
    return actor_pb2.AttachJobResponse(weights=slot.weight_state(), attached=True)


async def detach(actor: Any, req: actor_pb2.DetachJobRequest) -> actor_pb2.DetachJobResponse:
    if req.job_id and req.job_id == actor.cfg.job_id:
        raise WeightError("INVALID_ARGUMENT", "the actor's own job cannot be detached")
    slot = actor.jobs.pop(req.job_id, None)
    if slot is None:
        return actor_pb2.DetachJobResponse(detached=False)
    await slot.stop()
    log.info("job %s detached", req.job_id)
    return actor_pb2.DetachJobResponse(detached=True)
