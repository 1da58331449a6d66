"""Full-weight buckets in a Mooncake store: the trainer publishes version ``v``, same-datacenter actors pull it.

Invariant: a reader gets the complete set of ``v``'s buckets, each verified against the manifest's SHA-256, or an
exception (:class:`WeightsNotFoundError`, :class:`WeightsIntegrityError`, :class:`MooncakeUnavailableError`),
never a partial set; a key is never written twice and the manifest is written last. Layout: docs/weight-plane.md
("Full weights"); the Mooncake behaviour it guards against: docs/platform.md. Only the publisher mounts a segment,
so its buckets die with it and a new publisher publishes again. The store client: ``mooncake_client``.
"""

from __future__ import annotations

import hashlib
import json
import re
import time
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

import numpy as np

from rollart.delta import dtypes as dt
from rollart.delta.safetensors_io import WeightSet
from rollart.runtime import ids

from .mooncake_client import (  # the client's names are imported from here by the actor, tests and benchmarks
    RC_INVALID_PARAMS,
    RC_LEASE_EXPIRED,
    RC_NOT_FOUND,
    UNAVAILABLE_CODES,
    BucketError,
    MooncakeClient,
    MooncakeConfig,
    MooncakeUnavailableError,
    WeightsIntegrityError,
    WeightsNotFoundError,
    as_client,
)
from .mooncake_client import (
    StoreFullError as StoreFullError,  # raised by a publish; callers catch it by this module's name
)

DEFAULT_BUCKET_BYTES = 1 << 30
ALIGN = 64  # every tensor starts on a 64-byte boundary: aligned views for any dtype, cache-line friendly
MANIFEST_FORMAT = "rollart.weights.buckets/1"
_JOB = re.compile(r"^[A-Za-z0-9._-]{1,128}$")

# ---------------------------------------------------------------------------------------------------------
# Keys and manifests (pure: no Mooncake needed)


def namespace(job: str) -> str:
    if not _JOB.match(job):
        raise ValueError(f"job id {job!r} must match {_JOB.pattern}")
    return f"rollart/{job}/weights"


def version_prefix(ns: str, version: int) -> str:
    if not isinstance(version, int) or isinstance(version, bool) or not 0 <= version < 10**12:
        raise ValueError(f"version must be an integer in [0, 1e12), got {version!r}")
    return f"{ns}/v{version:012d}"


def manifest_key(ns: str, version: int) -> str:
    return f"{version_prefix(ns, version)}/manifest"


def latest_key(ns: str) -> str:
    return f"{ns}/latest"


def bucket_keys(ns: str, version: int, epoch: str, count: int) -> list[str]:
    base = version_prefix(ns, version)
    return [f"{base}/{epoch}/{i:05d}" for i in range(count)]


@dataclass(frozen=True)
class BucketSpec:
    key: str
    offset: int  # in the flat stream
    size: int
    sha256: str


@dataclass(frozen=True)
class TensorSpec:
    name: str
    dtype: str  # safetensors spelling (BF16, F32, ...)
    shape: tuple[int, ...]
    offset: int  # in the flat stream
    nbytes: int


@dataclass(frozen=True)
class BucketManifest:
    job: str
    version: int
    epoch: str
    bucket_bytes: int
    total_bytes: int
    buckets: tuple[BucketSpec, ...]
    tensors: tuple[TensorSpec, ...]
    created_at: float
    applied_hash: str | None = None  # h(v) of the last delta applied to these weights, if known
    metadata: dict[str, str] = field(default_factory=dict)

    def to_json(self) -> bytes:
        doc = {
            "format": MANIFEST_FORMAT,
            "job": self.job,
            "version": self.version,
            "epoch": self.epoch,
            "bucket_bytes": self.bucket_bytes,
            "total_bytes": self.total_bytes,
            "created_at": self.created_at,
            "applied_hash": self.applied_hash,
            "metadata": dict(self.metadata),
            "buckets": [[b.key, b.offset, b.size, b.sha256] for b in self.buckets],
            "tensors": [[t.name, t.dtype, list(t.shape), t.offset, t.nbytes] for t in self.tensors],
        }
        return json.dumps(doc, separators=(",", ":")).encode()

    @classmethod
    def from_json(cls, raw: bytes, *, job: str, version: int) -> BucketManifest:
        """Parse and validate (buckets tile the stream, tensors fit their dtype and the stream)."""
        where = f"manifest of {job} v{version}"
        try:
            doc = json.loads(raw)
            if doc.get("format") != MANIFEST_FORMAT:
                raise ValueError(f"format {doc.get('format')!r} is not {MANIFEST_FORMAT!r}")
            m = cls(
                job=str(doc["job"]),
                version=int(doc["version"]),
                epoch=str(doc["epoch"]),
                bucket_bytes=int(doc["bucket_bytes"]),
                total_bytes=int(doc["total_bytes"]),
                buckets=tuple(BucketSpec(str(k), int(o), int(s), str(h)) for k, o, s, h in doc["buckets"]),
                tensors=tuple(
                    TensorSpec(str(n), str(d), tuple(int(x) for x in sh), int(o), int(nb))
                    for n, d, sh, o, nb in doc["tensors"]
                ),
                created_at=float(doc["created_at"]),
                applied_hash=doc.get("applied_hash"),
                metadata={str(k): str(v) for k, v in (doc.get("metadata") or {}).items()},
            )
        except (ValueError, KeyError, TypeError) as e:
            raise WeightsIntegrityError(f"{where} is malformed: {e}") from None
        if (m.job, m.version) != (job, version):
            raise WeightsIntegrityError(f"{where} names {m.job} v{m.version}")
        pos = 0
        for b in m.buckets:
            if b.offset != pos or not 0 < b.size <= m.bucket_bytes:
                raise WeightsIntegrityError(f"{where}: bucket {b.key} does not continue the stream at {pos}")
            if not re.fullmatch(r"[0-9a-f]{64}", b.sha256):
                raise WeightsIntegrityError(f"{where}: bucket {b.key} has no valid SHA-256")
            pos += b.size
        if pos != m.total_bytes:
            raise WeightsIntegrityError(f"{where}: buckets cover {pos} of {m.total_bytes} bytes")
        for t in m.tensors:
            try:
                itemsize = dt.by_name(t.dtype).itemsize
            except Exception as e:
                raise WeightsIntegrityError(f"{where}: {t.name}: {e}") from None
            numel = int(np.prod(t.shape, dtype=object)) if t.shape else 1
            if (
                min(t.shape, default=0) < 0
                or t.nbytes != numel * itemsize
                or not 0 <= t.offset <= t.offset + t.nbytes <= pos
            ):
                raise WeightsIntegrityError(f"{where}: tensor {t.name} does not fit its dtype or the stream")
        return m


def plan_layout(
    arrays: Mapping[str, np.ndarray], dtypes: Mapping[str, str], bucket_bytes: int
) -> tuple[list[TensorSpec], int, list[tuple[int, int]]]:
    """Tensor placements in the flat stream, its length, and the (offset, size) of every bucket."""
    if bucket_bytes < ALIGN:
        raise ValueError(f"bucket_bytes must be at least {ALIGN}")
    specs = []
    pos = 0
    for name in sorted(arrays):
        a = arrays[name]
        pos += -pos % ALIGN
        specs.append(TensorSpec(name, dtypes[name], tuple(int(d) for d in a.shape), pos, int(a.nbytes)))
        pos += int(a.nbytes)
    buckets = [(off, min(bucket_bytes, pos - off)) for off in range(0, pos, bucket_bytes)]
    return specs, pos, buckets


def _sha256(view: memoryview) -> str:
    return hashlib.sha256(view).hexdigest()  # releases the GIL: buckets hash in parallel threads


# ---------------------------------------------------------------------------------------------------------
# Publisher (trainer side)


@dataclass
class PreparedVersion:
    """Buckets written, manifest not yet: invisible to readers until :meth:`BucketPublisher.commit`."""

    manifest: BucketManifest
    buffer: np.ndarray  # the packed stream (registered); kept for republish once committed
    put_s: float = 0.0
    pack_s: float = 0.0


class BucketPublisher:
    """Publishes versions as buckets; keeps the newest committed one packed in memory to republish it.

    Memory: the packed copy of the newest version plus one staging buffer during a publish, and the
    store segment this client mounts (``(keep_versions + 1) x model`` when sized automatically).
    Not thread-safe: call it from one thread at a time (e.g. through ``asyncio.to_thread``); a blocking
    call releases the GIL. ``close()`` also closes the client.
    """

    def __init__(
        self,
        client: MooncakeClient | MooncakeConfig | str,
        job: str,
        *,
        bucket_bytes: int = DEFAULT_BUCKET_BYTES,
        keep_versions: int = 1,
        hard_pin: bool = True,
        hash_threads: int = 2,
        segment_slack_bytes: int = 64 << 20,
    ) -> None:
        if keep_versions < 1:
            raise ValueError("keep_versions must be >= 1")
        self.client = as_client(client)
        self.job = job
        self.ns = namespace(job)
        self.bucket_bytes = int(bucket_bytes)
        self.keep_versions = keep_versions
        self.hard_pin = hard_pin
        self.hash_threads = max(1, hash_threads)
        self.segment_slack_bytes = segment_slack_bytes
        self._committed: dict[int, BucketManifest] = {}  # versions in the store, oldest first
        self._latest: PreparedVersion | None = None  # newest committed: what republish() puts back
        self._spare: np.ndarray | None = None  # a registered buffer to reuse for the next version

    @property
    def latest(self) -> BucketManifest | None:
        return self._latest.manifest if self._latest else None

    def close(self) -> None:
        for buf in (self._spare, self._latest.buffer if self._latest else None):
            if buf is not None:
                self.client.unregister(buf)
        self._spare = self._latest = None
        self.client.close()

    def _connect(self, total_bytes: int) -> None:
        if not self.client.connected:
            seg = self.client.config.segment_bytes or (self.keep_versions + 1) * total_bytes + self.segment_slack_bytes
            self.client.connect(segment_bytes=seg)

    def _staging(self, total: int) -> np.ndarray:
        spare, self._spare = self._spare, None
        if spare is not None and spare.nbytes >= total:
            return spare
        if spare is not None:
            self.client.unregister(spare)
        buf = np.empty(max(total, 1), dtype=np.uint8)
        self.client.register(buf)
        return buf

    def prepare(
        self,
        version: int,
        weights: WeightSet | Mapping[str, np.ndarray],
        *,
        dtypes: Mapping[str, str] | None = None,
        metadata: Mapping[str, str] | None = None,
    ) -> PreparedVersion:
        """Pack, hash and write the buckets of ``version`` (not visible to readers until committed)."""
        ws = weights if isinstance(weights, WeightSet) else WeightSet.from_arrays(weights, dtypes)
        specs, total, ranges = plan_layout(ws.arrays, ws.dtypes, self.bucket_bytes)
        self._connect(total)
        t0 = time.perf_counter()
        buf = self._staging(total)
        pos = 0
        for spec in specs:
            buf[pos : spec.offset] = 0  # deterministic padding, so equal weights give equal hashes
            a = ws.arrays[spec.name]
            if a.dtype.byteorder == ">":
                a = a.astype(a.dtype.newbyteorder("<"))
            if spec.nbytes:
                np.copyto(buf[spec.offset : spec.offset + spec.nbytes].view(a.dtype).reshape(a.shape), a)
            pos = spec.offset + spec.nbytes
        t1 = time.perf_counter()
        epoch = ids.new_id("", nbytes=8)
        keys = bucket_keys(self.ns, version, epoch, len(ranges))
        mv = buf.data
        # Hash on worker threads while the main thread writes: both only read the packed buffer.
        with ThreadPoolExecutor(self.hash_threads) as pool:
            hashes = [pool.submit(_sha256, mv[off : off + size]) for off, size in ranges]
            try:
                self.client.upsert_from(keys, buf, ranges, self.hard_pin)
            except BaseException as e:
                if not isinstance(e, MooncakeUnavailableError):  # else removal would block too
                    self.client.remove(keys)
                self._spare = buf
                raise
            digests = [h.result() for h in hashes]
        t2 = time.perf_counter()
        manifest = BucketManifest(
            job=self.job,
            version=version,
            epoch=epoch,
            bucket_bytes=self.bucket_bytes,
            total_bytes=total,
            buckets=tuple(BucketSpec(k, off, size, d) for k, (off, size), d in zip(keys, ranges, digests)),
            tensors=tuple(specs),
            created_at=time.time(),
            applied_hash=ws.applied_hash.hex() if ws.applied_hash else None,
            metadata=dict(metadata or {}),
        )
        return PreparedVersion(manifest, buf, put_s=t2 - t1, pack_s=t1 - t0)

    def commit(self, prepared: PreparedVersion) -> BucketManifest:
        """Write the manifest (the commit point), then move ``latest``; prune old versions."""
        m = prepared.manifest
        raw = m.to_json()
        try:
            # Buckets lost since prepare() (a master restart, a segment gone) are put back first: the
            # manifest must only ever name buckets that are in the store.
            present = self.client.exist([b.key for b in m.buckets])
            lost = [b for b, here in zip(m.buckets, present) if not here]
            if lost:
                self.client.upsert_from(
                    [b.key for b in lost], prepared.buffer, [(b.offset, b.size) for b in lost], self.hard_pin,
                    after_restart=True,
                )  # fmt: skip
            self.client.upsert_bytes(manifest_key(self.ns, m.version), raw, self.hard_pin)
            newest = max(self._committed, default=-1)
            if m.version >= newest:
                pointer = {"version": m.version, "epoch": m.epoch, "manifest_sha256": hashlib.sha256(raw).hexdigest()}
                self.client.upsert_bytes(latest_key(self.ns), json.dumps(pointer).encode(), self.hard_pin)
        except BaseException as e:
            if not isinstance(e, MooncakeUnavailableError):
                self.discard(prepared)
            elif self._latest is None or prepared.buffer is not self._latest.buffer:
                self._recycle(prepared.buffer)
            raise
        replaced = self._committed.pop(m.version, None)
        if replaced is not None and replaced.epoch != m.epoch:
            self.client.remove(b.key for b in replaced.buckets)  # the same version under an older epoch
        self._committed[m.version] = m
        self._committed = dict(sorted(self._committed.items()))
        if self._latest is None or m.version >= self._latest.manifest.version:
            old, self._latest = self._latest, prepared
            if old is not None and old.buffer is not prepared.buffer:
                self._recycle(old.buffer)
        else:
            self._recycle(prepared.buffer)
        self._prune()
        return m

    def discard(self, prepared: PreparedVersion) -> None:
        """Drop buckets that were written but will not be committed."""
        if self._committed.get(prepared.manifest.version) is not prepared.manifest:
            self.client.remove(b.key for b in prepared.manifest.buckets)
        if self._latest is None or prepared.buffer is not self._latest.buffer:
            self._recycle(prepared.buffer)

    def _recycle(self, buf: np.ndarray) -> None:
        if self._spare is None or self._spare.nbytes < buf.nbytes:
            if self._spare is not None:
                self.client.unregister(self._spare)
            self._spare = buf
        else:
            self.client.unregister(buf)

    def _prune(self) -> None:
        while len(self._committed) > self.keep_versions:
            v = next(iter(self._committed))
            m = self._committed.pop(v)
            # The manifest first: from here readers get "not found", not a half-removed version.
            self.client.remove([manifest_key(self.ns, v)])
            self.client.remove(b.key for b in m.buckets)

    def publish(
        self,
        version: int,
        weights: WeightSet | Mapping[str, np.ndarray],
        *,
        dtypes: Mapping[str, str] | None = None,
        metadata: Mapping[str, str] | None = None,
    ) -> BucketManifest:
        return self.commit(self.prepare(version, weights, dtypes=dtypes, metadata=metadata))

    def republish(self) -> BucketManifest | None:
        """Put the newest committed version back (under a new epoch), e.g. after the master restarted.

        Older kept versions are not restored: only the newest is held in memory. None if nothing was
        published yet."""
        if self._latest is None:
            return None
        old = self._latest.manifest
        epoch = ids.new_id("", nbytes=8)
        keys = bucket_keys(self.ns, old.version, epoch, len(old.buckets))
        ranges = [(b.offset, b.size) for b in old.buckets]
        t0 = time.perf_counter()
        try:
            self.client.upsert_from(keys, self._latest.buffer, ranges, self.hard_pin, after_restart=True)
        except BaseException as e:
            if not isinstance(e, MooncakeUnavailableError):
                self.client.remove(keys)
            raise
        new = BucketManifest(
            job=old.job,
            version=old.version,
            epoch=epoch,
            bucket_bytes=old.bucket_bytes,
            total_bytes=old.total_bytes,
            buckets=tuple(BucketSpec(k, b.offset, b.size, b.sha256) for k, b in zip(keys, old.buckets)),
            tensors=old.tensors,
            created_at=time.time(),
            applied_hash=old.applied_hash,
            metadata=old.metadata,
        )
        # Versions older than the newest are gone after a master restart; forget them (and drop any
        # that survived, so the store and this record agree).
        for v, m in list(self._committed.items()):
            if v != old.version:
                self.client.remove([manifest_key(self.ns, v), *(b.key for b in m.buckets)])
                del self._committed[v]
        prepared = PreparedVersion(new, self._latest.buffer, put_s=time.perf_counter() - t0)
        return self.commit(prepared)

    def ensure_published(self) -> bool:
        """Republish the newest version if the store lost any part of it (a restarted master, a lost
        segment). Returns True if it republished. Raises MooncakeUnavailableError if the master is down."""
        if self._latest is None:
            return False
        m = self._latest.manifest
        present = self.client.exist(
            [latest_key(self.ns), manifest_key(self.ns, m.version), *(b.key for b in m.buckets)]
        )
        if all(present):
            raw = self.client.get_bytes(manifest_key(self.ns, m.version))
            if raw == m.to_json():
                return False
        self.republish()
        return True


# ---------------------------------------------------------------------------------------------------------
# Reader (actor side)


@dataclass
class PulledWeights:
    weights: WeightSet  # views of one buffer; version, applied_hash and metadata from the manifest
    manifest: BucketManifest
    transfer_s: float
    verify_s: float

    @property
    def nbytes(self) -> int:
        return self.manifest.total_bytes


@dataclass(frozen=True)
class LatestPointer:
    version: int
    epoch: str
    manifest_sha256: str


class BucketReader:
    """Pulls complete, verified versions. Pulling "the latest" retries when the version changes under it."""

    def __init__(self, client: MooncakeClient | MooncakeConfig | str, job: str, *, hash_threads: int = 2) -> None:
        self.client = as_client(client)
        self.job = job
        self.ns = namespace(job)
        self.hash_threads = max(1, hash_threads)

    def close(self) -> None:
        self.client.close()

    def latest(self) -> LatestPointer | None:
        self.client.connect()
        raw = self.client.get_bytes(latest_key(self.ns))
        if raw is None:
            return None
        try:
            doc = json.loads(raw)
            return LatestPointer(int(doc["version"]), str(doc["epoch"]), str(doc["manifest_sha256"]))
        except (ValueError, KeyError, TypeError) as e:
            raise WeightsIntegrityError(f"{latest_key(self.ns)} is malformed: {e}") from None

    def _manifest_raw(self, version: int) -> bytes:
        self.client.connect()
        raw = self.client.get_bytes(manifest_key(self.ns, version))
        if raw is None:
            raise WeightsNotFoundError(
                f"{self.job} v{version} is not in the Mooncake store (not published or committed yet, pruned, "
                "or the master restarted and the publisher has not republished)"
            )
        return raw

    def manifest(self, version: int) -> BucketManifest:
        return BucketManifest.from_json(self._manifest_raw(version), job=self.job, version=version)

    def pull(
        self, version: int | None = None, *, verify: bool = True, attempts: int = 3, out: np.ndarray | None = None
    ) -> PulledWeights:
        """Pull ``version`` (default: the latest). ``out``: a uint8 buffer of at least the model's size to
        fill (e.g. to reuse memory); otherwise a new one is allocated."""
        last: BucketError | None = None
        for _ in range(max(1, attempts)):
            if version is None:
                pointer = self.latest()
                if pointer is None:
                    raise WeightsNotFoundError(
                        f"nothing is published for job {self.job} in the Mooncake store (not yet, or the master "
                        "restarted and the publisher has not republished)"
                    )
                raw = self._manifest_raw(pointer.version)
                if hashlib.sha256(raw).hexdigest() != pointer.manifest_sha256:
                    last = WeightsNotFoundError(f"{self.job}: latest moved while reading it")
                    continue  # republished or replaced between the two reads
                m = BucketManifest.from_json(raw, job=self.job, version=pointer.version)
            else:
                m = self.manifest(version)
            try:
                return self._pull(m, verify, out)
            except (WeightsNotFoundError, WeightsIntegrityError) as e:
                # A different epoch/version now: the publisher republished or moved on. Otherwise final.
                last = e
                now = self.latest() if version is None else None
                if version is None and now is not None and (now.version, now.epoch) != (m.version, m.epoch):
                    continue
                if version is not None:
                    try:
                        if self.manifest(version).epoch != m.epoch:
                            continue
                    except WeightsNotFoundError:
                        pass
                raise
        assert last is not None
        raise last

    def _pull(self, m: BucketManifest, verify: bool, out: np.ndarray | None) -> PulledWeights:
        if out is not None:
            if out.dtype != np.uint8 or out.ndim != 1 or out.nbytes < m.total_bytes or not out.flags.c_contiguous:
                raise ValueError(f"out must be a contiguous uint8 vector of >= {m.total_bytes} bytes")
            buf = out
        else:
            buf = np.empty(max(m.total_bytes, 1), dtype=np.uint8)
        keys = [b.key for b in m.buckets]
        ranges = [(b.offset, b.size) for b in m.buckets]
        t0 = time.perf_counter()
        self.client.register(buf)
        try:
            codes = self.client.get_into(keys, buf, ranges)
            # LEASE_EXPIRED: the transfer outlived the read lease (default_kv_lease_ttl, 10 s; slow on a
            # busy host). The bytes were written but not confirmed; with verification on, the SHA-256
            # decides; without it, read those buckets again (a new lease).
            late = [i for i, c in enumerate(codes) if c == RC_LEASE_EXPIRED]
            if late and verify:
                for i in late:
                    codes[i] = m.buckets[i].size
            elif late:
                again = self.client.get_into([keys[i] for i in late], buf, [ranges[i] for i in late])
                for i, c in zip(late, again):
                    codes[i] = c
        finally:
            self.client.unregister(buf)
        t1 = time.perf_counter()
        if len(codes) != len(keys):
            raise BucketError(f"batch_get_into answered {len(codes)} codes for {len(keys)} keys")
        missing = [k for k, c in zip(keys, codes) if c == RC_NOT_FOUND]
        down = [c for c in codes if c in UNAVAILABLE_CODES]
        if down:
            raise self.client.fail(f"pulling {self.job} v{m.version}", down[0])
        if missing:
            raise WeightsNotFoundError(
                f"{self.job} v{m.version}: {len(missing)} of {len(keys)} buckets are missing (first {missing[0]}); "
                "the master restarted, the segment holding them is gone, or the version was pruned; nothing loaded"
            )
        for b, c in zip(m.buckets, codes):
            if c != b.size:
                if c == RC_INVALID_PARAMS:  # the stored object is larger than the manifest says
                    raise WeightsIntegrityError(f"bucket {b.key}: the stored object is not the {b.size} bytes listed")
                if c < 0:
                    raise self.client.fail(f"pulling bucket {b.key}", c)
                raise WeightsIntegrityError(f"bucket {b.key}: read {c} bytes, the manifest says {b.size}")
        if verify:
            mv = buf.data
            with ThreadPoolExecutor(self.hash_threads) as pool:
                digests = list(pool.map(lambda b: _sha256(mv[b.offset : b.offset + b.size]), m.buckets))
            for b, d in zip(m.buckets, digests):
                if d != b.sha256:
                    raise WeightsIntegrityError(
                        f"bucket {b.key} of {self.job} v{m.version}: SHA-256 {d} != manifest {b.sha256}; nothing loaded"
                    )
        t2 = time.perf_counter()
        arrays: dict[str, np.ndarray] = {}
        dtypes: dict[str, str] = {}
        for t in m.tensors:
            tdt = dt.by_name(t.dtype)
            arrays[t.name] = buf[t.offset : t.offset + t.nbytes].view(tdt.numpy).reshape(t.shape)
            dtypes[t.name] = tdt.name
        ws = WeightSet(
            arrays,
            dtypes,
            m.version,
            bytes.fromhex(m.applied_hash) if m.applied_hash else None,
            dict(m.metadata),
        )
        return PulledWeights(ws, m, transfer_s=t1 - t0, verify_s=t2 - t1)
