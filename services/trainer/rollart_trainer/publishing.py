"""Publishing the job's versions: the weight-plane publisher (deltas to the relays, full checkpoints, buckets)
and the ledger's registration of each version. Publishing version ``v`` again after a restart is a no-op iff it
is the same weights: no version number ever names two different weights (docs/trainer.md, "Restarts")."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import grpc
from grpc import aio

from rollart.delta import WeightSet
from rollart.job.spec import weights_digest
from rollart.runtime.telemetry import log_fields
from rollart.runtime.timeutil import duration as _dur
from rollart.runtime.timeutil import timestamp as _ts
from rollart.v1 import common_pb2, ledger_pb2, ledger_pb2_grpc, trainer_pb2

from .config import TrainerConfig
from .jobspec import BUCKETS, DELTA, FULL, JobError

log = logging.getLogger(__name__)

T = trainer_pb2


class Publication:
    """The job's publisher and the versions it published; ``emit`` receives each PublishedVersion event and
    ``on_published(v)`` runs, before it, once ``v`` is registered."""

    def __init__(
        self, spec: T.TrainerJobSpec, emit: Callable[[T.TrainerEvent], None], on_published: Callable[[int], None]
    ) -> None:
        self.spec = spec
        self.emit = emit
        self.on_published = on_published
        self.publisher: Any = None  # rollart.weights.publisher.Publisher, once started
        self.ledger: ledger_pb2_grpc.LedgerStub | None = None
        self.published: list[T.PublishedVersion] = []
        self.weights: WeightSet | None = None  # bf16 weights of the newest published version
        self.last: tuple[float, float] | None = None  # wall times of the newest publication
        self.publishing: int | None = None  # the version being published
        self._task: asyncio.Task | None = None

    async def start(
        self,
        cfg: TrainerConfig,
        weight_sync: int,
        root: Path,
        ledger: ledger_pb2_grpc.LedgerStub,
        previous: WeightSet | None,
    ) -> None:
        """Start the publisher; ``previous`` (the newest published weights, after a restart) is the base of
        the next delta."""
        from rollart.weights.publisher import Publisher

        spec = self.spec
        pub = spec.publish
        self.ledger = ledger
        # Full-weight modes do not stream deltas (the delta is still encoded: its trailer hash is h(v)).
        relays = (list(pub.relay_endpoints) or list(cfg.relays)) if weight_sync == DELTA else []
        buckets = None
        if weight_sync == BUCKETS:
            buckets = pub.mooncake_master or cfg.mooncake_master
            if not buckets:
                raise JobError("INVALID_ARGUMENT", "weight_sync BUCKETS needs publish.mooncake_master")
        every = pub.checkpoint_every or 10
        if weight_sync == FULL:
            every = 1
        self.publisher = Publisher(
            job=spec.job_id,
            key=cfg.key() or b"",
            token=cfg.token(),
            relays=relays,
            relay_data_endpoints=cfg.relay_data_endpoints or None,
            streams=pub.streams or 4,
            checkpoint_store=pub.checkpoint_store or None,
            checkpoint_every=every,
            buckets=buckets,
            bucket_bytes=pub.bucket_bytes or (1 << 30),
            max_segment_bytes=pub.max_segment_bytes or (4 << 20),
            tls=cfg.tls,
            cache_dir=root / "delta-cache",
            data_listen=cfg.data_listen,
        )
        await self.publisher.start(previous=previous)
        if cfg.data_advertise:  # what actors falling back to the trainer dial (GetStatus.data_endpoint)
            self.publisher.hub.data_endpoint = cfg.data_advertise

    # -------------------------------------------------------------------------------- in the background

    def run_in_background(self, v: int, ws: WeightSet) -> None:
        self.publishing = v
        self._task = asyncio.ensure_future(self.publish(v, ws))

    async def wait(self) -> None:
        """Until the background publication is done; a failed publication raises (actors cannot get v)."""
        task = self._task
        if task is not None:
            self._task = None
            await task

    async def settle(self) -> None:
        """Let a background publication finish; its failure is the job's next step's concern."""
        if self._task is not None:
            with contextlib.suppress(Exception):
                await self._task

    async def stop(self) -> None:
        """Cancel a background publication and stop the publisher."""
        if self._task is not None and not self._task.done():
            self._task.cancel()
            with contextlib.suppress(BaseException):
                await self._task
        if self.publisher is not None:
            with contextlib.suppress(Exception):
                await self.publisher.stop()

    async def relay_commit(self, v: int, step: int) -> None:
        """Commit(v) through the relays: actors that are behind catch up from the relay cache."""
        if self.publisher is None or not self.publisher.relays:
            return
        with contextlib.suppress(Exception):
            await self.publisher.commit(v, order_id=f"{self.spec.job_id}-v{v}-relay", step=step)

    # ------------------------------------------------------------------------------------------ publish

    async def publish(self, v: int, ws: WeightSet) -> None:
        """Publish ``ws`` as version ``v`` and register it with the ledger (idempotent after a restart)."""
        assert self.publisher is not None
        pv = T.PublishedVersion(step=v, state=T.PUBLISH_STATE_PUBLISHING)
        pv.started_at.CopyFrom(_ts())
        self.publishing = v
        t0 = time.perf_counter()
        wall0 = time.time()
        try:
            if self.publisher.version is not None and self.publisher.version >= v:
                raise JobError("INTERNAL", f"v{v} is not newer than the publisher's v{self.publisher.version}")
            res = await self.publisher.publish(v, ws)
            h = getattr(res, "weights_hash", None) or res.hash
            if h is None:
                h = await asyncio.to_thread(weights_digest, ws.arrays, ws.dtypes)
            version = common_pb2.PolicyVersion(
                version=v,
                base_version=v - 1 if v > 0 else -1,
                hash=h,
                delta_bytes=res.delta_bytes,
                delta_entries=res.entries,
                bucket_keys=res.buckets,
            )
            if res.hash is not None:
                version.delta_uri = f"relay://{self.spec.job_id}/v{v}"
            if res.checkpoint is not None:
                version.checkpoint_uri = str(getattr(res.checkpoint, "location", "") or "")
                version.checkpoint_bytes = int(getattr(res.checkpoint, "size", 0) or 0)
            await self.register(version)
        except BaseException as exc:
            pv.state = T.PUBLISH_STATE_FAILED
            pv.error = str(exc) or type(exc).__name__
            self.published.append(pv)
            self.emit(T.TrainerEvent(at=_ts(), version_published=pv))
            raise
        finally:
            self.publishing = None
        pv.version.CopyFrom(version)
        pv.state = T.PUBLISH_STATE_PUBLISHED
        pv.full_checkpoint = res.checkpoint is not None
        pv.extract_time.CopyFrom(_dur(res.encode_seconds))
        pv.stream_time.CopyFrom(_dur(res.relay_seconds))
        pv.checkpoint_time.CopyFrom(_dur(res.checkpoint_seconds))
        pv.relays.extend(r.endpoint for r in res.relays if r.ok)
        pv.egress_bytes = res.egress_bytes
        pv.published_at.CopyFrom(_ts())
        self.published.append(pv)
        # Saved with the next training checkpoint: version, h(v) and job go into its metadata, so a restarted
        # trainer's next delta names the right base.
        ws.version, ws.applied_hash = v, h
        ws.metadata["rollart.job"] = self.spec.job_id
        self.weights = ws
        self.last = (wall0, time.time())
        self.on_published(v)
        failed = {r.endpoint: r.error for r in res.relays if not r.ok}
        if failed:
            log.warning("v%d did not reach relays %s (their actors fall back)", v, failed)
        log.info(
            "version published",
            extra=log_fields(
                version=v, hash=h.hex()[:16], delta_bytes=res.delta_bytes, seconds=round(time.perf_counter() - t0, 3)
            ),
        )
        self.emit(T.TrainerEvent(at=_ts(), version_published=pv))

    async def register(self, version: common_pb2.PolicyVersion) -> None:
        assert self.ledger is not None
        try:
            await self.ledger.RegisterVersion(ledger_pb2.RegisterVersionRequest(version=version))
        except aio.AioRpcError as exc:
            if exc.code() != grpc.StatusCode.FAILED_PRECONDITION:
                raise
            # Registered before (a republication after a restart): fine iff it is the same weights.
            stored = await self.ledger.GetVersion(ledger_pb2.GetVersionRequest(version=version.version))
            if stored.hash != version.hash:
                raise JobError(
                    "FAILED_PRECONDITION",
                    f"v{version.version} is registered with h(v) {stored.hash.hex()[:16]}…, these weights hash to "
                    f"{version.hash.hex()[:16]}…: {exc.details()}",
                ) from None

    def current_version(self, policy_version: int) -> T.CurrentVersionResponse:
        out = T.CurrentVersionResponse(policy_version=policy_version, publishing=self.publishing is not None)
        done = [p for p in self.published if p.state == T.PUBLISH_STATE_PUBLISHED]
        if done:
            out.latest_published.CopyFrom(done[-1].version)
        return out
