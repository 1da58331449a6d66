"""The read-only HTTP checkpoint store against real HTTP servers in this process: python's http.server over a
directory store's folder (the honest case, index.json and the listing fallback), and a misbehaving one (short
body, a body longer than the manifest, a wrong Content-Length, a tampered file, oversized or malformed
manifest/index, a 500); routes from ROLLART_CHECKPOINT_ROUTES; the download cache."""

from __future__ import annotations

import json
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import numpy as np
import pytest

from rollart.delta import WeightSet
from rollart.local.processes import free_port
from rollart.weights import checkpoint_store as cs
from rollart.weights.checkpoint_store import (
    CheckpointError,
    CheckpointIntegrityError,
    CheckpointNotFoundError,
    DirectoryStore,
    open_store,
)
from rollart.weights.http_store import MAX_MANIFEST_BYTES, CheckpointUnavailableError, HttpStore

pytestmark = pytest.mark.timeout(60)


def weights(seed: int) -> WeightSet:
    rng = np.random.default_rng(seed)
    arrays = {
        "w": rng.integers(0, 1 << 16, (256, 64), dtype=np.uint16),
        "b": rng.standard_normal(64).astype(np.float32),
    }
    return WeightSet.from_arrays(arrays, {"w": "BF16"})


class Handler(SimpleHTTPRequestHandler):
    """Serves the folder; ``server.faults[path]`` replaces one answer: (status, headers, body, close_early)."""

    def log_message(self, *_a) -> None:  # quiet
        pass

    def do_GET(self) -> None:
        self.server.requests.append(self.path)  # type: ignore[attr-defined]
        fault = self.server.faults.get(self.path)  # type: ignore[attr-defined]
        if fault is None:
            return super().do_GET()
        status, headers, body = fault
        self.send_response(status)
        for k, v in headers.items():
            self.send_header(k, v)
        self.send_header("Connection", "close")
        self.end_headers()
        self.wfile.write(body)
        self.wfile.flush()
        self.close_connection = True


@pytest.fixture
def served(tmp_path: Path, serve_folder) -> tuple[DirectoryStore, ThreadingHTTPServer, str]:
    store = DirectoryStore(tmp_path / "ckpt")
    store.root.mkdir()
    srv, url = serve_folder(Handler, store.root, requests=[], faults={})
    return store, srv, url


def http(url: str, tmp_path: Path) -> HttpStore:
    store = open_store(url, cache_dir=tmp_path / "cache")
    assert isinstance(store, HttpStore)
    return store


def test_reads_what_the_directory_store_wrote(served, tmp_path):
    store, srv, url = served
    infos = {v: store.put(v, weights(v), metadata={"job": "j"}) for v in (1, 2, 5)}
    assert json.loads((store.root / "index.json").read_text())["versions"] == [1, 2, 5]
    remote = http(url, tmp_path)
    assert remote.versions() == [1, 2, 5]
    assert remote.latest().version == 5 and remote.latest(at_most=4).version == 2
    info = remote.info(2)
    assert (info.sha256, info.size, info.metadata) == (infos[2].sha256, infos[2].size, {"job": "j"})
    ws = remote.open(2)
    assert ws.version == 2 and ws.arrays["w"].tobytes() == weights(2).arrays["w"].tobytes()
    # Cached and verified: the next open reads the manifest again but not the file.
    srv.requests.clear()
    remote.open(2)
    assert srv.requests == ["/v000000000002/manifest.json"]
    assert not remote.has(3)
    # Deleting (pruning) on the writer's side updates the index the reader lists.
    store.prune(keep=1)
    assert remote.versions() == [5]
    with pytest.raises(CheckpointNotFoundError, match="404"):
        remote.info(1)


def test_a_folder_without_index_is_listed_from_the_servers_listing(served, tmp_path):
    store, _srv, url = served
    store.put(3, weights(3))
    store.put(4, weights(4))
    (store.root / "index.json").unlink()
    (store.root / "v000000000009").mkdir()  # a writer that died before its manifest: not listed
    assert http(url, tmp_path).versions() == [3, 4]


def test_bad_answers_are_refused_and_leave_nothing_in_the_cache(served, tmp_path):
    store, srv, url = served
    info = store.put(1, weights(1))
    path = "/v000000000001/model.safetensors"
    good = (store.root / "v000000000001" / "model.safetensors").read_bytes()
    remote = http(url, tmp_path)
    cases = [
        ((200, {"Content-Length": str(info.size)}, good[:1000]), "short read, 1000 of"),
        ((200, {}, good + b"x" * 10), "more than the manifest's"),
        ((200, {"Content-Length": str(info.size + 1)}, good + b"x"), "the server sends"),
        ((200, {"Content-Length": str(info.size)}, good[:-1] + bytes([good[-1] ^ 1])), "SHA-256"),
    ]
    for fault, message in cases:
        srv.faults[path] = fault
        with pytest.raises(CheckpointIntegrityError, match=message):
            remote.local_path(1)
        vdir = remote.cache_root / "v000000000001"
        assert not [p for p in vdir.iterdir()], f"left in the cache after {message!r}"
    srv.faults[path] = (500, {}, b"boom")
    with pytest.raises(CheckpointUnavailableError, match="500"):
        remote.local_path(1)
    del srv.faults[path]
    assert remote.open(1).arrays["b"].tobytes() == weights(1).arrays["b"].tobytes()  # the honest answer still works


@pytest.mark.parametrize(
    "body, message",
    [
        (b"x" * (MAX_MANIFEST_BYTES + 1), "more than"),
        (b"{not json", "malformed"),
        (json.dumps({"format": "rollart.checkpoint/1", "version": 1}).encode(), "malformed"),
    ],
)
def test_oversized_or_malformed_manifest(served, tmp_path, body, message):
    _store, srv, url = served
    srv.faults["/v000000000001/manifest.json"] = (200, {}, body)
    with pytest.raises(CheckpointIntegrityError, match=message):
        http(url, tmp_path).info(1)


@pytest.mark.parametrize("doc", [b"[1, 2]", b'{"versions": [1, "2"]}', b'{"versions": [-1]}', b'{"versions": [true]}'])
def test_malformed_index(served, tmp_path, doc):
    _store, srv, url = served
    srv.faults["/index.json"] = (200, {}, doc)
    with pytest.raises(CheckpointIntegrityError, match="index.json is malformed"):
        http(url, tmp_path).versions()


def test_unreachable_server_and_read_only(tmp_path):
    port = free_port("127.0.0.1")  # nothing listens there
    remote = HttpStore(f"http://127.0.0.1:{port}/ckpt", cache_dir=tmp_path, timeout=2.0)
    with pytest.raises(CheckpointUnavailableError, match="failed"):
        remote.info(1)
    for call in (lambda: remote.put(1, weights(1)), lambda: remote.delete(1), lambda: remote.prune(1)):
        with pytest.raises(CheckpointError, match="read-only"):
            call()


@pytest.mark.parametrize(
    "url",
    ["http://user:pw@127.0.0.1:1/x", "http://127.0.0.1:1/x?a=1", "http://127.0.0.1:99999/x", "http:///x", "ftp://h/x"],
)
def test_bad_urls(url, tmp_path):
    with pytest.raises(ValueError):
        HttpStore(url, cache_dir=tmp_path)


def test_cache_keeps_the_newest_versions(served, tmp_path):
    store, _srv, url = served
    remote = http(url, tmp_path)
    for v in range(1, 6):
        store.put(v, weights(v))
        remote.local_path(v)
    kept = sorted(p.name for p in remote.cache_root.iterdir())
    assert kept == ["v000000000003", "v000000000004", "v000000000005"]


def test_routes(tmp_path, monkeypatch, served):
    store, _srv, url = served
    store.put(1, weights(1))
    routes = {str(store.root): url, "s3://b/p": "http://h:1/q"}
    assert cs.route(str(store.root), routes) == url.rstrip("/")
    assert cs.route(store.root.as_uri() + "/", routes) == url.rstrip("/")
    assert cs.route(str(store.root) + "/sub", routes) == url.rstrip("/") + "/sub"
    assert cs.route(str(store.root) + "-other", routes) == str(store.root) + "-other"  # whole segments only
    assert cs.route("s3://b/p/x", routes) == "http://h:1/q/x"
    monkeypatch.setenv(cs.ROUTES_ENV, json.dumps({str(store.root): url}))
    monkeypatch.setenv("ROLLART_CHECKPOINT_CACHE", str(tmp_path / "c"))
    routed = open_store(str(store.root))
    assert isinstance(routed, HttpStore) and routed.versions() == [1]
    assert str(routed.local_path(1)).startswith(str(tmp_path / "c"))
    assert isinstance(open_store(tmp_path / "elsewhere"), DirectoryStore)
    for bad in ("{", "[]", '{"a": 1}'):
        monkeypatch.setenv(cs.ROUTES_ENV, bad)
        with pytest.raises(ValueError, match="ROLLART_CHECKPOINT_ROUTES is malformed"):
            open_store(str(store.root))
