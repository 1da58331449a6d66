"""Read-only full checkpoints over HTTP: ``http://host:port/prefix`` serving a :class:`DirectoryStore`'s folder as
static files (``v<12 digits>/manifest.json`` + ``model.safetensors``, and the store's ``index.json``).

A version is read by two GETs: its manifest (at most ``MAX_MANIFEST_BYTES``), then its file, streamed to a
temporary file in the local cache while hashed, checked against the manifest's size and SHA-256, and only then
renamed into place (a ``.<sha256>.verified`` stamp lets later opens skip the download). With S streams
(``ROLLART_CHECKPOINT_STREAMS``, default 1: that one GET) the file is read as S parallel Range GETs, each written
at its offset, then hashed from the temporary file before the same checks: one TCP flow over a long-RTT link
gets its window / RTT, S flows up to S times it. A server that ignores Range (200, the whole file) is read as one
stream, with a warning. Refused with a
:class:`CheckpointError`: a 404 (:class:`CheckpointNotFoundError`), a server that cannot be reached or answers
another status (:class:`CheckpointUnavailableError`), a body shorter or longer than the manifest says, a bad hash
or a malformed or oversized manifest/index (:class:`CheckpointIntegrityError`). No writes: ``put``, ``put_file``
and ``delete`` raise. stdlib only (urllib). docs/weight-plane.md ("Full weights"), docs/regions.md.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import re
import shutil
import tempfile
import threading
import urllib.error
import urllib.request
from concurrent.futures import FIRST_EXCEPTION, ThreadPoolExecutor, wait
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
STREAMS_ENV = "ROLLART_CHECKPOINT_STREAMS"
MAX_STREAMS = 64
MIN_STRIPE = 64 << 10  # a smaller stripe is not worth a connection of its own
CONTENT_RANGE = re.compile(r"^bytes (\d+)-(\d+)/(\d+|\*)$")

log = logging.getLogger(__name__)


def checkpoint_streams(raw: str | None = None) -> int:
    """Parallel Range GETs per checkpoint: ``raw`` or ``$ROLLART_CHECKPOINT_STREAMS`` (unset or empty: 1)."""
    text = os.environ.get(STREAMS_ENV, "") if raw is None else raw
    if not text.strip():
        return 1
    try:
        n = int(text)
    except ValueError:
        n = 0
    if not 1 <= n <= MAX_STREAMS:
        raise ValueError(f"{STREAMS_ENV}={text!r}: expected an integer from 1 to {MAX_STREAMS} (HTTP streams)")
    return n


class _Stopped(Exception):
    """A stripe given up because another failed."""


class CheckpointUnavailableError(CheckpointError):
    """The server cannot be reached, timed out, or answered neither the file nor 404."""

    grpc_status = "UNAVAILABLE"


class HttpStore(CheckpointStore):
    """Checkpoints read from a static HTTP server (busybox httpd, python -m http.server, nginx...) over the folder
    a :class:`DirectoryStore` writes. ``cache_dir``: where downloads go (default ``$ROLLART_CHECKPOINT_CACHE`` or
    ``~/.cache/rollart/checkpoints``, then ``host_port/prefix``); ``streams``: Range GETs per file (default
    ``$ROLLART_CHECKPOINT_STREAMS``, else 1)."""

    def __init__(
        self,
        url: str,
        *,
        cache_dir: str | os.PathLike[str] | None = None,
        timeout: float = 60.0,
        streams: int | None = None,
    ) -> None:
        self.streams = checkpoint_streams(None if streams is None else str(streams))
        self._warned_range = False
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

    def _open(self, rel: str, what: str, headers: dict[str, str] | None = None) -> Any:
        url = f"{self.base}/{rel}"
        try:
            return urllib.request.urlopen(urllib.request.Request(url, headers=headers or {}), timeout=self.timeout)  # noqa: S310
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
        stripes = min(self.streams, info.size // MIN_STRIPE)
        if stripes > 1:
            return self._download_striped(version, info, out, stripes)
        return self._read_body(self._open(rel, f"checkpoint {version}"), version, info, out)

    def _read_body(self, resp: Any, version: int, info: CheckpointInfo, out: Any) -> tuple[str, int]:
        h = hashlib.sha256()
        size = 0
        buf = bytearray(min(_CHUNK, 1 << 20))
        view = memoryview(buf)
        with resp:
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

    def _download_striped(self, version: int, info: CheckpointInfo, out: Any, stripes: int) -> tuple[str, int]:
        """``stripes`` parallel Range GETs, each written at its offset of ``out``'s file; then the file's hash."""
        rel, what = f"{version_dirname(version)}/{CHECKPOINT_FILE}", f"checkpoint {version}"
        step = -(-info.size // stripes)
        spans = [(a, min(a + step, info.size) - 1) for a in range(0, info.size, step)]
        first = self._open(rel, what, {"Range": f"bytes={spans[0][0]}-{spans[0][1]}"})
        if first.status == 200:  # Range ignored: this answer is the whole file, read as one stream
            if not self._warned_range:
                self._warned_range = True
                log.warning("%s ignores Range requests: checkpoints read as one stream, not %d", self.base, stripes)
            return self._read_body(first, version, info, out)
        out.flush()
        fd, stop = out.fileno(), threading.Event()
        with ThreadPoolExecutor(len(spans), thread_name_prefix="checkpoint-stripe") as pool:
            futures = [
                pool.submit(self._stripe, rel, version, info, span, fd, stop, first if i == 0 else None)
                for i, span in enumerate(spans)
            ]
            done, _ = wait(futures, return_when=FIRST_EXCEPTION)
            if any(f.exception() for f in done):
                stop.set()  # the others give up at their next read
        errors = [e for f in futures if (e := f.exception()) is not None and not isinstance(e, _Stopped)]
        if errors:
            raise errors[0]
        h = hashlib.sha256()
        pos = 0
        while pos < info.size and (chunk := os.pread(fd, min(_CHUNK, info.size - pos), pos)):
            h.update(chunk)
            pos += len(chunk)
        return h.hexdigest(), pos

    def _stripe(
        self,
        rel: str,
        version: int,
        info: CheckpointInfo,
        span: tuple[int, int],
        fd: int,
        stop: threading.Event,
        resp: Any = None,
    ) -> None:
        start, end = span
        where = f"checkpoint {version} from {info.location}, bytes {start}-{end}"
        if resp is None:
            if stop.is_set():
                raise _Stopped
            resp = self._open(rel, f"checkpoint {version}", {"Range": f"bytes={start}-{end}"})
        pos = start
        with resp:
            m = CONTENT_RANGE.match(resp.headers.get("Content-Range", "").strip())
            if resp.status != 206 or not m or (int(m[1]), int(m[2])) != span or m[3] not in ("*", str(info.size)):
                raise CheckpointIntegrityError(
                    f"{where}: the server answered {resp.status} "
                    f"Content-Range {resp.headers.get('Content-Range')!r}, not those bytes of {info.size}"
                )
            buf = bytearray(min(_CHUNK, 1 << 20))
            view = memoryview(buf)
            try:
                while pos <= end and (n := resp.readinto(buf)):
                    if stop.is_set():
                        raise _Stopped
                    if pos + n > end + 1:
                        raise CheckpointIntegrityError(f"{where}: more bytes than asked for")
                    written = 0
                    while written < n:
                        written += os.pwrite(fd, view[written:n], pos + written)
                    pos += n
            except (CheckpointError, _Stopped):
                raise
            except Exception as e:  # http.client.IncompleteRead, a reset connection: the stripe stopped short
                raise CheckpointIntegrityError(
                    f"{where}: short read, {pos - start} of {end + 1 - start} ({e!r})"
                ) from None
        if pos != end + 1:
            raise CheckpointIntegrityError(f"{where}: short read, {pos - start} of {end + 1 - start} bytes")

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
