"""Full checkpoints addressed by URL: a directory (``file://`` or a path), an S3-compatible bucket, or (read-only)
a static HTTP server over a directory store's folder (``http(s)://``, :mod:`rollart.weights.http_store`).

Layout: ``<root>/v<12 digits>/model.safetensors`` (metadata: ``rollart.version``, and ``rollart.job`` /
``rollart.hash`` when known), then ``manifest.json`` (version, SHA-256, sizes), each written to a temporary name,
fsynced and renamed (a directory store also keeps ``index.json``, its committed versions, for HTTP readers).
Invariant: a version exists iff its manifest does, so a reader never sees half a checkpoint
(a writer that died leaves an invisible folder the next ``put`` overwrites); committed checkpoints are immutable
and checked against their SHA-256 on open unless the caller opts out. No torch; boto3 only for ``s3://``.
docs/weight-plane.md ("Full weights").
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import tempfile
import time
from abc import ABC, abstractmethod
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, unquote, urlparse

import numpy as np

from rollart.delta.safetensors_io import WeightSet, load_safetensors, read_header, save_safetensors

FORMAT = "rollart.checkpoint/1"
CHECKPOINT_FILE = "model.safetensors"
MANIFEST_FILE = "manifest.json"
INDEX_FILE = "index.json"  # a directory store's committed versions, rewritten after each commit and delete
INDEX_FORMAT = "rollart.checkpoint-index/1"
ROUTES_ENV = "ROLLART_CHECKPOINT_ROUTES"  # JSON {store URL or path prefix: the URL this process reads it at}
_VERSION_DIR = re.compile(r"^v(\d{12})$")
_CHUNK = 16 << 20  # hashing/copy chunk: large enough for full speed, small enough to stay in cache


class CheckpointError(Exception):
    """Base class of checkpoint store failures."""

    grpc_status = "INTERNAL"


class CheckpointNotFoundError(CheckpointError):
    grpc_status = "NOT_FOUND"


class CheckpointExistsError(CheckpointError):
    grpc_status = "ALREADY_EXISTS"


class CheckpointIntegrityError(CheckpointError):
    """The file does not match its manifest (hash or size), or the manifest is malformed."""

    grpc_status = "DATA_LOSS"


def version_dirname(version: int) -> str:
    if not isinstance(version, int) or isinstance(version, bool) or not 0 <= version < 10**12:
        raise ValueError(f"checkpoint version must be an integer in [0, 1e12), got {version!r}")
    return f"v{version:012d}"


def parse_version_dirname(name: str) -> int | None:
    m = _VERSION_DIR.match(name)
    return int(m.group(1)) if m else None


@dataclass(frozen=True)
class CheckpointInfo:
    """What a manifest says about one committed checkpoint."""

    version: int
    sha256: str  # hex digest of the whole safetensors file
    size: int  # bytes of the safetensors file
    tensor_bytes: int  # bytes of tensor data in it
    num_tensors: int
    created_at: float  # unix time the manifest was written
    metadata: dict[str, str] = field(default_factory=dict)
    location: str = ""  # where the file is (path or URL); not stored in the manifest

    def to_json(self) -> bytes:
        doc = {
            "format": FORMAT,
            "version": self.version,
            "file": CHECKPOINT_FILE,
            "hash": {"algorithm": "sha256", "hex": self.sha256},
            "size": self.size,
            "tensor_bytes": self.tensor_bytes,
            "num_tensors": self.num_tensors,
            "created_at": self.created_at,
            "metadata": dict(self.metadata),
        }
        return json.dumps(doc, indent=1, sort_keys=True).encode()

    @classmethod
    def from_json(cls, raw: bytes, *, expect_version: int, location: str = "") -> CheckpointInfo:
        try:
            doc = json.loads(raw)
            if doc.get("format") != FORMAT:
                raise ValueError(f"format {doc.get('format')!r} is not {FORMAT!r}")
            h = doc["hash"]
            if h["algorithm"] != "sha256" or not re.fullmatch(r"[0-9a-f]{64}", h["hex"]):
                raise ValueError("hash must be a sha256 hex digest")
            info = cls(
                version=int(doc["version"]),
                sha256=h["hex"],
                size=int(doc["size"]),
                tensor_bytes=int(doc["tensor_bytes"]),
                num_tensors=int(doc["num_tensors"]),
                created_at=float(doc["created_at"]),
                metadata={str(k): str(v) for k, v in (doc.get("metadata") or {}).items()},
                location=location,
            )
        except (ValueError, KeyError, TypeError) as e:
            raise CheckpointIntegrityError(f"manifest of version {expect_version} is malformed: {e}") from None
        if info.version != expect_version:
            raise CheckpointIntegrityError(f"manifest under version {expect_version} names version {info.version}")
        return info


def file_sha256(path: str | os.PathLike[str]) -> tuple[str, int]:
    """Hex SHA-256 and size of a file (hashlib releases the GIL on large chunks)."""
    h = hashlib.sha256()
    size = 0
    buf = bytearray(_CHUNK)
    view = memoryview(buf)
    with open(path, "rb", buffering=0) as f:
        while n := f.readinto(buf):
            h.update(view[:n])
            size += n
    return h.hexdigest(), size


def cached_checkpoint(vdir: Path, info: CheckpointInfo, verify: bool) -> Path | None:
    """A download cache's copy of a version (``vdir/model.safetensors``) when a finished, verified download of the
    same SHA-256 left its stamp and the size still matches (re-hashed when ``verify``); else None."""
    path = vdir / CHECKPOINT_FILE
    stamp = vdir / f".{info.sha256}.verified"
    if path.exists() and stamp.exists() and path.stat().st_size == info.size:
        if not verify or file_sha256(path)[0] == info.sha256:
            return path
    return None


def _describe(path: Path) -> tuple[int, int]:
    """(tensor bytes, tensor count) of a safetensors file, from its header only."""
    header, start = read_header(path)
    header.pop("__metadata__", None)
    return path.stat().st_size - start, len(header)


def _as_weight_set(version: int, weights: WeightSet | Mapping[str, np.ndarray], dtypes: Mapping[str, str] | None):
    ws = weights if isinstance(weights, WeightSet) else WeightSet.from_arrays(weights, dtypes)
    if ws.version is not None and ws.version != version:
        raise ValueError(f"weights hold version {ws.version}, not {version}")
    # A shallow copy that records the version in the file's metadata (rollart.version).
    return WeightSet(ws.arrays, ws.dtypes, version, ws.applied_hash, dict(ws.metadata))


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _write_atomic(path: Path, data: bytes) -> None:
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.tmp-", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    _fsync_dir(path.parent)


def _copy_hashing(src: Path, dst_dir: Path, name: str) -> tuple[str, int]:
    """Copy ``src`` to ``dst_dir/name`` atomically, hashing in the same pass."""
    h = hashlib.sha256()
    size = 0
    buf = bytearray(_CHUNK)
    view = memoryview(buf)
    fd, tmp = tempfile.mkstemp(prefix=f".{name}.tmp-", dir=dst_dir)
    try:
        with open(src, "rb", buffering=0) as fin, os.fdopen(fd, "wb") as fout:
            while n := fin.readinto(buf):
                h.update(view[:n])
                fout.write(view[:n])
                size += n
            fout.flush()
            os.fsync(fout.fileno())
        os.replace(tmp, dst_dir / name)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return h.hexdigest(), size


class CheckpointStore(ABC):
    """Full checkpoints by version. Subclasses: :class:`DirectoryStore`, :class:`S3Store`."""

    url: str

    @abstractmethod
    def put(
        self,
        version: int,
        weights: WeightSet | Mapping[str, np.ndarray],
        *,
        dtypes: Mapping[str, str] | None = None,
        metadata: Mapping[str, str] | None = None,
        exist_ok: bool = False,
    ) -> CheckpointInfo:
        """Write and commit a checkpoint. ``exist_ok``: return the committed one instead of raising."""

    @abstractmethod
    def put_file(
        self,
        version: int,
        path: str | os.PathLike[str],
        *,
        metadata: Mapping[str, str] | None = None,
        exist_ok: bool = False,
    ) -> CheckpointInfo:
        """Commit an existing safetensors file (copied; the source is left alone)."""

    @abstractmethod
    def versions(self) -> list[int]:
        """Committed versions, ascending."""

    @abstractmethod
    def info(self, version: int) -> CheckpointInfo:
        """The manifest of a committed version (CheckpointNotFoundError if there is none)."""

    @abstractmethod
    def local_path(self, version: int, *, verify: bool = True) -> Path:
        """A local path of the version's safetensors file (downloaded first for remote stores)."""

    @abstractmethod
    def delete(self, version: int) -> bool:
        """Remove a version (manifest first, so it disappears atomically). True if it existed."""

    def has(self, version: int) -> bool:
        try:
            self.info(version)
        except CheckpointNotFoundError:
            return False
        return True

    def latest(self, at_most: int | None = None) -> CheckpointInfo | None:
        """The newest committed checkpoint with version <= ``at_most`` (any version when None)."""
        for v in reversed(self.versions()):
            if at_most is None or v <= at_most:
                try:
                    return self.info(v)
                except CheckpointNotFoundError:  # pruned between the listing and now
                    continue
        return None

    def open(self, version: int, *, verify: bool = True, writable: bool = False) -> WeightSet:
        """Memory-map a version. ``verify`` checks the file's SHA-256 against the manifest first;
        ``writable`` gives a private copy-on-write mapping (writes never reach the store)."""
        path = self.local_path(version, verify=verify)
        ws = load_safetensors(path, writable=writable)
        if ws.version is None:
            ws.version = version
        elif ws.version != version:
            raise CheckpointIntegrityError(f"checkpoint {version} holds weights of version {ws.version}")
        return ws

    def prune(self, keep: int) -> list[int]:
        """Delete all but the newest ``keep`` (>= 1) committed versions; returns the deleted ones."""
        if keep < 1:
            raise ValueError("keep must be >= 1 (pruning must never remove the newest checkpoint)")
        doomed = self.versions()[:-keep]
        for v in doomed:
            self.delete(v)
        return doomed


class DirectoryStore(CheckpointStore):
    """Checkpoints in a local (or mounted) directory."""

    def __init__(self, root: str | os.PathLike[str]) -> None:
        self.root = Path(root).resolve()
        self.url = self.root.as_uri()

    def _dir(self, version: int) -> Path:
        return self.root / version_dirname(version)

    def put(self, version, weights, *, dtypes=None, metadata=None, exist_ok=False) -> CheckpointInfo:
        ws = _as_weight_set(version, weights, dtypes)
        existing = self._existing(version, exist_ok)
        if existing is not None:
            return existing
        vdir = self._dir(version)
        vdir.mkdir(parents=True, exist_ok=True)
        path = vdir / CHECKPOINT_FILE
        save_safetensors(path, ws)  # temp + fsync + rename
        # Hash after writing: the file is still in the page cache, and the hash is of the exact bytes
        # readers will see (not of a serialisation we believe matches them).
        digest, size = file_sha256(path)
        return self._commit(version, path, digest, size, metadata)

    def put_file(self, version, path, *, metadata=None, exist_ok=False) -> CheckpointInfo:
        version_dirname(version)
        src = Path(path)
        read_header(src)  # refuse what is not a safetensors file before copying anything
        existing = self._existing(version, exist_ok)
        if existing is not None:
            return existing
        vdir = self._dir(version)
        vdir.mkdir(parents=True, exist_ok=True)
        digest, size = _copy_hashing(src, vdir, CHECKPOINT_FILE)
        return self._commit(version, vdir / CHECKPOINT_FILE, digest, size, metadata)

    def _existing(self, version: int, exist_ok: bool) -> CheckpointInfo | None:
        if not (self._dir(version) / MANIFEST_FILE).exists():
            return None
        if exist_ok:
            return self.info(version)
        raise CheckpointExistsError(f"checkpoint {version} already exists in {self.url}")

    def _commit(self, version, path: Path, digest: str, size: int, metadata) -> CheckpointInfo:
        tensor_bytes, count = _describe(path)
        info = CheckpointInfo(version, digest, size, tensor_bytes, count, time.time(), dict(metadata or {}), str(path))
        _fsync_dir(path.parent)  # the file's rename is durable before the manifest that names it
        self._write_manifest(path.parent / MANIFEST_FILE, info.to_json())
        self._write_index()
        return info

    def _write_index(self) -> None:
        """``index.json``: the committed versions from a fresh scan (what an HTTP reader lists; advisory, a
        reader still finds a listed version gone when it was pruned since)."""
        doc = {"format": INDEX_FORMAT, "versions": self.versions()}
        _write_atomic(self.root / INDEX_FILE, json.dumps(doc).encode())

    def _write_manifest(self, path: Path, data: bytes) -> None:
        _write_atomic(path, data)

    def versions(self) -> list[int]:
        if not self.root.is_dir():
            return []
        out = []
        for entry in os.scandir(self.root):
            v = parse_version_dirname(entry.name)
            if v is not None and os.path.exists(os.path.join(entry.path, MANIFEST_FILE)):
                out.append(v)
        return sorted(out)

    def info(self, version: int) -> CheckpointInfo:
        vdir = self._dir(version)
        try:
            raw = (vdir / MANIFEST_FILE).read_bytes()
        except FileNotFoundError:
            raise CheckpointNotFoundError(f"no checkpoint {version} in {self.url}") from None
        return CheckpointInfo.from_json(raw, expect_version=version, location=str(vdir / CHECKPOINT_FILE))

    def local_path(self, version: int, *, verify: bool = True) -> Path:
        info = self.info(version)
        path = Path(info.location)
        try:
            size = path.stat().st_size
        except FileNotFoundError:
            raise CheckpointIntegrityError(f"checkpoint {version}: manifest present but {path} is missing") from None
        if size != info.size:
            raise CheckpointIntegrityError(f"checkpoint {version}: {path} has {size} bytes, manifest says {info.size}")
        if verify:
            digest, _ = file_sha256(path)
            if digest != info.sha256:
                raise CheckpointIntegrityError(
                    f"checkpoint {version}: SHA-256 of {path} is {digest}, manifest says {info.sha256}"
                )
        return path

    def delete(self, version: int) -> bool:
        vdir = self._dir(version)
        manifest = vdir / MANIFEST_FILE
        existed = manifest.exists()
        manifest.unlink(missing_ok=True)  # invisible from here on; open mmaps stay valid (POSIX)
        if vdir.exists():
            _fsync_dir(vdir)
            shutil.rmtree(vdir, ignore_errors=True)
        if existed:
            self._write_index()
        return existed

    def prune(self, keep: int) -> list[int]:
        doomed = super().prune(keep)
        # Leftovers of writers that died before their manifest, older than the newest kept version
        # (a newer incomplete folder may belong to a writer that is still running).
        kept = self.versions()
        if kept and self.root.is_dir():
            for entry in os.scandir(self.root):
                v = parse_version_dirname(entry.name)
                if v is not None and v < kept[-1] and not os.path.exists(os.path.join(entry.path, MANIFEST_FILE)):
                    shutil.rmtree(entry.path, ignore_errors=True)
        return doomed


# ---------------------------------------------------------------------------------------------------------
# S3-compatible object stores


def s3_keys(prefix: str, version: int) -> tuple[str, str]:
    """(model key, manifest key) of a version under ``prefix`` (no leading/trailing slashes needed)."""
    base = f"{prefix.strip('/')}/{version_dirname(version)}".lstrip("/")
    return f"{base}/{CHECKPOINT_FILE}", f"{base}/{MANIFEST_FILE}"


def parse_s3_manifest_key(prefix: str, key: str) -> int | None:
    p = prefix.strip("/")
    rest = key[len(p) + 1 :] if p and key.startswith(p + "/") else (key if not p else None)
    if rest is None:
        return None
    parts = rest.split("/")
    if len(parts) != 2 or parts[1] != MANIFEST_FILE:
        return None
    return parse_version_dirname(parts[0])


def _s3_missing(exc: BaseException) -> bool:
    code = str(getattr(exc, "response", {}).get("Error", {}).get("Code", ""))
    return code in {"NoSuchKey", "404", "NotFound"}


class S3Store(CheckpointStore):
    """Checkpoints in an S3-compatible bucket (AWS S3, MinIO, Ceph RGW...) through boto3.

    URL: ``s3://bucket/prefix[?endpoint=http://host:9000&region=us-east-1]``; credentials come from
    boto3's usual chain (environment, config files). PUT of one object is atomic in S3, so uploading the
    file first and the manifest last gives the same visibility rule as the directory store. Opened
    checkpoints are downloaded to ``cache_dir`` (verified, then renamed into place) and memory-mapped.
    """

    def __init__(
        self,
        url: str,
        *,
        client: Any | None = None,
        cache_dir: str | os.PathLike[str] | None = None,
    ) -> None:
        parsed = urlparse(url)
        if parsed.scheme != "s3" or not parsed.netloc:
            raise ValueError(f"not an s3:// URL: {url!r}")
        self.url = url
        self.bucket = parsed.netloc
        self.prefix = unquote(parsed.path).strip("/")
        query = {k: v[-1] for k, v in parse_qs(parsed.query).items()}
        if client is None:
            try:
                import boto3  # optional dependency: only s3:// stores need it
            except ImportError:
                raise CheckpointError(f"{url}: the S3 checkpoint store needs boto3 (pip install boto3)") from None
            client = boto3.client(
                "s3", endpoint_url=query.get("endpoint") or None, region_name=query.get("region") or None
            )
        self.client = client
        default_cache = Path(os.environ.get("ROLLART_CHECKPOINT_CACHE", Path.home() / ".cache/rollart/checkpoints"))
        self.cache_root = Path(cache_dir or default_cache) / self.bucket / (self.prefix or "_root")

    def keys(self, version: int) -> tuple[str, str]:
        return s3_keys(self.prefix, version)

    def _existing(self, version: int, exist_ok: bool) -> CheckpointInfo | None:
        try:
            info = self.info(version)
        except CheckpointNotFoundError:
            return None
        if exist_ok:
            return info
        raise CheckpointExistsError(f"checkpoint {version} already exists in {self.url}")

    def put(self, version, weights, *, dtypes=None, metadata=None, exist_ok=False) -> CheckpointInfo:
        ws = _as_weight_set(version, weights, dtypes)
        existing = self._existing(version, exist_ok)
        if existing is not None:
            return existing
        self.cache_root.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(dir=self.cache_root, prefix=".upload-") as tmp:
            path = Path(tmp) / CHECKPOINT_FILE
            save_safetensors(path, ws)
            return self._upload(version, path, metadata)

    def put_file(self, version, path, *, metadata=None, exist_ok=False) -> CheckpointInfo:
        version_dirname(version)
        read_header(path)
        existing = self._existing(version, exist_ok)
        if existing is not None:
            return existing
        return self._upload(version, Path(path), metadata)

    def _upload(self, version: int, path: Path, metadata) -> CheckpointInfo:
        digest, size = file_sha256(path)
        tensor_bytes, count = _describe(path)
        model_key, manifest_key = self.keys(version)
        self.client.upload_file(str(path), self.bucket, model_key)  # multipart for large files
        info = CheckpointInfo(
            version, digest, size, tensor_bytes, count, time.time(), dict(metadata or {}),
            f"s3://{self.bucket}/{model_key}",
        )  # fmt: skip
        self.client.put_object(Bucket=self.bucket, Key=manifest_key, Body=info.to_json())  # commit point
        return info

    def versions(self) -> list[int]:
        out: list[int] = []
        kwargs: dict[str, Any] = {"Bucket": self.bucket, "Prefix": f"{self.prefix}/" if self.prefix else ""}
        while True:
            page = self.client.list_objects_v2(**kwargs)
            for obj in page.get("Contents", []) or []:
                v = parse_s3_manifest_key(self.prefix, obj["Key"])
                if v is not None:
                    out.append(v)
            if not page.get("IsTruncated"):
                return sorted(set(out))
            kwargs["ContinuationToken"] = page["NextContinuationToken"]

    def info(self, version: int) -> CheckpointInfo:
        model_key, manifest_key = self.keys(version)
        try:
            raw = self.client.get_object(Bucket=self.bucket, Key=manifest_key)["Body"].read()
        except Exception as e:
            if _s3_missing(e):
                raise CheckpointNotFoundError(f"no checkpoint {version} in {self.url}") from None
            raise
        return CheckpointInfo.from_json(raw, expect_version=version, location=f"s3://{self.bucket}/{model_key}")

    def local_path(self, version: int, *, verify: bool = True) -> Path:
        info = self.info(version)
        vdir = self.cache_root / version_dirname(version)
        cached = cached_checkpoint(vdir, info, verify)
        if cached is not None:
            return cached
        path, stamp = vdir / CHECKPOINT_FILE, vdir / f".{info.sha256}.verified"
        vdir.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{CHECKPOINT_FILE}.tmp-", dir=vdir)
        os.close(fd)
        try:
            self.client.download_file(self.bucket, self.keys(version)[0], tmp)
            digest, size = file_sha256(tmp)
            if digest != info.sha256 or size != info.size:
                raise CheckpointIntegrityError(
                    f"checkpoint {version} from {info.location}: downloaded {size} bytes with SHA-256 {digest}, "
                    f"manifest says {info.size} bytes, {info.sha256}"
                )
            os.replace(tmp, path)
        finally:
            Path(tmp).unlink(missing_ok=True)
        stamp.touch()  # a downloaded, verified copy: later opens skip the download
        return path

    def delete(self, version: int) -> bool:
        model_key, manifest_key = self.keys(version)
        existed = self.has(version)
        self.client.delete_object(Bucket=self.bucket, Key=manifest_key)  # invisible first
        self.client.delete_object(Bucket=self.bucket, Key=model_key)
        shutil.rmtree(self.cache_root / version_dirname(version), ignore_errors=True)
        return existed


def checkpoint_routes(env: Mapping[str, str] | None = None) -> dict[str, str]:
    """``$ROLLART_CHECKPOINT_ROUTES``: where this process reads a store from (with ``cluster.regions`` the launcher
    maps the trainer's checkpoint folder to the HTTP server in the trainer's region, through this region's link)."""
    raw = (os.environ if env is None else env).get(ROUTES_ENV, "")
    if not raw:
        return {}
    try:
        routes = json.loads(raw)
        if not isinstance(routes, dict) or not all(
            isinstance(k, str) and isinstance(v, str) for k, v in routes.items()
        ):
            raise ValueError("expected a JSON object of strings")
    except ValueError as e:
        raise ValueError(f"{ROUTES_ENV} is malformed: {e}") from None
    return routes


def route(url: str, routes: Mapping[str, str]) -> str:
    """``url`` with the longest matching route prefix (a path, ``file://`` URL or URL; whole path segments only)
    replaced by its target."""
    norm = unquote(urlparse(url).path) if url.startswith("file://") else url
    if "://" not in norm:
        norm = os.path.normpath(os.path.abspath(norm))
    for prefix in sorted(routes, key=len, reverse=True):
        key = unquote(urlparse(prefix).path) if prefix.startswith("file://") else prefix
        key = os.path.normpath(os.path.abspath(key)) if "://" not in key else key.rstrip("/")
        if norm == key or norm.startswith(key + "/"):
            return routes[prefix].rstrip("/") + norm[len(key) :]
    return url


def open_store(url: str | os.PathLike[str], **kwargs: Any) -> CheckpointStore:
    """A store for ``url``: ``s3://bucket/prefix``, ``http(s)://host:port/prefix`` (read-only), ``file:///abs/dir``,
    or a plain path; first routed by ``$ROLLART_CHECKPOINT_ROUTES`` when that is set."""
    text = route(os.fspath(url), checkpoint_routes())
    parsed = urlparse(text)
    if parsed.scheme == "s3":
        return S3Store(text, **kwargs)
    if parsed.scheme in ("http", "https"):
        from .http_store import HttpStore

        return HttpStore(text, **kwargs)
    if parsed.scheme == "file":
        if parsed.netloc not in ("", "localhost"):
            raise ValueError(f"file:// URL with a remote host is not supported: {text!r}")
        return DirectoryStore(unquote(parsed.path), **kwargs)
    if parsed.scheme and len(parsed.scheme) > 1:  # one letter: a Windows drive, not a scheme
        raise ValueError(f"unsupported checkpoint store URL scheme {parsed.scheme!r} in {text!r}")
    return DirectoryStore(text, **kwargs)
