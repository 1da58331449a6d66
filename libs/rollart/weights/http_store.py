"""Read-only full checkpoints over HTTP: ``http://host:port/prefix`` serving a :class:`DirectoryStore`'s folder as
static files (``v<12 digits>/manifest.json`` + ``model.safetensors``, and the store's ``index.json``).

A version is read by two GETs: its manifest (at most ``MAX_MANIFEST_BYTES``), then its file, streamed to a
temporary file in the local cache while hashed, checked against the manifest's size and SHA-256, and only then
renamed into place (a ``.<sha256>.verified`` stamp lets later opens skip the download). Refused with a
:class:`CheckpointError`: a 404 (:class:`CheckpointNotFoundError`), a server that cannot be reached or answers
another status (:class:`CheckpointUnavailableError`), a body shorter or longer than the manifest says, a bad hash
or a malformed or oversized manifest/index (:class:`CheckpointIntegrityError`). No writes: ``put``, ``put_file``
and ``delete`` raise. stdlib only (urllib). docs/weight-plane.md ("Full weights"), docs/regions.md.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import tempfile
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from .checkpoint_store import (
    _CHUNK,
    CHECKPOINT_FILE,
    INDEX_FILE,
    MANIFEST_FILE,
    CheckpointError,
    CheckpointInfo,
    CheckpointIntegrityError,
    CheckpointNotFoundError,
    CheckpointStore,
    cached_checkpoint,
    parse_version_dirname,
    version_dirname,
)

MAX_MANIFEST_BYTES = 64 << 10  # a manifest is ~400 bytes; its metadata is a few keys
MAX_INDEX_BYTES = 8 << 20  # index.json or a directory listing: ~20 bytes per version
KEEP_CACHED = 3  # versions kept in the local cache (the newest; an open mmap survives its file's removal)


class CheckpointUnavailableError(CheckpointError):
    """The server cannot be reached, timed out, or answered neither the file nor 404."""

    grpc_status = "UNAVAILABLE"


class HttpStore(CheckpointStore):
    """Checkpoints read from a static HTTP server (busybox httpd, python -m http.server, nginx...) over the folder
    a :class:`DirectoryStore` writes. ``cache_dir``: where downloads go (default ``$ROLLART_CHECKPOINT_CACHE`` or
    ``~/.cache/rollart/checkpoints``, then ``host_port/prefix``)."""

    def __init__(self, url: str, *, cache_dir: str | os.PathLike[str] | None = None, timeout: float = 60.0) -> None:
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"not an http(s):// URL: {url!r}")
        if parts.username or parts.password:
            raise ValueError(f"credentials in a checkpoint store URL are not supported: {parts.hostname}")
        if parts.query or parts.fragment:
            raise ValueError(f"a checkpoint store URL takes no query or fragment: {url!r}")
        parts.port  # noqa: B018 - a bad port raises ValueError here, not at the first GET
        self.url = url
        self.base = url.rstrip("/")
        self.timeout = timeout
        self.prefix = parts.path.strip("/")
        default = Path(os.environ.get("ROLLART_CHECKPOINT_CACHE", Path.home() / ".cache/rollart/checkpoints"))
        netloc = re.sub(r"[^A-Za-z0-9._-]", "_", parts.netloc)
        self.cache_root = Path(cache_dir or default) / netloc / (self.prefix.replace("/", "_") or "_root")

    # -- HTTP ------------------------------------------------------------------------------------------------

    def _open(self, rel: str, what: str) -> Any:
        url = f"{self.base}/{rel}"
        try:
            return urllib.request.urlopen(urllib.request.Request(url), timeout=self.timeout)  # noqa: S310
        except urllib.error.HTTPError as e:
            e.close()
            if e.code == 404:
                raise CheckpointNotFoundError(f"no {what} at {url} (404)") from None
            raise CheckpointUnavailableError(f"{what}: GET {url} answered {e.code} {e.reason}") from None
        except (urllib.error.URLError, OSError) as e:
            reason = getattr(e, "reason", e)
            raise CheckpointUnavailableError(f"{what}: GET {url} failed: {reason}") from None

    def _get_small(self, rel: str, what: str, limit: int) -> bytes:
        with self._open(rel, what) as resp:
            length = resp.headers.get("Content-Length")
            if length is not None and length.isdigit() and int(length) > limit:
                raise CheckpointIntegrityError(f"{what} at {self.base}/{rel}: {length} bytes, more than {limit}")
            try:
                data = resp.read(limit + 1)
            except OSError as e:
                raise CheckpointUnavailableError(f"{what}: reading {self.base}/{rel} failed: {e}") from None
        if len(data) > limit:
            raise CheckpointIntegrityError(f"{what} at {self.base}/{rel}: more than {limit} bytes")
        return data

    # -- reads -----------------------------------------------------------------------------------------------

    def info(self, version: int) -> CheckpointInfo:
        vdir = version_dirname(version)
        raw = self._get_small(f"{vdir}/{MANIFEST_FILE}", f"checkpoint {version}", MAX_MANIFEST_BYTES)
        return CheckpointInfo.from_json(raw, expect_version=version, location=f"{self.base}/{vdir}/{CHECKPOINT_FILE}")

    def versions(self) -> list[int]:
        """From the store's ``index.json``; without one, from the server's directory listing (each listed
        version then checked for its manifest)."""
        try:
            raw = self._get_small(INDEX_FILE, "checkpoint index", MAX_INDEX_BYTES)
        except CheckpointNotFoundError:
            raw = None
        if raw is not None:
            try:
                doc = json.loads(raw)
                listed = doc["versions"]
                if not isinstance(listed, list) or not all(
                    isinstance(v, int) and not isinstance(v, bool) and 0 <= v < 10**12 for v in listed
                ):
                    raise ValueError("versions must be a list of integers in [0, 1e12)")
            except (ValueError, KeyError, TypeError) as e:
                raise CheckpointIntegrityError(f"{self.base}/{INDEX_FILE} is malformed: {e}") from None
            return sorted(set(listed))
        try:
            page = self._get_small("", "checkpoint listing", MAX_INDEX_BYTES).decode("utf-8", "replace")
        except CheckpointNotFoundError:
            return []
        found = {parse_version_dirname(m) for m in re.findall(r'href="(v\d{12})/?"', page)}
        return sorted(v for v in found if v is not None and self.has(v))

    def local_path(self, version: int, *, verify: bool = True) -> Path:
        info = self.info(version)
        vdir = self.cache_root / version_dirname(version)
        cached = cached_checkpoint(vdir, info, verify)
        if cached is not None:
            return cached
        path, stamp = vdir / CHECKPOINT_FILE, vdir / f".{info.sha256}.verified"
        vdir.mkdir(parents=True, exist_ok=True)
        for old in vdir.glob(".*.verified"):
            old.unlink(missing_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{CHECKPOINT_FILE}.tmp-", dir=vdir)
        try:
            with os.fdopen(fd, "wb") as out:
                digest, size = self._download(version, info, out)
                out.flush()
            if size != info.size:
                raise CheckpointIntegrityError(
                    f"checkpoint {version} from {info.location}: short read, {size} of {info.size} bytes"
                )
            if digest != info.sha256:
                raise CheckpointIntegrityError(
                    f"checkpoint {version} from {info.location}: SHA-256 {digest}, manifest says {info.sha256}"
                )
            os.replace(tmp, path)
        finally:
            Path(tmp).unlink(missing_ok=True)
        stamp.touch()
        self._prune_cache(version)
        return path

    def _download(self, version: int, info: CheckpointInfo, out: Any) -> tuple[str, int]:
        """Stream the file into ``out`` while hashing; never more than the manifest's size is accepted."""
        rel = f"{version_dirname(version)}/{CHECKPOINT_FILE}"
        h = hashlib.sha256()
        size = 0
        buf = bytearray(min(_CHUNK, 1 << 20))
        view = memoryview(buf)
        with self._open(rel, f"checkpoint {version}") as resp:
            length = resp.headers.get("Content-Length")
            if length is not None and length.isdigit() and int(length) != info.size:
                raise CheckpointIntegrityError(
                    f"checkpoint {version} from {info.location}: the server sends {length} bytes, "
                    f"manifest says {info.size}"
                )
            try:
                while n := resp.readinto(buf):
                    size += n
                    if size > info.size:
                        raise CheckpointIntegrityError(
                            f"checkpoint {version} from {info.location}: more than the manifest's {info.size} bytes"
                        )
                    h.update(view[:n])
                    out.write(view[:n])
            except CheckpointError:
                raise
            except Exception as e:  # http.client.IncompleteRead, a reset connection: the body stopped short
                raise CheckpointIntegrityError(
                    f"checkpoint {version} from {info.location}: short read, {size} of {info.size} bytes ({e!r})"
                ) from None
        return h.hexdigest(), size

    def _prune_cache(self, newest: int) -> None:
        cached = sorted(v for v in (parse_version_dirname(p.name) for p in self.cache_root.iterdir()) if v is not None)
        for v in cached[:-KEEP_CACHED]:
            if v != newest:
                shutil.rmtree(self.cache_root / version_dirname(v), ignore_errors=True)

    # -- no writes ---------------------------------------------------------------------------------------------

    def _read_only(self, *_a: Any, **_k: Any) -> Any:
        raise CheckpointError(f"{self.url} is a read-only HTTP checkpoint store (the trainer writes its folder)")

    put = put_file = delete = _read_only

    def prune(self, keep: int) -> list[int]:
        return self._read_only()
