"""The actor's weights: its own host copy, staging of pushed deltas and pulled full weights, and commits.

vLLM on CPU prepacks every linear layer and cannot hand its weights back, so the actor keeps the served
weights itself (:class:`HostWeights`, numpy, bf16 as uint16 bit patterns, memory-mapped copy-on-write from
the checkpoint). A sparse delta is applied to that copy and the engine then reloads the *whole* tensors it
touched (every member of a fused group: q, k and v together; gate and up together).

:class:`Staging` holds versions that arrived but are not active: deltas pushed segment by segment
(``StageDelta``; each segment verified on arrival, the whole delta once its trailer and last segment are
in) and full weights (Mooncake buckets). :class:`WeightManager` turns a ``Commit(v)`` into the chain from
the active version to ``v``, checks it against ``h(v)`` and applies it at one safe point; a refused update
leaves the host copy and the engine on the previous version.

No vLLM here: the engine is anything with ``update_weights(path, version, mode=..., after_load=...)``.
"""

from __future__ import annotations

import asyncio
import collections
import logging
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from rollart.delta import Delta, DeltaStager, ParamMap, WeightSet, apply_delta, load_safetensors, save_safetensors
from rollart.delta import segment as sg
from rollart.delta.errors import BaseMismatchError, DeltaError, IncompatibleTargetError
from rollart.v1 import actor_pb2, common_pb2

log = logging.getLogger(__name__)

ARTIFACT = {
    "delta": common_pb2.WEIGHT_ARTIFACT_DELTA,
    "buckets": common_pb2.WEIGHT_ARTIFACT_BUCKETS,
    "checkpoint": common_pb2.WEIGHT_ARTIFACT_CHECKPOINT,
}


class WeightError(Exception):
    """A weight operation was refused; ``code`` is the gRPC status name. Nothing was changed."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code


def _ts(seconds: float) -> Any:
    from google.protobuf.timestamp_pb2 import Timestamp

    t = Timestamp()
    t.FromNanoseconds(int(seconds * 1e9))
    return t


def _dur(seconds: float) -> Any:
    from google.protobuf.duration_pb2 import Duration

    d = Duration()
    d.FromNanoseconds(int(max(seconds, 0.0) * 1e9))
    return d


# ---------------------------------------------------------------------------------------------------------
# host copy


def load_weight_files(path: str | Path) -> tuple[WeightSet, list[Path]]:
    """Every tensor of a .safetensors file or of a folder's *.safetensors files (copy-on-write mappings)."""
    p = Path(path)
    if p.is_dir():
        files = sorted(p.glob("*.safetensors"))
        if not files:
            raise WeightError("FAILED_PRECONDITION", f"no .safetensors files in {p}")
    elif p.is_file():
        files = [p]
    else:
        raise WeightError("NOT_FOUND", f"no weights at {p}")
    arrays: dict[str, np.ndarray] = {}
    dtypes: dict[str, str] = {}
    meta: dict[str, str] = {}
    version = applied = None
    for f in files:
        try:
            ws = load_safetensors(f, writable=True)
        except DeltaError as exc:
            raise WeightError("FAILED_PRECONDITION", f"{f}: {exc}") from None
        dup = set(arrays) & set(ws.arrays)
        if dup:
            raise WeightError("FAILED_PRECONDITION", f"{f}: tensors also in another file: {sorted(dup)[:4]}")
        arrays.update(ws.arrays)
        dtypes.update(ws.dtypes)
        meta.update(ws.metadata)
        version = ws.version if ws.version is not None else version
        applied = ws.applied_hash or applied
    return WeightSet(arrays, dtypes, version, applied, meta), files


class HostWeights:
    """The served weights as numpy arrays (HF names), with the active version and h(v)."""

    # How many recently active versions keep their h(v): enough for any request in flight to have
    # started on one of them (requests cross a handful of versions at most).
    HISTORY = 64

    def __init__(self, ws: WeightSet, version: int, hash_: bytes | None) -> None:
        self.ws = ws
        self.pm = ParamMap.from_weights(ws)
        # version -> h(v) of the weights this actor had active under that version (the chunk's
        # version_hashes come from here, not from the ledger, so settlement can catch wrong weights).
        self.history: collections.OrderedDict[int, bytes] = collections.OrderedDict()
        self.set_version(version, hash_)

    @classmethod
    def load(cls, path: str | Path, version: int, hash_: bytes | None = None) -> HostWeights:
        ws, _ = load_weight_files(path)
        return cls(ws, version, hash_ if hash_ is not None else ws.applied_hash)

    @property
    def version(self) -> int:
        assert self.ws.version is not None
        return self.ws.version

    @property
    def hash(self) -> bytes:
        return self.ws.applied_hash or b""

    def set_version(self, version: int, hash_: bytes | None) -> None:
        self.ws.version = version
        self.ws.applied_hash = hash_
        # The latest activation of a version decides its hash; an unknown hash forgets an older one
        # rather than vouching for weights that are no longer what ran.
        self.history.pop(version, None)
        if hash_:
            self.history[version] = hash_
            while len(self.history) > self.HISTORY:
                self.history.popitem(last=False)

    def hashes_for(self, versions: Iterable[int]) -> dict[int, bytes]:
        """h(v) of each of ``versions`` this actor had active with a known hash (unknown ones omitted)."""
        return {v: self.history[v] for v in set(versions) if v in self.history}

    def check_delta(self, delta: Delta) -> None:
        """Every tensor of the delta exists here with its dtype and shape (IncompatibleTargetError if not)."""
        for td in delta.tensors.values():
            et = self.pm.engine(td.name)
            if et.dtype != td.dtype or tuple(et.shape) != tuple(td.shape):
                raise IncompatibleTargetError(
                    f"{td.name}: delta has {td.dtype}{list(td.shape)}, the served model {et.dtype}{list(et.shape)}"
                )

    def check_full(self, ws: WeightSet) -> None:
        """Full weights must have exactly the served tensors, dtypes and shapes."""
        mine = {n: (self.ws.dtypes[n], tuple(a.shape)) for n, a in self.ws.arrays.items()}
        theirs = {n: (ws.dtypes[n], tuple(a.shape)) for n, a in ws.arrays.items()}
        if mine != theirs:
            missing = sorted(set(mine) - set(theirs))[:4]
            extra = sorted(set(theirs) - set(mine))[:4]
            differ = sorted(n for n in set(mine) & set(theirs) if mine[n] != theirs[n])[:4]
            raise WeightError(
                "FAILED_PRECONDITION",
                f"the weights do not fit the served model (missing {missing}, extra {extra}, differ {differ})",
            )

    def apply_chain(self, deltas: list[Delta]) -> tuple[list[str], int, Callable[[], None]]:
        """Apply deltas in order to the host copy. Returns (engine tensors touched, entries, undo).

        All or nothing: the touched tensors are copied first and restored if any delta fails.
        """
        touched: list[str] = []
        seen: set[str] = set()
        for d in deltas:
            for name in d.tensors:
                if name not in seen:
                    seen.add(name)
                    touched.append(name)
        hf = [h for name in touched for h in self.pm.to_hf(name)]
        backup = {h: self.ws.arrays[h].copy() for h in hf}
        old = (self.ws.version, self.ws.applied_hash)

        def undo() -> None:
            for h, a in backup.items():
                self.ws.arrays[h][...] = a
            self.ws.version, self.ws.applied_hash = old

        entries = 0
        try:
            for d in deltas:
                apply_delta(d, self.ws, self.pm)
                entries += d.total_entries
        except BaseException:
            undo()
            raise
        return touched, entries, undo

    def write(self, path: Path, engine_names: list[str] | None = None) -> int:
        """Write the given engine tensors (all their HF members) or everything; returns bytes written."""
        if engine_names is None:
            names = list(self.ws.arrays)
        else:
            names = [h for n in engine_names for h in self.pm.to_hf(n)]
        arrays = {n: self.ws.arrays[n] for n in names}
        save_safetensors(path, arrays, {n: self.ws.dtypes[n] for n in names})
        return int(sum(a.nbytes for a in arrays.values()))


# ---------------------------------------------------------------------------------------------------------
# staging


@dataclass
class StagedEntry:
    version: int
    base_version: int  # -1 for full weights
    artifact: str  # "delta" | "buckets" | "checkpoint"
    source: str
    started_at: float = field(default_factory=time.time)
    completed_at: float | None = None
    stager: DeltaStager | None = None
    seqs: set[int] = field(default_factory=set)
    bytes: int = 0
    parts_total: int = 0
    hash: bytes = b""
    delta: Delta | None = None
    full: WeightSet | None = None
    error: str = ""

    @property
    def ready(self) -> bool:
        return self.delta is not None or self.full is not None

    def proto(self) -> common_pb2.StagedWeights:
        msg = common_pb2.StagedWeights(
            version=self.version,
            base_version=self.base_version,
            artifact=ARTIFACT[self.artifact],
            hash=self.hash,
            parts_received=len(self.seqs) if self.artifact == "delta" else self.parts_total,
            parts_total=self.parts_total,
            bytes_received=self.bytes,
            complete=self.ready,
            verified=self.ready,
            source=self.source,
            error=self.error,
        )
        msg.started_at.CopyFrom(_ts(self.started_at))
        if self.completed_at is not None:
            msg.completed_at.CopyFrom(_ts(self.completed_at))
        return msg


def _delta_code(exc: DeltaError) -> str:
    # The actor's contract: a bad segment (checksum, HMAC, header, trailer) is INVALID_ARGUMENT; a delta
    # that does not fit the active weights (base, tensors) is FAILED_PRECONDITION.
    if isinstance(exc, BaseMismatchError | IncompatibleTargetError):
        return "FAILED_PRECONDITION"
    return "INVALID_ARGUMENT"


class Staging:
    """Versions staged on this actor: pushed deltas (verified per segment and whole) and full weights."""

    def __init__(self, *, key: bytes | None, job: str, max_versions: int = 8) -> None:
        self.key = key
        self.job = job
        self.max_versions = max_versions
        self.entries: dict[int, StagedEntry] = {}
        self.rejected: collections.OrderedDict[int, str] = collections.OrderedDict()

    def add_segment(self, msg: common_pb2.DeltaSegment, host: HostWeights, source: str = "push") -> bool:
        """Stage one segment. True if new, False for a duplicate (or a version already active).

        Raises WeightError: INVALID_ARGUMENT for a bad segment, FAILED_PRECONDITION for a delta that cannot
        apply (wrong base, tensors the model lacks). The bad version's staged data is discarded.
        """
        if self.key is None:
            raise WeightError("FAILED_PRECONDITION", "this actor has no job key: it cannot verify deltas")
        if not msg.data:
            raise WeightError("INVALID_ARGUMENT", "segment data is empty")
        try:
            seg = sg.parse(msg.data, self.key)
        except DeltaError as exc:
            raise WeightError("INVALID_ARGUMENT", f"segment {msg.sequence} of v{msg.version}: {exc}") from None
        fields = (msg.job_id, msg.version, msg.base_version, msg.sequence, msg.trailer)
        header = (seg.job, seg.version, seg.base_version, seg.seq, seg.is_trailer)
        if fields != header:
            raise WeightError(
                "INVALID_ARGUMENT",
                f"message fields (job, version, base, sequence, trailer) {fields} disagree with the header {header}",
            )
        if seg.job != self.job:
            raise WeightError("INVALID_ARGUMENT", f"segment belongs to job {seg.job!r}; this actor serves {self.job!r}")
        v = seg.version
        if v <= host.version:
            return False  # already active (or older): re-pushes are harmless
        e = self.entries.get(v)
        if e is not None and e.error:
            del self.entries[v]  # a failed version may be pushed again from scratch
            e = None
        if e is not None and e.artifact != "delta":
            return False  # full weights for v are staged already
        if e is None:
            base = seg.base_version
            based_ok = base == host.version or (base in self.entries and not self.entries[base].error)
            if not based_ok:
                why = (
                    f"delta v{v} is based on v{base}, but the active version is v{host.version} and v{base} "
                    "is not staged"
                )
                self._reject(v, why)
                raise WeightError("FAILED_PRECONDITION", why)
            self._make_room()
            e = StagedEntry(v, base, "delta", source, stager=DeltaStager(self.key, job=self.job, version=v))
            e.stager.base_version = base  # pinned: a segment with another base is a BaseMismatchError
            self.entries[v] = e
        if e.ready:
            return False
        if seg.seq in e.seqs:
            return False
        try:
            assert e.stager is not None
            e.stager.add(seg.raw)
            e.seqs.add(seg.seq)
            e.bytes += len(seg.raw)
            if seg.is_trailer:
                e.parts_total = seg.segment_count + 1
                e.hash = seg.hash
            if e.stager.complete:
                delta = e.stager.finish()
                host.check_delta(delta)
                e.delta, e.stager = delta, None
                e.hash = delta.hash
                e.completed_at = time.time()
                log.info(
                    "staged v%d (base v%d): %d segments, %d entries",
                    v,
                    e.base_version,
                    len(e.seqs),
                    delta.total_entries,
                )
        except DeltaError as exc:
            why = f"v{v} segment {seg.seq}: {type(exc).__name__}: {exc}"
            self._discard(e, why)
            raise WeightError(_delta_code(exc), why) from None
        return True

    def add_full(
        self, version: int, ws: WeightSet, hash_: bytes, *, artifact: str, source: str, parts: int, nbytes: int
    ) -> StagedEntry:
        self._make_room(version)
        e = StagedEntry(version, -1, artifact, source, parts_total=parts, bytes=nbytes, hash=hash_, full=ws)
        e.completed_at = time.time()
        self.entries[version] = e
        return e

    def _make_room(self, new: int | None = None) -> None:
        if new is not None and new in self.entries:
            return
        while len(self.entries) >= self.max_versions:
            victims = sorted((v for v, e in self.entries.items() if e.error or not e.ready)) or sorted(self.entries)
            dropped = victims[0]
            log.warning("staging full: dropping v%d", dropped)
            del self.entries[dropped]

    def _reject(self, version: int, why: str) -> None:
        self.rejected[version] = why
        while len(self.rejected) > 64:
            self.rejected.popitem(last=False)

    def _discard(self, e: StagedEntry, why: str) -> None:
        e.error = why
        e.stager = None
        e.delta = None
        e.full = None
        e.seqs.clear()
        e.bytes = 0
        e.completed_at = time.time()
        self._reject(e.version, why)
        log.warning("staging of v%d discarded: %s", e.version, why)

    def prune(self, active: int) -> None:
        for v in [v for v in self.entries if v <= active]:
            del self.entries[v]

    def plan(self, active: int, target: int) -> tuple[StagedEntry | None, list[Delta]]:
        """The staged route from ``active`` to ``target``: optional full weights, then deltas in order."""
        full = None
        fulls = [e for e in self.entries.values() if e.full is not None and active < e.version <= target]
        if fulls:
            full = max(fulls, key=lambda e: e.version)
        cur = full.version if full is not None else active
        deltas: list[Delta] = []
        while cur < target:
            nxt = [
                e
                for e in self.entries.values()
                if e.delta is not None and e.delta.base_version == cur and e.version <= target
            ]
            if not nxt:
                raise WeightError("FAILED_PRECONDITION", self._why_missing(cur, target))
            e = min(nxt, key=lambda e: e.version)
            assert e.delta is not None
            deltas.append(e.delta)
            cur = e.version
        return full, deltas

    def _why_missing(self, cur: int, target: int) -> str:
        arriving = [e for e in self.entries.values() if e.base_version == cur and not e.ready and not e.error]
        if arriving:
            e = arriving[0]
            total = f"{e.parts_total}" if e.parts_total else "?"
            return f"delta v{e.version} (based on v{cur}) is still arriving: {len(e.seqs)} of {total} segments"
        for v in range(cur + 1, target + 1):
            if v in self.rejected:
                return f"v{v} was rejected: {self.rejected[v]}"
        return f"no staged delta is based on v{cur} (needed to reach v{target})"

    def staged(self, version: int = 0) -> list[common_pb2.StagedWeights]:
        return [self.entries[v].proto() for v in sorted(self.entries) if version in (0, v)]

    def missing(self, version: int = 0) -> dict[int, list[int]]:
        out = {}
        for v, e in sorted(self.entries.items()):
            if version in (0, v) and e.stager is not None and e.parts_total and not e.ready:
                out[v] = e.stager.missing()
        return out


# ---------------------------------------------------------------------------------------------------------
# commits


class UpdatingEngine(Protocol):
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
    """Applies staged versions, checkpoints and buckets to the host copy and the engine, one at a time."""

    def __init__(self, host: HostWeights, staging: Staging, engine: UpdatingEngine, work_dir: Path) -> None:
        self.host = host
        self.staging = staging
        self.engine = engine
        self.work_dir = Path(work_dir)
        self.lock = asyncio.Lock()
        self.orders: collections.OrderedDict[str, Outcome] = collections.OrderedDict()
        self.last_update: actor_pb2.WeightUpdateResult | None = None
        self.last_error = ""
        self.updating_to: int | None = None
        self._n = 0
        self._inflight_orders: dict[str, asyncio.Task] = {}

    def _payload_path(self, version: int) -> Path:
        self._n += 1
        d = self.work_dir / "updates"
        d.mkdir(parents=True, exist_ok=True)
        return d / f"v{version}-{self._n}.safetensors"

    # -------------------------------------------------------------------------------------------- commit

    async def commit(self, order: common_pb2.CommitOrder, mode: str = "keep") -> tuple[Outcome, bool]:
        """Apply a Commit(v) order. Returns (outcome, duplicate). Idempotent per order_id."""
        oid = order.order_id
        if oid and oid in self.orders:
            return self.orders[oid], True
        if oid and oid in self._inflight_orders:  # the same order twice at once: wait for the first
            await asyncio.shield(self._inflight_orders[oid])
            return self.orders[oid], True
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
            try:
                full, deltas = self.staging.plan(active, v)
            except WeightError as exc:
                return self._failed(exc)
            final_hash = deltas[-1].hash if deltas else (full.hash if full is not None else b"")
            if order.hash and final_hash and order.hash != final_hash:
                return self._failed(
                    WeightError(
                        "DATA_LOSS",
                        f"the staged v{v} hashes to {final_hash.hex()[:16]}…, the order names {order.hash.hex()[:16]}…"
                        f"; v{active} stays active",
                    )
                )
            try:
                res = await self._apply(full, deltas, v, final_hash, mode)
            except WeightError as exc:
                return self._failed(exc)
            self.staging.prune(v)
            return Outcome(res)

    def _failed(self, exc: WeightError) -> Outcome:
        self.last_error = str(exc)
        log.warning("weight update refused (%s): %s", exc.code, exc)
        return Outcome(actor_pb2.WeightUpdateResult(), exc)

    async def _apply(
        self, full: StagedEntry | None, deltas: list[Delta], to_version: int, final_hash: bytes, mode: str
    ) -> actor_pb2.WeightUpdateResult:
        """Host copy first (undoable), then the engine at a safe point; the host is restored if the engine
        refuses."""
        from_version = self.host.version
        self.updating_to = to_version
        try:
            old_ws = None
            if full is not None:
                assert full.full is not None
                self.host.check_full(full.full)
                old_ws = self.host.ws
                full.full.version, full.full.applied_hash = full.version, full.hash or None
                self.host.ws = full.full
            try:
                t0 = time.perf_counter()
                touched, entries, undo = await asyncio.to_thread(self.host.apply_chain, deltas)
            except DeltaError as exc:
                if old_ws is not None:
                    self.host.ws = old_ws
                raise WeightError(_delta_code(exc), f"applying the staged deltas failed: {exc}") from None
            if full is None and not touched:
                # An empty delta (no weight changed: e.g. a training step whose groups all had equal rewards)
                # only switches the version: nothing to reload, no KV cache to recompute. (rollart-trainer)
                from .engine import UpdateStats

                self.host.set_version(to_version, final_hash or None)
                self.engine.version = to_version
                now = time.time()
                stats = UpdateStats(from_version, to_version, 0, 0, False, 0.0, 0.0, 0, {"tensors": 0}, now)
                return self._result(stats, from_version, to_version, "delta", len(deltas), 0, entries, 0)
            path = self._payload_path(to_version)
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
                if isinstance(exc, WeightError):
                    raise
                code = getattr(exc, "code", "INTERNAL")
                raise WeightError(code, str(exc)) from None
            finally:
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

    async def load_full(
        self,
        ws: WeightSet,
        version: int,
        *,
        artifact: str,
        source_path: Path | None = None,
        replay: list[Delta] | None = None,
        mode: str = "keep",
        final_hash: bytes | None = None,
    ) -> actor_pb2.WeightUpdateResult:
        """Replace all weights (a checkpoint or pulled buckets), optionally replaying deltas after them."""
        async with self.lock:
            self.host.check_full(ws)
            from_version = self.host.version
            self.updating_to = replay[-1].version if replay else version
            old_ws = self.host.ws
            ws.version = version
            ws.applied_hash = ws.applied_hash if final_hash is None or not replay else ws.applied_hash
            new = HostWeights(ws, version, ws.applied_hash)
            entries = 0
            try:
                if replay:
                    try:
                        _, entries, _ = await asyncio.to_thread(new.apply_chain, replay)
                    except DeltaError as exc:
                        raise WeightError(_delta_code(exc), f"replaying deltas failed: {exc}") from None
                to_version = new.version
                to_hash = new.hash or None
                if source_path is not None and not replay:
                    path, cleanup = source_path, False
                    nbytes = int(sum(a.nbytes for a in ws.arrays.values()))
                else:
                    path, cleanup = self._payload_path(to_version), True
                    nbytes = await asyncio.to_thread(new.write, path)

                def committed() -> None:
                    self.host.ws = new.ws
                    self.host.pm = new.pm
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
