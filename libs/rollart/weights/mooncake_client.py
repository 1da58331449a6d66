"""The Mooncake store client under the weight buckets: return codes checked, failures typed, times bounded.

Every call either succeeds or raises a :class:`BucketError` subclass named for what went wrong (master down or
hung, key absent, segments full); a restarted master's first transient failures are retried within
``MooncakeConfig.reconnect_s``. The store behaviour it guards against: docs/platform.md. ``mooncake`` is imported
lazily, on :meth:`MooncakeClient.connect`.
"""

from __future__ import annotations

import os
import socket
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

MIN_SEGMENT_BYTES = 16 << 20

# Mooncake store error codes (mooncake-store types.h) this module tells apart.
RC_NO_SPACE = -200  # NO_AVAILABLE_HANDLE: the mounted segments are full
RC_INVALID_PARAMS = -600  # e.g. a buffer smaller than the object
RC_NOT_FOUND = -704  # OBJECT_NOT_FOUND
RC_HAS_LEASE = -706  # OBJECT_HAS_LEASE: recently read, removal needs force
RC_LEASE_EXPIRED = -707  # the read's lease ran out before its transfer ended: bytes written, unconfirmed
RC_RPC_FAIL = -900  # master unreachable (connection refused / reset)
RC_RPC_TIMEOUT = -901  # master did not answer within MC_RPC_TIMEOUT_MS
UNAVAILABLE_CODES = {RC_RPC_FAIL, RC_RPC_TIMEOUT}
_RC_NAMES = {
    -1: "INTERNAL_ERROR",
    RC_NO_SPACE: "NO_AVAILABLE_HANDLE",
    RC_INVALID_PARAMS: "INVALID_PARAMS",
    RC_NOT_FOUND: "OBJECT_NOT_FOUND",
    -705: "OBJECT_ALREADY_EXISTS",
    RC_HAS_LEASE: "OBJECT_HAS_LEASE",
    RC_LEASE_EXPIRED: "LEASE_EXPIRED",
    -800: "TRANSFER_FAIL",
    RC_RPC_FAIL: "RPC_FAIL",
    RC_RPC_TIMEOUT: "RPC_TIMEOUT",
}


def rc_name(rc: int) -> str:
    return f"{rc} ({_RC_NAMES.get(rc, 'see mooncake-store ErrorCode')})"


class BucketError(Exception):
    """Base class of weight-bucket failures."""

    grpc_status = "INTERNAL"


class MooncakeUnavailableError(BucketError):
    """The Mooncake master cannot be reached (down, hung, wrong address) or mooncake is not installed."""

    grpc_status = "UNAVAILABLE"


class WeightsNotFoundError(BucketError):
    """The version (or one of its buckets) is not in the store: never published, not committed yet,
    pruned, or forgotten by a restarted master. Nothing was loaded."""

    grpc_status = "NOT_FOUND"


class WeightsIntegrityError(BucketError):
    """A bucket's bytes do not match the manifest's SHA-256, or the manifest is malformed."""

    grpc_status = "DATA_LOSS"


class StoreFullError(BucketError):
    """The mounted segments cannot hold the buckets (raise the publisher's segment size)."""

    grpc_status = "RESOURCE_EXHAUSTED"


@dataclass(frozen=True)
class MooncakeConfig:
    """How to reach a Mooncake store. ``segment_bytes``: memory this client lends to the store (readers
    lend none; a publisher's 0 means "size it for its model" on first publish)."""

    master: str  # host:port of mooncake_master's RPC endpoint
    local_hostname: str = "127.0.0.1"  # the address other clients reach this one's segment at
    protocol: str = "tcp"
    device: str = ""
    segment_bytes: int = 0
    local_buffer_bytes: int = 64 << 20
    # Bounds every call to a hung master (MC_RPC_TIMEOUT_MS). Process-wide: the library reads it from the
    # environment, so the first client of a process sets it unless the operator already has.
    rpc_timeout_ms: int = 5000
    probe_timeout_s: float = 2.0  # TCP probe before setup: setup itself retries for ~90 s
    # After a master restart a client's first call can fail fast (RPC_FAIL on its stale connection):
    # such calls are retried within this window. Against a dead master each call blocks ~4 s inside
    # the library before it fails, so that case is not repeated and fails in about 4-5 s.
    reconnect_s: float = 3.0

    @classmethod
    def from_env(cls, **overrides: Any) -> MooncakeConfig:
        """ROLLART_MOONCAKE_MASTER (set by ``rollart up``), ROLLART_MOONCAKE_HOST, ROLLART_MOONCAKE_SEGMENT_BYTES."""
        master = overrides.pop("master", None) or os.environ.get("ROLLART_MOONCAKE_MASTER")
        if not master:
            raise MooncakeUnavailableError("no Mooncake master configured (ROLLART_MOONCAKE_MASTER is unset)")
        kw: dict[str, Any] = {"master": master}
        if os.environ.get("ROLLART_MOONCAKE_HOST"):
            kw["local_hostname"] = os.environ["ROLLART_MOONCAKE_HOST"]
        if os.environ.get("ROLLART_MOONCAKE_SEGMENT_BYTES"):
            kw["segment_bytes"] = int(os.environ["ROLLART_MOONCAKE_SEGMENT_BYTES"])
        kw.update(overrides)
        return cls(**kw)


def _split_hostport(address: str) -> tuple[str, int]:
    host, sep, port = address.rpartition(":")
    if not sep or not port.isdigit():
        raise ValueError(f"Mooncake master address must be host:port, got {address!r}")
    return host.strip("[]"), int(port)


def probe_master(address: str, timeout: float = 2.0) -> None:
    """Fail fast (MooncakeUnavailableError) if nothing listens at the master's RPC address."""
    host, port = _split_hostport(address)
    try:
        socket.create_connection((host, port), timeout=timeout).close()
    except OSError as e:
        raise MooncakeUnavailableError(f"Mooncake master {address} is unreachable: {e}") from None


class MooncakeClient:
    """One ``MooncakeDistributedStore`` with every return code checked and bounded failure times."""

    def __init__(self, config: MooncakeConfig) -> None:
        self.config = config
        self._store: Any = None
        self._config_cls: Any = None
        self.segment_bytes = 0

    @property
    def connected(self) -> bool:
        return self._store is not None

    def connect(self, segment_bytes: int | None = None) -> MooncakeClient:
        if self._store is not None:
            return self
        cfg = self.config
        probe_master(cfg.master, cfg.probe_timeout_s)
        # Read by the library when a client is created; setdefault keeps an operator's own settings.
        os.environ.setdefault("MC_RPC_TIMEOUT_MS", str(cfg.rpc_timeout_ms))
        os.environ.setdefault("MC_RPC_CONNECT_TIMEOUT_MS", str(int(cfg.probe_timeout_s * 1000)))
        os.environ.setdefault("MC_STORE_CLIENT_SETUP_RETRIES", "2")
        os.environ.setdefault("MC_LOG_LEVEL", "WARNING")
        try:
            from mooncake.store import MooncakeDistributedStore, ReplicateConfig
        except ImportError as e:
            raise MooncakeUnavailableError(
                f"mooncake is not installed ({e}); install mooncake-transfer-engine-non-cuda"
            ) from None
        store = MooncakeDistributedStore()
        seg = cfg.segment_bytes if segment_bytes is None else segment_bytes
        if seg > 0:
            seg = max(seg, MIN_SEGMENT_BYTES)  # smaller segments are refused (INVALID_PARAMS)
        rc = store.setup(
            cfg.local_hostname, "P2PHANDSHAKE", int(seg), int(cfg.local_buffer_bytes), cfg.protocol, cfg.device,
            cfg.master,
        )  # fmt: skip
        if rc != 0:
            raise MooncakeUnavailableError(f"Mooncake client setup against {cfg.master} failed: {rc_name(rc)}")
        self._store, self._config_cls = store, ReplicateConfig
        self.segment_bytes = int(seg)
        return self

    @property
    def store(self) -> Any:
        if self._store is None:
            raise MooncakeUnavailableError("Mooncake client is not connected (call connect())")
        return self._store

    def close(self) -> None:
        if self._store is not None:
            store, self._store = self._store, None
            store.close()

    def __enter__(self) -> MooncakeClient:
        return self.connect()

    def __exit__(self, *exc: object) -> None:
        self.close()

    def replicate_config(self, hard_pin: bool = True) -> Any:
        rc = self._config_cls()
        rc.with_hard_pin = hard_pin  # never evicted silently; we remove what we no longer need
        rc.replica_num = 1
        return rc

    def fail(self, what: str, rc: int) -> BucketError:
        if rc in UNAVAILABLE_CODES:
            return MooncakeUnavailableError(f"{what}: Mooncake master {self.config.master} unavailable: {rc_name(rc)}")
        if rc == RC_NOT_FOUND:
            return WeightsNotFoundError(f"{what}: not in the store")
        if rc == RC_NO_SPACE:
            return StoreFullError(
                f"{what}: the Mooncake segments are full ({rc_name(rc)}); publisher segment is "
                f"{self.segment_bytes} bytes"
            )
        return BucketError(f"{what}: Mooncake error {rc_name(rc)}")

    def _retry(self, call: Any, transient: frozenset[int] = frozenset({RC_RPC_FAIL})) -> Any:
        """Run ``call`` (returning a code or a list of codes) again while it fails with a transient code."""
        deadline = time.monotonic() + self.config.reconnect_s
        while True:
            result = call()
            codes = result if isinstance(result, list) else [result]
            if not transient.intersection(codes) or time.monotonic() >= deadline:
                return result
            time.sleep(0.1)

    def register(self, buf: np.ndarray) -> None:
        if buf.nbytes:
            rc = self.store.register_buffer(buf.ctypes.data, buf.nbytes)
            if rc != 0:
                raise self.fail("register_buffer", rc)

    def unregister(self, buf: np.ndarray) -> None:
        if buf.nbytes and self._store is not None:
            self._store.unregister_buffer(buf.ctypes.data)

    def upsert_from(
        self,
        keys: Sequence[str],
        buf: np.ndarray,
        ranges: Sequence[tuple[int, int]],
        hard_pin: bool = True,
        after_restart: bool = False,
    ) -> None:
        """Write ``buf[off:off+size]`` under each key, zero-copy from the registered buffer.

        ``after_restart``: a restarted master knows no segment until clients remount theirs (each client
        does so within about a second), so "no space" is retried for ``reconnect_s`` too."""
        if not keys:
            return
        base = buf.ctypes.data
        ptrs, sizes, cfg = (
            [base + off for off, _ in ranges],
            [size for _, size in ranges],
            self.replicate_config(hard_pin),
        )
        transient = frozenset({RC_RPC_FAIL, RC_NO_SPACE} if after_restart else {RC_RPC_FAIL})
        rcs = self._retry(lambda: list(self.store.batch_upsert_from(list(keys), ptrs, sizes, cfg)), transient)
        bad = [(k, rc) for k, rc in zip(keys, rcs) if rc != 0]
        if len(rcs) != len(keys):
            raise BucketError(f"batch_upsert_from answered {len(rcs)} codes for {len(keys)} keys")
        if bad:
            raise self.fail(f"writing {len(bad)} of {len(keys)} buckets (first {bad[0][0]})", bad[0][1])

    def get_into(self, keys: Sequence[str], buf: np.ndarray, ranges: Sequence[tuple[int, int]]) -> list[int]:
        """Read each key into ``buf[off:off+size]``; returns the raw codes (bytes read or an error)."""
        if not keys:
            return []
        base = buf.ctypes.data
        ptrs, sizes = [base + off for off, _ in ranges], [size for _, size in ranges]
        return self._retry(lambda: list(self.store.batch_get_into(list(keys), ptrs, sizes)))

    def upsert_bytes(self, key: str, data: bytes, hard_pin: bool = True) -> None:
        cfg = self.replicate_config(hard_pin)
        rc = self._retry(lambda: self.store.upsert(key, data, cfg))
        if rc != 0:
            raise self.fail(f"writing {key}", rc)

    def get_bytes(self, key: str) -> bytes | None:
        """The value, or None if the key is absent. (``get`` answers b"" both for a missing key and for an
        unreachable master, so the size is asked first and the length checked.)"""
        size = self._retry(lambda: self.store.get_size(key))
        if size == RC_NOT_FOUND:
            return None
        if size < 0:
            raise self.fail(f"reading {key}", size)
        data = self.store.get(key)
        if len(data) != size:
            if self.store.get_size(key) == RC_NOT_FOUND:
                return None  # removed between the two calls
            raise BucketError(f"reading {key}: got {len(data)} bytes, the store says {size}")
        return bytes(data)

    def exist(self, keys: Sequence[str]) -> list[bool]:
        if not keys:
            return []
        codes = self._retry(lambda: list(self.store.batch_is_exist(list(keys))))
        down = [c for c in codes if c in UNAVAILABLE_CODES]
        if down:
            raise self.fail("checking keys", down[0])
        if any(c < 0 for c in codes):
            # is_exist reports only -1: ask a call that gives the reason (retrying while it reconnects)
            rc = self._retry(lambda: self.store.get_size(keys[0]))
            if rc >= 0 or rc == RC_NOT_FOUND:
                codes = list(self.store.batch_is_exist(list(keys)))
        if any(c < 0 for c in codes):
            raise self.fail("checking keys", rc if rc in UNAVAILABLE_CODES else -1)
        return [c == 1 for c in codes]

    def remove(self, keys: Iterable[str]) -> None:
        """Best-effort forced removal (readers verify hashes, so a reader racing a removal fails cleanly)."""
        keys = list(keys)
        if keys and self._store is not None:
            self._store.batch_remove(keys, True)


def as_client(client: MooncakeClient | MooncakeConfig | str) -> MooncakeClient:
    if isinstance(client, MooncakeClient):
        return client
    if isinstance(client, str):
        client = MooncakeConfig(master=client)
    return MooncakeClient(client)
