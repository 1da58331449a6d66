"""Full-weight buckets through a real ``mooncake_master`` and real clients (a peer process where it matters).

Covers: exactness of the real tiny Qwen3 and of a synthetic model split into several buckets, uncommitted
versions staying invisible, hash/size mismatches, a lost bucket (never a partial set), the master
restarted (pull fails clearly, the publisher republishes, pull succeeds), and a dead or hung master
(a clear error within a bounded time); plus `rollart up` starting the master.
"""

from __future__ import annotations

import importlib.util
import json
import os
import queue
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest

from rollart.delta import load_safetensors
from rollart.local import cluster
from rollart.local.mooncake import mooncake_master_binary, start_mooncake_master
from rollart.local.processes import free_port, pid_alive
from rollart.weights.buckets import (
    BucketPublisher,
    BucketReader,
    MooncakeClient,
    MooncakeConfig,
    MooncakeUnavailableError,
    StoreFullError,
    WeightsIntegrityError,
    WeightsNotFoundError,
    manifest_key,
)
from tests.integration.weights.bucket_testlib import JOB, MIB, assert_same, digest, synthetic_model

ROOT = Path(__file__).resolve().parents[3]

pytestmark = pytest.mark.skipif(
    mooncake_master_binary() is None or importlib.util.find_spec("mooncake") is None,
    reason="mooncake (mooncake-transfer-engine-non-cuda) is not installed",
)


class Peer:
    """A second client process (tests/integration/weights/_bucket_peer.py)."""

    def __init__(self, log: Path) -> None:
        self.log = log.open("wb")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "tests.integration.weights._bucket_peer"],
            cwd=ROOT,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self.log,
            text=True,
        )
        self.lines: queue.Queue[str] = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        for line in self.proc.stdout:
            self.lines.put(line)

    def call(self, op: str, timeout: float = 30, **kw) -> dict:
        self.proc.stdin.write(json.dumps({"op": op, **kw}) + "\n")
        self.proc.stdin.flush()
        try:
            return json.loads(self.lines.get(timeout=timeout))
        except queue.Empty:
            raise AssertionError(f"peer gave no answer to {op} in {timeout}s; log: {self.log.name}") from None

    def ok(self, op: str, **kw) -> dict:
        answer = self.call(op, **kw)
        assert answer["ok"], answer
        return answer

    def close(self) -> None:
        if self.proc.poll() is None:
            try:
                self.proc.stdin.write(json.dumps({"op": "exit"}) + "\n")
                self.proc.stdin.flush()
                self.proc.wait(10)
            except (OSError, subprocess.TimeoutExpired):
                self.proc.kill()
                self.proc.wait()
        self.log.close()


@pytest.fixture
def master(tmp_path):
    m = start_mooncake_master(tmp_path / "mooncake")
    yield m
    if m.proc is not None and m.alive():
        m.proc.signal(signal.SIGCONT)  # in case a test left it stopped
    m.stop()


@pytest.fixture
def peers(tmp_path):
    made: list[Peer] = []

    def make() -> Peer:
        p = Peer(tmp_path / f"peer{len(made)}.log")
        made.append(p)
        return p

    yield make
    for p in made:
        p.close()


@pytest.fixture
def reader(master):
    r = BucketReader(MooncakeConfig(master.address), JOB)
    yield r
    r.close()


@pytest.fixture(scope="module")
def tiny_qwen3(tmp_path_factory) -> Path:
    if importlib.util.find_spec("rollart_devtools") is None or importlib.util.find_spec("torch") is None:
        pytest.skip("the tiny Qwen3 builder needs rollart-devtools and torch")
    out = tmp_path_factory.mktemp("tiny-qwen3")
    proc = subprocess.run(
        [str(Path(sys.executable).parent / "rollart-devtools"), "tiny-model", "--out", str(out), "--pretrain-steps", "0"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    return out / "model.safetensors"


def test_tiny_qwen3_exact_across_processes(master, peers, reader, tiny_qwen3):
    pub = peers()
    pub.ok("connect", master=master.address, role="publisher", bucket_bytes=1 << 30)
    assert pub.ok("publish", version=1, file=str(tiny_qwen3))["buckets"] == 1
    got = reader.pull()
    want = load_safetensors(tiny_qwen3)
    assert got.weights.version == 1 and len(got.manifest.buckets) == 1
    assert set(got.weights.dtypes.values()) == set(want.dtypes.values())
    assert_same(got.weights, want)
    # The reader's arrays are its own memory: the publisher going away does not touch them.
    pub.close()
    assert_same(got.weights, want)


def test_synthetic_model_in_several_buckets_across_processes(master, peers):
    pub, act = peers(), peers()
    pub.ok("connect", master=master.address, role="publisher", bucket_bytes=MIB)
    act.ok("connect", master=master.address, role="reader")
    assert pub.ok("publish", version=1, synthetic=1)["buckets"] == 4
    got = act.ok("pull")
    assert (got["version"], got["digest"]) == (1, digest(synthetic_model(1)))
    # In this process too (a third client), with the layout checked.
    with MooncakeClient(MooncakeConfig(master.address)) as client:
        got = BucketReader(client, JOB).pull(1)
        assert_same(got.weights, synthetic_model(1))
        straddling = [t for t in got.manifest.tensors if t.offset // MIB != (t.offset + t.nbytes - 1) // MIB]
        assert straddling, "some tensor should cross a bucket boundary"
        assert all(t.offset % 64 == 0 for t in got.manifest.tensors)
    # The next version replaces it; keep_versions=1 prunes v1.
    pub.ok("publish", version=2, synthetic=2)
    assert act.ok("pull")["digest"] == digest(synthetic_model(2))
    gone = act.call("pull", version=1)
    assert gone["error"] == "WeightsNotFoundError", gone


def test_uncommitted_version_is_invisible(master, peers, reader):
    pub = peers()
    pub.ok("connect", master=master.address, role="publisher", bucket_bytes=MIB, keep=2)
    pub.ok("publish", version=1, synthetic=1)
    pub.ok("prepare", version=2, synthetic=2)  # every bucket written, manifest not yet
    with pytest.raises(WeightsNotFoundError, match="v2 is not in the Mooncake store"):
        reader.pull(2)
    assert_same(reader.pull().weights, synthetic_model(1))  # "latest" is still v1
    pub.ok("commit", version=2)
    assert_same(reader.pull().weights, synthetic_model(2))
    assert_same(reader.pull(1).weights, synthetic_model(1))  # keep=2 keeps v1


def test_corrupted_or_resized_bucket_is_rejected(master, reader):
    pub = BucketPublisher(MooncakeConfig(master.address), JOB, bucket_bytes=MIB)
    try:
        m = pub.publish(5, synthetic_model(5))
        victim = m.buckets[2]
        good = pub.client.get_bytes(victim.key)
        flipped = bytearray(good)
        flipped[len(flipped) // 2] ^= 0x01
        for bad, match in [
            (bytes(flipped), "SHA-256"),  # one bit
            (good[:-1], "read"),  # one byte short
            (good + b"\0", "not the"),  # one byte long
        ]:
            pub.client.upsert_bytes(victim.key, bad)
            with pytest.raises(WeightsIntegrityError, match=match):
                reader.pull(5)
        pub.client.upsert_bytes(victim.key, good)
        assert_same(reader.pull(5).weights, synthetic_model(5))
        pub.client.upsert_bytes(manifest_key(reader.ns, 5), b'{"format": "something else"}')
        with pytest.raises(WeightsIntegrityError, match="malformed"):
            reader.pull(5)
        assert pub.ensure_published()  # the manifest differs from what was published: put back
        assert_same(reader.pull(5).weights, synthetic_model(5))
    finally:
        pub.close()


def test_lost_bucket_never_gives_a_partial_set(master, peers, reader):
    pub = peers()
    pub.ok("connect", master=master.address, role="publisher", bucket_bytes=MIB)
    n = pub.ok("publish", version=3, synthetic=3)["buckets"]
    m = reader.manifest(3)
    reader.client.remove([m.buckets[-1].key])  # a segment lost, an object evicted...
    with pytest.raises(WeightsNotFoundError, match=f"1 of {n} buckets are missing"):
        reader.pull()
    assert pub.ok("ensure")["republished"] is True
    assert_same(reader.pull().weights, synthetic_model(3))


def test_master_restart_pull_fails_then_republish(master, peers, reader):
    pub = peers()
    pub.ok("connect", master=master.address, role="publisher", bucket_bytes=MIB)
    pub.ok("publish", version=7, synthetic=7)
    assert_same(reader.pull().weights, synthetic_model(7))
    master.restart()  # same ports, empty store
    with pytest.raises(WeightsNotFoundError, match="master restarted"):
        reader.pull()
    with pytest.raises(WeightsNotFoundError):
        reader.pull(7)
    assert pub.ok("ensure")["republished"] is True
    got = reader.pull()
    assert got.weights.version == 7
    assert_same(got.weights, synthetic_model(7))
    assert pub.ok("ensure")["republished"] is False


def test_master_restart_between_buckets_and_commit(master, peers, reader):
    pub = peers()
    pub.ok("connect", master=master.address, role="publisher", bucket_bytes=MIB)
    pub.ok("prepare", version=1, synthetic=1)
    master.restart()  # the buckets written so far are forgotten
    pub.ok("commit", version=1)  # puts the lost buckets back before the manifest
    assert_same(reader.pull().weights, synthetic_model(1))


def test_full_store_is_a_clear_error(master, reader):
    pub = BucketPublisher(MooncakeConfig(master.address, segment_bytes=16 * MIB), JOB, bucket_bytes=4 * MIB)
    try:
        pub.publish(1, synthetic_model(1))  # 3.9 MB fits
        big = {"w": np.zeros(24 * MIB, np.uint8)}
        with pytest.raises(StoreFullError, match="full"):
            pub.publish(2, big)
        assert_same(reader.pull().weights, synthetic_model(1))  # the failed publish left v1 alone
        with pytest.raises(WeightsNotFoundError):
            reader.pull(2)
    finally:
        pub.close()


def test_master_down_fails_within_bounded_time(master, tmp_path):
    dead = f"127.0.0.1:{free_port()}"
    t0 = time.monotonic()
    with pytest.raises(MooncakeUnavailableError, match="unreachable"):
        BucketReader(MooncakeConfig(dead), JOB).latest()
    assert time.monotonic() - t0 < 3

    pub = BucketPublisher(MooncakeConfig(master.address), JOB, bucket_bytes=MIB)
    reader = BucketReader(MooncakeConfig(master.address), JOB)
    try:
        pub.publish(1, synthetic_model(1))
        assert_same(reader.pull().weights, synthetic_model(1))
        master.kill()
        for call in (reader.pull, lambda: pub.publish(2, synthetic_model(2))):
            t0 = time.monotonic()
            with pytest.raises(MooncakeUnavailableError, match="unavailable"):
                call()
            assert time.monotonic() - t0 < 8  # the library blocks ~4 s per call on a dead master
    finally:
        master.start()  # closing a client against a dead master blocks for many seconds
        pub.close()
        reader.close()


def test_hung_master_fails_within_rpc_timeout(master, peers):
    pub, act = peers(), peers()
    pub.ok("connect", master=master.address, role="publisher", bucket_bytes=MIB)
    act.ok("connect", master=master.address, role="reader", rpc_timeout_ms=1500)
    pub.ok("publish", version=1, synthetic=1)
    master.proc.signal(signal.SIGSTOP)  # alive, accepting connections, answering nothing
    try:
        answer = act.call("pull", timeout=30)
    finally:
        master.proc.signal(signal.SIGCONT)
    assert answer["error"] == "MooncakeUnavailableError" and "RPC_TIMEOUT" in answer["message"], answer
    assert answer["elapsed"] < 8


def test_rollart_up_starts_a_mooncake_master(tmp_path, monkeypatch):
    monkeypatch.delenv("ROLLART_MOONCAKE_MASTER", raising=False)
    state_dir = tmp_path / "state"
    state = cluster.up(state_dir, only=[], with_mooncake=True, log=lambda _m: None)
    try:
        info = state["mooncake"]
        assert json.loads((state_dir / "state.json").read_text())["mooncake"] == info
        with MooncakeClient(MooncakeConfig(info["address"], segment_bytes=8 * MIB)) as client:
            client.upsert_bytes("rollart/up-test/x", b"hello")
            assert client.get_bytes("rollart/up-test/x") == b"hello"
    finally:
        assert cluster.down(state_dir, log=lambda _m: None)
    assert not pid_alive(info["pid"])
    assert os.environ.get("ROLLART_MOONCAKE_MASTER") is None
