"""The actor's weights: the host copy, the staged versions, and the one owner of both (WeightManager).

The host copy is :class:`~rollart_actor.host_weights.HostWeights` (vLLM on CPU cannot hand its weights back). A
sparse delta is applied to that copy and the engine then reloads the *whole* tensors it touched (every member of
a fused group: q, k and v together; gate and up together).

One owner, one state machine. :class:`WeightManager` owns the actor's whole weight state:

- *active*: the host copy's version and ``h(v)`` (and the recent ``h(v)`` per version that chunks report);
  it changes only inside the manager, at the safe point where the engine took the new weights.
- *staged*: one :class:`~rollart.weights.staging.VersionStaging` (the state machine of staged versions:
  ARRIVING -> STAGED | REJECTED, documented there) fed by pushed segments (:meth:`WeightManager.stage_segment`),
  full weights (:meth:`WeightManager.stage_full`) and, when the actor follows a relay
  (:meth:`WeightManager.follow`), a :class:`~rollart.weights.subscriber.DeltaSource` that stages pulled and
  fetched deltas into the same staging and hands the relay's commit orders to :meth:`WeightManager.commit`.
- *executed orders* (idempotency per ``order_id``), the last update and its error.

Transitions of the active version (all under ``lock``, one at a time):

- ``commit(order)`` for ``v``: ``v`` below the active version, or equal with the same (or no) ``h(v)``, is a
  no-op; equal with another ``h(v)`` is ``DATA_LOSS``. Otherwise the staged route active -> ``v`` (full
  weights first when staged, then deltas, each based on the version before it); when a link is missing
  and a relay is followed, the source first waits for deltas still arriving and fetches missed ones (and
  loads a checkpoint when the relay's cache no longer reaches back). No route: ``FAILED_PRECONDITION``,
  nothing changes. The route's ``h(v)`` must equal the order's (``DATA_LOSS``). Then the route is applied
  at one safe point: host copy first (undoable), engine second; if the engine refuses, the host copy is
  restored and the previous version stays active. Committed versions leave staging.
- ``load_full`` (a checkpoint or pulled buckets, optionally replaying staged deltas): replaces every
  weight at one safe point, with the same rollback.

Invariants: the active version only grows through commits (a full load may set any version); every
staged version is above it; a refused update leaves host copy, engine and staging as they were (a staged
version stays for a later commit).

No vLLM here: the engine is anything with ``update_weights(path, version, mode=..., after_load=...)``.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from prometheus_client import Counter, Gauge

from rollart.delta import Delta, WeightSet
from rollart.delta.errors import DeltaError
from rollart.runtime.timeutil import duration as _dur
from rollart.runtime.timeutil import timestamp as _ts
from rollart.v1 import actor_pb2, common_pb2
from rollart.weights.staging import ARTIFACT, Route, StagingError, VersionStaging, delta_error_code

from .host_weights import HostWeights, WeightError, open_checkpoint  # service.py and tests import them from here

if TYPE_CHECKING:
    from rollart.weights.subscriber import DeltaSource

log = logging.getLogger(__name__)

BUCKET_PULL_SECONDS = Counter(
    "rollart_actor_bucket_pull_seconds_total",
    "Mooncake bucket pulls applied: accumulated pull time, and the part an update waited for (exposed)",
    ["part"],
)
BUCKET_PULL_HIDDEN = Gauge(
    "rollart_actor_bucket_pull_hidden_ratio", "Fraction of the last applied bucket pull hidden behind rollout"
)
# The active version (the Grafana panel's per-actor version: the target's instance_name tells the actors apart).
WEIGHT_VERSION = Gauge("rollart_actor_weight_version", "Version of the weights the engine serves (the host copy's)")


# ---------------------------------------------------------------------------------------------------------
# full weights from Mooncake buckets


def pull_buckets(master: str, job: str, version: int, reader: Any = None) -> Any:
    """A version's full weights from the Mooncake store (``rollart.weights.buckets``: every bucket verified).

    ``reader``: a ``BucketReader`` to reuse (its connection); by default one is opened and closed here.
    """
    from rollart.weights.buckets import BucketError, BucketReader, MooncakeConfig

    own = reader is None
    try:
        if own:
            reader = BucketReader(MooncakeConfig(master=master), job)
        return reader.pull(version)
    except BucketError as exc:
        code = "UNAVAILABLE" if type(exc).__name__ == "MooncakeUnavailableError" else "FAILED_PRECONDITION"
        if type(exc).__name__ == "WeightsIntegrityError":
            code = "DATA_LOSS"
        raise WeightError(code, str(exc)) from None
    except ImportError as exc:
        raise WeightError("FAILED_PRECONDITION", f"Mooncake is not installed: {exc}") from None
    finally:
        if own and reader is not None:
            with contextlib.suppress(Exception):
                reader.close()


@dataclass
class BucketPull:
    """One version's pull from Mooncake, started in the background (or by the PullBuckets that needs it)."""

    version: int
    task: asyncio.Future  # -> PulledWeights; raises WeightError
    started: float  # time.monotonic()
    background: bool  # started before anyone asked for it (the watcher saw it published)
    seconds: float | None = None  # the whole pull (accumulated), once done


@dataclass(frozen=True)
class PullAccount:
    """Per full-weight update: how much of the pull the actor waited for (exposed) against all of it."""

    version: int
    accumulated_s: float  # the pull from start to verified weights, wherever it ran
    exposed_s: float  # the part the update waited for (PullBuckets arrived -> weights ready)
    swap_s: float  # the apply (the engine's pause window)
    background: bool

    @property
    def hidden(self) -> float:
        return min(1.0, max(0.0, 1.0 - self.exposed_s / self.accumulated_s)) if self.accumulated_s > 0 else 0.0


# ---------------------------------------------------------------------------------------------------------
# the owner


class UpdatingEngine(Protocol):
    version: int  # the active weights' version

    async def update_weights(
        self,
        payload: str,
        to_version: int,
        *,
        mode: str = ...,
        wait_timeout: float | None = ...,
        after_load: Callable[[], None] | None = ...,
    ) -> Any: ...


@dataclass
class Outcome:
    result: actor_pb2.WeightUpdateResult
    error: WeightError | None = None


class WeightManager:
    """The actor's one owner of weight state (active, staged, orders). See the module docstring."""

    def __init__(
        self,
        host: HostWeights,
        engine: UpdatingEngine,
        work_dir: Path,
        *,
        key: bytes | None,
        job: str,
        max_staged_versions: int = 8,
        commit_timeout: float = 60.0,
        gauge: bool = True,
    ) -> None:
        self.host = host
        self.staging = VersionStaging(key=key, job=job, max_versions=max_staged_versions, fits=host.check_delta)
        self.engine = engine
        self.work_dir = Path(work_dir)
        self.commit_timeout = commit_timeout  # how long a commit waits for a relay's deltas
        if gauge:  # the actor's own job (an attached job's manager leaves it alone)
            WEIGHT_VERSION.set_function(lambda: self.host.version)  # read at each scrape: never stale
        self.lock = asyncio.Lock()
        self.orders: collections.OrderedDict[str, Outcome] = collections.OrderedDict()
        self.last_update: actor_pb2.WeightUpdateResult | None = None
        self.last_error = ""
        self.updating_to: int | None = None
        self.source: DeltaSource | None = None
        self.checkpoint_store: Any = None  # with a relay: where a commit loads a checkpoint the relay no longer covers
        self.adapter_store: Any = None  # LoRA: where a pending actor loads its first adapter version
        self._n = 0
        self._inflight_orders: dict[str, asyncio.Task] = {}
        # Background bucket pulls (weight_sync buckets): the next version is pulled while rollout goes on.
        self.bucket_master: str | None = None
        self.background_pulls = True  # False: every pull starts when PullBuckets asks (the all-exposed baseline)
        self.bucket_pulls: dict[int, BucketPull] = {}
        self.pull_accounts: collections.deque[PullAccount] = collections.deque(maxlen=256)
        self._bucket_reader: Any = None
        self._bucket_watch: asyncio.Task | None = None
        # Every Mooncake call of this actor runs on this one thread (the client is not shared across threads).
        self._mooncake_thread: Any = None

    def _payload_path(self, version: int) -> Path:
        self._n += 1
        d = self.work_dir / "updates"
        d.mkdir(parents=True, exist_ok=True)
        return d / f"v{version}-{self._n}.safetensors"

    # ------------------------------------------------------------------------------------------- staging

    def stage_segment(self, msg: common_pb2.DeltaSegment, source: str = "push") -> bool:
        """Stage one pushed segment. True if new, False for a duplicate (or a version already active).

        Raises WeightError: INVALID_ARGUMENT for a bad segment, FAILED_PRECONDITION for a delta that cannot
        apply (a base neither active nor staged, tensors the model lacks); such a version is discarded.
        """
        try:
            return self.staging.stage_message(msg, self.host.version, source=source, pushed=True)
        except StagingError as exc:
            raise WeightError(exc.code, str(exc)) from None

    def stage_full(
        self, version: int, ws: WeightSet, hash_: bytes, *, artifact: str, source: str, parts: int, nbytes: int
    ) -> common_pb2.StagedWeights:
        """Stage verified full weights for a later commit (they must fit the served model)."""
        self.host.check_full(ws)
        e = self.staging.add_full(version, ws, hash_, artifact=artifact, source=source, parts=parts, nbytes=nbytes)
        return e.proto()

    def staged(self, version: int = 0) -> list[common_pb2.StagedWeights]:
        return self.staging.staged(version)

    def missing(self, version: int = 0) -> dict[int, list[int]]:
        return self.staging.missing(version)

    def replay_chain(self, from_version: int, to_version: int) -> list[Delta]:
        """The staged deltas from ``from_version`` to ``to_version`` (to replay after full weights)."""
        try:
            return self.staging.route(from_version, to_version).deltas
        except StagingError as exc:
            raise WeightError(exc.code, str(exc)) from None

    # ------------------------------------------------------------------------------------------- a relay

    def follow(
        self,
        *,
        subscriber_id: str,
        token: str | None,
        sources: list[str],
        streams: int = 4,
        region: str = "",
        tls: Any = None,
        checkpoint_store: Any = None,
    ) -> DeltaSource:
        """Follow a relay (and its fallbacks): its deltas stage here, its commit orders commit here."""
        from rollart.weights.subscriber import DeltaSource

        if self.staging.key is None:
            raise WeightError("FAILED_PRECONDITION", "a relay needs the job key (job_key) to verify deltas")
        source = DeltaSource(
            subscriber_id=subscriber_id,
            job=self.staging.job,
            key=self.staging.key,
            token=token,
            sources=sources,
            staging=self.staging,
            active=lambda: self.host.version,
            on_commit=self._commit_from_source,
            streams=streams,
            region=region,
            tls=tls,
        )
        self.source, self.checkpoint_store = source, checkpoint_store
        source.start()
        return source

    async def unfollow(self) -> None:
        """Stop following the relay (staged versions stay)."""
        source, self.source, self.checkpoint_store = self.source, None, None
        if source is not None:
            await source.stop()

    async def _commit_from_source(self, order: common_pb2.CommitOrder) -> None:
        outcome, _ = await self.commit(order)
        if outcome.error is not None:
            raise outcome.error  # the follower logs it; last_error has it

    # -------------------------------------------------------------------------------------------- commit

    async def commit(self, order: common_pb2.CommitOrder, mode: str = "keep") -> tuple[Outcome, bool]:
        """Apply a Commit(v) order. Returns (outcome, duplicate). Idempotent per order_id."""
        oid = order.order_id
        if oid and oid in self.orders:
            return self.orders[oid], True
        if oid and oid in self._inflight_orders:  # the same order twice at once: wait for the first
            return await asyncio.shield(self._inflight_orders[oid]), True
        task = asyncio.ensure_future(self._commit(order, mode))
        if oid:
            self._inflight_orders[oid] = task
        try:
            outcome = await asyncio.shield(task)
        finally:
            self._inflight_orders.pop(oid, None)
        if oid and outcome.error is None:
            self.orders[oid] = outcome
            while len(self.orders) > 1024:
                self.orders.popitem(last=False)
        return outcome, False

    async def _commit(self, order: common_pb2.CommitOrder, mode: str) -> Outcome:
        async with self.lock:
            v = order.version
            active = self.host.version
            if v <= active:
                if v == active and order.hash and self.host.hash and order.hash != self.host.hash:
                    return self._failed(
                        WeightError(
                            "DATA_LOSS",
                            f"v{v} is active with h(v) {self.host.hash.hex()[:16]}…, the order names "
                            f"{order.hash.hex()[:16]}…",
                        )
                    )
                res = actor_pb2.WeightUpdateResult(
                    from_version=active, to_version=active, hash=self.host.hash, applied=False
                )
                return Outcome(res)
            if self.host.pending and (self.checkpoint_store or self.adapter_store) is not None:
                # LoRA, no adapter loaded yet (the actor started before its job): the newest full set first.
                try:
                    active = await self._load_checkpoint(v, self.checkpoint_store or self.adapter_store)
                except WeightError as exc:
                    return self._failed(exc)
                if active >= v:
                    assert self.last_update is not None
                    return Outcome(self.last_update)
            try:
                route = await self._route(active, v)
            except WeightError as exc:
                return self._failed(exc)
            if self.host.version >= v:  # a checkpoint of v itself was loaded on the way
                assert self.last_update is not None
                return Outcome(self.last_update)
            final_hash = route.hash
            if order.hash and final_hash and order.hash != final_hash:
                return self._failed(
                    WeightError(
                        "DATA_LOSS",
                        f"the staged v{v} hashes to {final_hash.hex()[:16]}…, the order names {order.hash.hex()[:16]}…"
                        f"; v{active} stays active",
                    )
                )
            try:
                res = await self._apply(route, mode)
            except WeightError as exc:
                return self._failed(exc)
            self.staging.prune(v)
            return Outcome(res)

    async def _route(self, active: int, target: int) -> Route:
        """The staged route active -> target; with a relay followed, gathered from it first. Under the lock."""
        try:
            return self.staging.route(active, target)
        except StagingError as exc:
            if self.source is None:
                raise WeightError(exc.code, str(exc)) from None
        deadline = time.monotonic() + self.commit_timeout
        try:
            await self.source.gather(active, target, deadline)
        except StagingError as exc:
            if not (exc.out_of_range and exc.at == active and self.checkpoint_store is not None):
                raise WeightError(exc.code, str(exc)) from None
            # The relay's cache no longer reaches back to the active version: the newest checkpoint first.
            loaded = await self._load_checkpoint(target)
            if loaded <= active:
                raise WeightError(exc.code, str(exc)) from None
            active = loaded
            if active < target:
                try:
                    await self.source.gather(active, target, deadline)
                except StagingError as again:
                    raise WeightError(again.code, str(again)) from None
        try:
            return self.staging.route(active, target)
        except StagingError as exc:
            raise WeightError(exc.code, str(exc)) from None

    async def _load_checkpoint(self, at_most: int, store: Any = None) -> int:
        store = store if store is not None else self.checkpoint_store
        info = await asyncio.to_thread(store.latest, at_most)
        if info is None:
            raise WeightError("FAILED_PRECONDITION", f"the checkpoint store holds no checkpoint <= {at_most}")
        ws = await asyncio.to_thread(store.open, info.version, writable=True)
        await self._load_full(ws, info.version, artifact="checkpoint")
        log.info("loaded checkpoint v%d (%d bytes) to catch up", info.version, info.size)
        return info.version

    def _failed(self, exc: WeightError) -> Outcome:
        self.last_error = str(exc)
        log.warning("weight update refused (%s): %s", exc.code, exc)
        return Outcome(actor_pb2.WeightUpdateResult(), exc)

    async def _apply(self, route: Route, mode: str) -> actor_pb2.WeightUpdateResult:
        """Host copy first (undoable), then the engine at a safe point; the host is restored if the engine
        refuses."""
        full, deltas, to_version, final_hash = route.full, route.deltas, route.to_version, route.hash
        from_version = self.host.version
        self.updating_to = to_version
        try:
            old_ws = None
            if full is not None:
                assert full.full is not None
                self.host.check_full(full.full)
                old_ws = self.host.ws
                full.full.version, full.full.applied_hash = full.version, full.full_hash or None
                self.host.ws = full.full
            try:
                t0 = time.perf_counter()
                touched, entries, undo = await asyncio.to_thread(self.host.apply_chain, deltas)
            except DeltaError as exc:
                if old_ws is not None:
                    self.host.ws = old_ws
                raise WeightError(delta_error_code(exc), f"applying the staged deltas failed: {exc}") from None
            if full is None and not touched:
                # An empty delta (no weight changed: e.g. a training step whose groups all had equal rewards)
                # only switches the version: nothing to reload, no KV cache to recompute. (rollart-trainer)
                from .engine import UpdateStats

                self.host.set_version(to_version, final_hash or None)
                self.engine.version = to_version
                now = time.time()
                stats = UpdateStats(from_version, to_version, 0, 0, False, 0.0, 0.0, 0, {"tensors": 0}, now)
                return self._result(stats, from_version, to_version, "delta", len(deltas), 0, entries, 0)
            adapter = self.host.writes_adapter  # LoRA: the version's peft folder, kept while requests use it
            path = self.host.adapter_dir(self.work_dir, to_version) if adapter else self._payload_path(to_version)
            nbytes = await asyncio.to_thread(self.host.write, path, None if full is not None else touched)
            prep_s = time.perf_counter() - t0

            def committed() -> None:
                self.host.set_version(to_version, final_hash or None)

            try:
                stats = await self.engine.update_weights(str(path), to_version, mode=mode, after_load=committed)
            except BaseException as exc:
                undo()
                if old_ws is not None:
                    self.host.ws = old_ws
                if adapter:
                    shutil.rmtree(path, ignore_errors=True)
                if isinstance(exc, WeightError):
                    raise
                code = getattr(exc, "code", "INTERNAL")
                raise WeightError(code, str(exc)) from None
            finally:
                if not adapter:
                    path.unlink(missing_ok=True)
        finally:
            self.updating_to = None
        artifact = full.artifact if full is not None else "delta"
        res = self._result(
            stats, from_version, to_version, artifact, len(deltas), stats.rpc.get("tensors", 0), entries, nbytes
        )
        log.info(
            "v%d active (from v%d): %d deltas, %d entries, host prep %.3f s",
            to_version,
            from_version,
            len(deltas),
            entries,
            prep_s,
        )
        return res

    def _result(
        self,
        stats: Any,
        from_version: int,
        to_version: int,
        artifact: str,
        deltas: int,
        tensors: int,
        entries: int,
        nbytes: int,
    ) -> actor_pb2.WeightUpdateResult:
        res = actor_pb2.WeightUpdateResult(
            from_version=from_version,
            to_version=to_version,
            hash=self.host.hash,
            artifact=ARTIFACT[artifact],
            applied=True,
            deltas_applied=deltas,
            tensors_updated=int(tensors),
            entries_applied=int(entries),
            bytes_loaded=int(nbytes),
            requests_recomputed=stats.requests_recomputed,
            recomputed_tokens=stats.recomputed_tokens,
            prefix_cache_reset=stats.prefix_cache_reset,
        )
        res.pause_window.CopyFrom(_dur(stats.pause_window_s))
        res.load_time.CopyFrom(_dur(stats.load_s))
        res.completed_at.CopyFrom(_ts(stats.completed_at))
        self.last_update = res
        self.last_error = ""
        return res

    # -------------------------------------------------------------------------------------- full weights

    # -------------------------------------------------------------------------------------- full weights

    async def load_checkpoint(
        self, uri: str, version: int, *, hash_: bytes = b"", replay_to: int = 0, mode: str = "keep"
    ) -> actor_pb2.WeightUpdateResult:
        """LoadCheckpoint: full weights from a store or safetensors (hash-checked when ``hash_`` is given),
        optionally replaying staged deltas up to ``replay_to``."""
        try:
            ws, source = await asyncio.to_thread(open_checkpoint, uri, version)
            if hash_:
                if ws.applied_hash is None:
                    raise WeightError("FAILED_PRECONDITION", "the checkpoint records no hash to check against")
                if ws.applied_hash != hash_:
                    raise WeightError(
                        "DATA_LOSS", f"the checkpoint's h(v) {ws.applied_hash.hex()[:16]}… is not {hash_.hex()[:16]}…"
                    )
            replay = self.replay_chain(version, replay_to) if replay_to else []
            return await self.load_full(
                ws, version, artifact="checkpoint", source_path=source, replay=replay, mode=mode
            )
        except WeightError as exc:
            self.last_error = str(exc)
            raise

    # ------------------------------------------------------------------------------- background bucket pulls

    def _mooncake(self, fn: Callable[..., Any], *args: Any) -> asyncio.Future:
        if self._mooncake_thread is None:
            from concurrent.futures import ThreadPoolExecutor

            self._mooncake_thread = ThreadPoolExecutor(1, thread_name_prefix="mooncake")
        return asyncio.get_running_loop().run_in_executor(self._mooncake_thread, fn, *args)

    def _reader(self, master: str) -> Any:
        """The actor's one BucketReader (its Mooncake connection is reused across pulls and polls)."""
        if self._bucket_reader is None or self.bucket_master != master:
            from rollart.weights.buckets import BucketReader, MooncakeConfig

            if self._bucket_reader is not None:
                with contextlib.suppress(Exception):
                    self._bucket_reader.close()
            self._bucket_reader = BucketReader(MooncakeConfig(master=master), self.staging.job)
            self.bucket_master = master
        return self._bucket_reader

    def prefetch_buckets(self, master: str, version: int, *, background: bool = True) -> BucketPull:
        """Start pulling ``version`` now (no lock: generation goes on; only the later swap pauses it)."""
        pull = self.bucket_pulls.get(version)
        if pull is not None and not (pull.task.done() and (pull.task.cancelled() or pull.task.exception())):
            return pull
        t0 = time.monotonic()

        def run() -> Any:
            try:
                return pull_buckets(master, self.staging.job, version, self._reader(master))
            except ImportError as exc:
                raise WeightError("FAILED_PRECONDITION", f"Mooncake is not installed: {exc}") from None

        fut = self._mooncake(run)
        pull = BucketPull(version, fut, t0, background)

        def done(f: asyncio.Future) -> None:
            pull.seconds = time.monotonic() - t0
            if f.cancelled() or f.exception() is not None:
                log.info("bucket pull of v%d failed: %s", version, f.exception() if not f.cancelled() else "cancelled")

        fut.add_done_callback(done)
        self.bucket_pulls[version] = pull
        for v in [v for v in self.bucket_pulls if v <= self.host.version and v != version]:
            self.bucket_pulls.pop(v, None)  # superseded: the weights go with the record
        return pull

    def watch_buckets(self, master: str, interval: float = 0.25) -> None:
        """Follow the store's latest pointer and pull each new version above the active one in the
        background (at most one pull at a time; the newest wins)."""
        if self._bucket_watch is not None and not self._bucket_watch.done() and self.bucket_master == master:
            return
        if self._bucket_watch is not None:
            self._bucket_watch.cancel()
        self._bucket_watch = asyncio.ensure_future(self._watch_buckets(master, interval))

    async def _watch_buckets(self, master: str, interval: float) -> None:
        while True:
            try:
                latest = await self._mooncake(lambda: self._reader(master).latest())
                busy = any(not p.task.done() for p in self.bucket_pulls.values())
                if latest is not None and latest.version > self.host.version and not busy:
                    if latest.version not in self.bucket_pulls:
                        self.prefetch_buckets(master, latest.version)
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # noqa: BLE001 - a store hiccup: the next poll retries
                log.debug("bucket watch: %s", exc)
            await asyncio.sleep(interval)

    async def stop_buckets(self) -> None:
        if self._bucket_watch is not None:
            self._bucket_watch.cancel()
            with contextlib.suppress(BaseException):
                await self._bucket_watch
        for p in self.bucket_pulls.values():
            with contextlib.suppress(BaseException):
                await p.task
        self.bucket_pulls.clear()
        if self._mooncake_thread is not None:
            reader = self._bucket_reader
            if reader is not None:
                with contextlib.suppress(Exception):
                    await self._mooncake(reader.close)
            self._mooncake_thread.shutdown(wait=False)
            self._mooncake_thread = None
            self._bucket_reader = None

    def pull_summary(self) -> dict[str, float]:
        """Totals over the recorded full-weight updates (also in each update's log line)."""
        acc = sum(a.accumulated_s for a in self.pull_accounts)
        exp = sum(a.exposed_s for a in self.pull_accounts)
        return {
            "updates": float(len(self.pull_accounts)),
            "accumulated_s": acc,
            "exposed_s": exp,
            "hidden_fraction": 1.0 - exp / acc if acc > 0 else 0.0,
        }

    async def pull_buckets(
        self,
        master: str,
        version: int,
        *,
        hash_: bytes = b"",
        bucket_keys: list[str] | None = None,
        apply: bool = False,
        mode: str = "keep",
    ) -> actor_pb2.PullBucketsResponse:
        """PullBuckets: a version's full weights from Mooncake, staged for a later commit or applied now.

        A pull already running or done in the background (the watcher saw ``version`` published) is used:
        the call waits only for what is left of it (exposed), and with ``apply`` the engine pauses only for
        the swap. The first call also starts the watcher, so the next versions are pulled during rollout.
        """
        t0 = time.monotonic()
        try:
            pull = self.prefetch_buckets(master, version, background=False)
            if self.background_pulls:
                self.watch_buckets(master)
            try:
                pulled = await asyncio.shield(pull.task)
            except WeightError:
                self.bucket_pulls.pop(version, None)
                raise
            exposed = time.monotonic() - t0
            accumulated = pull.seconds if pull.seconds is not None else exposed
            ws = pulled.weights
            keys = [b.key for b in pulled.manifest.buckets]
            if bucket_keys and sorted(bucket_keys) != sorted(keys):
                raise WeightError("FAILED_PRECONDITION", "the store's bucket keys differ from the requested ones")
            if hash_ and ws.applied_hash != hash_:
                raise WeightError("DATA_LOSS", f"the pulled v{version} does not match the requested h(v)")
            resp = actor_pb2.PullBucketsResponse(pull_time=_dur(accumulated))
            if apply:
                resp.applied.CopyFrom(await self.load_full(ws, version, artifact="buckets", mode=mode))
                swap = resp.applied.pause_window.ToTimedelta().total_seconds()
                self._account(PullAccount(version, accumulated, exposed, swap, pull.background))
            else:
                resp.staged.CopyFrom(
                    self.stage_full(
                        version,
                        ws,
                        ws.applied_hash or b"",
                        artifact="buckets",
                        source="mooncake",
                        parts=len(keys),
                        nbytes=pulled.nbytes,
                    )
                )
            self.bucket_pulls.pop(version, None)
            return resp
        except WeightError as exc:
            self.last_error = str(exc)
            raise

    def _account(self, a: PullAccount) -> None:
        self.pull_accounts.append(a)
        BUCKET_PULL_SECONDS.labels("accumulated").inc(a.accumulated_s)
        BUCKET_PULL_SECONDS.labels("exposed").inc(a.exposed_s)
        BUCKET_PULL_HIDDEN.set(a.hidden)
        log.info(
            "buckets v%d: pull %.3fs, exposed %.3fs (%.0f%% hidden%s), swap %.3fs",
            a.version,
            a.accumulated_s,
            a.exposed_s,
            100 * a.hidden,
            ", background" if a.background else "",
            a.swap_s,
        )

    async def load_full(
        self,
        ws: WeightSet,
        version: int,
        *,
        artifact: str,
        source_path: Path | None = None,
        replay: list[Delta] | None = None,
        mode: str = "keep",
    ) -> actor_pb2.WeightUpdateResult:
        """Replace all weights (a checkpoint or pulled buckets), optionally replaying deltas after them."""
        async with self.lock:
            return await self._load_full(
                ws, version, artifact=artifact, source_path=source_path, replay=replay, mode=mode
            )

    async def _load_full(
        self,
        ws: WeightSet,
        version: int,
        *,
        artifact: str,
        source_path: Path | None = None,
        replay: list[Delta] | None = None,
        mode: str = "keep",
    ) -> actor_pb2.WeightUpdateResult:
        self.host.check_full(ws)
        from_version = self.host.version
        self.updating_to = replay[-1].version if replay else version
        old_ws = self.host.ws
        ws.version = version
        new = self.host.like(ws, version, ws.applied_hash)
        entries = 0
        try:
            if replay:
                try:
                    _, entries, _ = await asyncio.to_thread(new.apply_chain, replay)
                except DeltaError as exc:
                    raise WeightError(delta_error_code(exc), f"replaying deltas failed: {exc}") from None
            to_version = new.version
            to_hash = new.hash or None
            if new.writes_adapter:  # LoRA: the version's peft folder (removed by the engine once unused)
                path, cleanup = new.adapter_dir(self.work_dir, to_version), False
                nbytes = await asyncio.to_thread(new.write, path)
            elif source_path is not None and not replay:
                path, cleanup = source_path, False
                nbytes = int(sum(a.nbytes for a in ws.arrays.values()))
            else:
                path, cleanup = self._payload_path(to_version), True
                nbytes = await asyncio.to_thread(new.write, path)

            def committed() -> None:
                self.host.ws = new.ws
                self.host.pm = new.pm
                self.host.pending = False
                self.host.set_version(to_version, to_hash)

            try:
                stats = await self.engine.update_weights(str(path), to_version, mode=mode, after_load=committed)
            except BaseException as exc:
                self.host.ws = old_ws
                if isinstance(exc, WeightError):
                    raise
                raise WeightError(getattr(exc, "code", "INTERNAL"), str(exc)) from None
            finally:
                if cleanup:
                    path.unlink(missing_ok=True)
        finally:
            self.updating_to = None
        self.staging.prune(to_version)
        return self._result(
            stats,
            from_version,
            to_version,
            artifact,
            len(replay or []),
            stats.rpc.get("tensors", 0),
            entries,
            nbytes,
        )
