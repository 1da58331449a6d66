"""Striped checkpoint downloads (ROLLART_CHECKPOINT_STREAMS): S Range GETs against an in-process server on
loopback that serves Range, one that ignores it (read as one stream, with a warning), stripes that come back
corrupted, short, mislabelled or cut mid-body (refused, nothing left in the cache), the variable's refusals, and
busybox httpd (the cluster's checkpoint server) answering Range."""

from __future__ import annotations

import logging
import re
import shutil
import subprocess
import time
import urllib.request
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import numpy as np
import pytest

from rollart.delta import WeightSet
from rollart.local.processes import free_port
from rollart.weights import http_store
from rollart.weights.checkpoint_store import CheckpointIntegrityError, DirectoryStore, open_store
from rollart.weights.http_store import STREAMS_ENV, HttpStore, checkpoint_streams

pytestmark = pytest.mark.timeout(60)
FILE = "/v000000000001/model.safetensors"


def weights(seed: int) -> WeightSet:
    rng = np.random.default_rng(seed)
    return WeightSet.from_arrays({"w": rng.integers(0, 1 << 16, (256, 64), dtype=np.uint16)}, {"w": "BF16"})


class RangeHandler(SimpleHTTPRequestHandler):
    """The folder, with ``Range: bytes=a-b`` answered 206 (unless ``server.ranges`` is False: then ignored, as
    python's http.server does before 3.14). ``server.faults[a]`` spoils the stripe starting at a: "flip" (one
    byte changed), "short" (half its body, then the connection closed), "label" (a wrong Content-Range)."""

    protocol_version = "HTTP/1.1"

    def log_message(self, *_a) -> None:
        pass

    def do_GET(self) -> None:
        srv = self.server
        rng = self.headers.get("Range")
        srv.requests.append((self.path, rng))  # type: ignore[attr-defined]
        m = re.fullmatch(r"bytes=(\d+)-(\d+)", rng or "")
        if self.path != FILE or not m or not srv.ranges:  # type: ignore[attr-defined]
            return super().do_GET()
        data = Path(self.translate_path(self.path)).read_bytes()
        a, b = int(m[1]), min(int(m[2]), len(data) - 1)
        body, label = data[a : b + 1], f"bytes {a}-{b}/{len(data)}"
        fault = srv.faults.get(a)  # type: ignore[attr-defined]
        if fault == "flip":
            body = body[:10] + bytes([body[10] ^ 1]) + body[11:]
        elif fault == "label":
            label = f"bytes {a + 1}-{b}/{len(data)}"
        self.send_response(206)
        self.send_header("Content-Range", label)
        self.send_header("Content-Length", str(len(body)))
        self.send_header("Connection", "close")
        self.end_headers()
        if fault == "short":
            self.wfile.write(body[: len(body) // 2])
            self.wfile.flush()
            time.sleep(0.05)
        else:
            self.wfile.write(body)
        self.close_connection = True


@pytest.fixture
def served(tmp_path: Path, monkeypatch, serve_folder) -> tuple[DirectoryStore, ThreadingHTTPServer, str]:
    monkeypatch.setattr(http_store, "MIN_STRIPE", 1024)  # a 32 KiB test file splits into S stripes
    monkeypatch.delenv(STREAMS_ENV, raising=False)
    store = DirectoryStore(tmp_path / "ckpt")
    store.root.mkdir()
    srv, url = serve_folder(RangeHandler, store.root, requests=[], faults={}, ranges=True, daemon_threads=True)
    return store, srv, url


def _file_requests(srv) -> list[str | None]:
    return [rng for path, rng in srv.requests if path == FILE]


def _cache_files(tmp_path: Path) -> list[str]:
    return sorted(p.name for p in (tmp_path / "cache").rglob("*") if p.is_file())


def test_streams_setting(monkeypatch):
    monkeypatch.delenv(STREAMS_ENV, raising=False)
    assert checkpoint_streams() == 1
    monkeypatch.setenv(STREAMS_ENV, "4")
    assert checkpoint_streams() == 4 and open_store("http://127.0.0.1:9/x").streams == 4  # type: ignore[attr-defined]
    for bad in ("0", "-1", "65", "four", "2.5"):
        monkeypatch.setenv(STREAMS_ENV, bad)
        with pytest.raises(ValueError, match=f"{STREAMS_ENV}='{re.escape(bad)}': expected an integer from 1 to 64"):
            HttpStore("http://127.0.0.1:9/")


def test_default_is_one_get_without_range(served, tmp_path):
    store, srv, url = served
    store.put(1, weights(1))
    remote = HttpStore(url, cache_dir=tmp_path / "cache")
    assert remote.streams == 1
    assert remote.open(1).arrays["w"].tobytes() == weights(1).arrays["w"].tobytes()
    assert _file_requests(srv) == [None]


@pytest.mark.parametrize("streams", [2, 3, 4, 7])
def test_stripes_cover_the_file_and_pass_its_hash(served, tmp_path, streams):
    store, srv, url = served
    info = store.put(1, weights(1))
    remote = HttpStore(url, cache_dir=tmp_path / "cache", streams=streams)
    path = remote.local_path(1)
    assert path.read_bytes() == (store.root / FILE.lstrip("/")).read_bytes()
    spans = sorted(tuple(map(int, r.removeprefix("bytes=").split("-"))) for r in _file_requests(srv))
    assert len(spans) == streams and spans[0][0] == 0 and spans[-1][1] == info.size - 1
    assert all(b + 1 == a for (_, b), (a, _) in zip(spans, spans[1:], strict=False))  # no gap, no overlap
    assert _cache_files(tmp_path) == [f".{info.sha256}.verified", "model.safetensors"]


def test_a_server_ignoring_range_is_read_as_one_stream_with_a_warning(served, tmp_path, caplog):
    store, srv, url = served
    srv.ranges = False
    store.put(1, weights(1))
    remote = HttpStore(url, cache_dir=tmp_path / "cache", streams=4)
    with caplog.at_level(logging.WARNING, logger=http_store.__name__):
        assert remote.open(1).arrays["w"].tobytes() == weights(1).arrays["w"].tobytes()
    assert len(_file_requests(srv)) == 1  # its 200 answer was the whole file: read, not fetched again
    assert "ignores Range requests" in caplog.text


@pytest.mark.parametrize(
    ("fault", "message"),
    [
        ("flip", "SHA-256"),  # a corrupted stripe: only the whole file's hash sees it
        ("short", "short read"),  # the server drops the connection mid-stripe
        ("label", "not those bytes"),  # other bytes than asked for
    ],
)
def test_a_bad_stripe_is_refused_and_leaves_nothing_in_the_cache(served, tmp_path, fault, message):
    store, srv, url = served
    info = store.put(1, weights(1))
    step = -(-info.size // 4)
    srv.faults[2 * step] = fault  # the third of four stripes
    remote = HttpStore(url, cache_dir=tmp_path / "cache", streams=4)
    with pytest.raises(CheckpointIntegrityError, match=message):
        remote.local_path(1)
    assert _cache_files(tmp_path) == []
    srv.faults.clear()
    assert remote.local_path(1).read_bytes() == (store.root / FILE.lstrip("/")).read_bytes()


@pytest.mark.skipif(shutil.which("busybox") is None, reason="busybox is not installed")
def test_busybox_httpd_serves_ranges(tmp_path, monkeypatch):
    """The cluster's checkpoint server (regions.file_server_argv) answers Range: the striped path, not the
    fallback, is what a job with ROLLART_CHECKPOINT_STREAMS gets."""
    from rollart.local.regions import file_server_argv

    monkeypatch.setattr(http_store, "MIN_STRIPE", 1024)
    store = DirectoryStore(tmp_path / "ckpt")
    store.root.mkdir()
    info = store.put(1, weights(1))
    listen = f"127.0.0.1:{free_port('127.0.0.1')}"
    proc = subprocess.Popen(file_server_argv(str(store.root), listen, "busybox"))
    try:
        url = f"http://{listen}/"
        deadline = time.monotonic() + 10
        while True:
            try:
                urllib.request.urlopen(url + "index.json", timeout=1).close()  # noqa: S310
                break
            except OSError:
                assert time.monotonic() < deadline, "busybox httpd did not start"
                time.sleep(0.05)
        req = urllib.request.Request(url + FILE.lstrip("/"), headers={"Range": "bytes=10-19"})
        with urllib.request.urlopen(req, timeout=5) as resp:  # noqa: S310
            assert resp.status == 206 and resp.read() == (store.root / FILE.lstrip("/")).read_bytes()[10:20]
        remote = HttpStore(url, cache_dir=tmp_path / "cache", streams=4)
        assert remote.local_path(1).stat().st_size == info.size
    finally:
        proc.terminate()
        proc.wait(5)
