"""The weight plane end to end on loopback: trainer -> relays -> subscribers, with faults.

Relays and (in the topology test) subscribers are real processes; the trainer's Publisher runs in the test.
"""

from __future__ import annotations

import asyncio
import json
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from rollart.delta import WeightSet, save_safetensors
from rollart.local.processes import free_port
from rollart.netem import LinkSpec, WanEmulator
from rollart.v1 import common_pb2
from rollart.weights.checkpoint_store import open_store
from rollart.weights.publisher import Publisher
from rollart.weights.subscriber import CommitError, WeightSubscriber
from tests.conftest import TOKEN
from tests.unit.weights.weights_testlib import JOB, KEY, digest, model, segments, start_relay, step

REPO = Path(__file__).resolve().parents[3]


def versions(n: int, seed: int = 0, density: float = 0.03, **kw: int) -> list[WeightSet]:
    rng = np.random.default_rng(seed)
    ws = [model(rng, **kw)]
    for _ in range(n):
        ws.append(step(rng, ws[-1], density))
    return ws


def subscriber(sid: str, sources: list[str], weights: WeightSet | None, **kw) -> WeightSubscriber:  # type: ignore[no-untyped-def]
    kw.setdefault("streams", 2)
    return WeightSubscriber(subscriber_id=sid, job=JOB, key=KEY, token=TOKEN, sources=sources, weights=weights, **kw)


async def started(subs: list[WeightSubscriber]) -> None:
    for s in subs:
        await s.start()
    await asyncio.gather(*(asyncio.wait_for(s.follower.connected_event.wait(), 20) for s in subs))


async def test_two_relays_three_subscribers_each_end_bit_identical(services, tmp_path: Path) -> None:
    ws = versions(3, layers=3)
    relays = [start_relay(services, f"relay{i}")[1] for i in range(2)]
    pub = Publisher(
        job=JOB,
        key=KEY,
        token=TOKEN,
        relays=[r["address"] for r in relays],
        streams=4,
        grpc_listen="127.0.0.1:0",
        max_segment_bytes=8192,
    )
    await pub.start()
    try:
        await pub.publish(0, ws[0])
        v0 = tmp_path / "v0.safetensors"
        save_safetensors(v0, ws[0])
        out = tmp_path / "out"
        nodes = []
        for i, r in enumerate(relays):
            other = relays[1 - i]["address"]
            argv = [
                sys.executable,
                "-m",
                "tests.integration.weights.subscriber_node",
                "--ids",
                ",".join(f"a{i}{k}" for k in range(3)),
                "--sources",
                f"{r['address']},{other},{pub.grpc_endpoint}",
                "--weights",
                str(v0),
                "--until",
                "3",
                "--out",
                str(out),
            ]
            nodes.append(services.start(f"subs{i}", argv, timeout=60)[0])
        hashes = {}
        for v in (1, 2, 3):
            res = await pub.publish(v, ws[v])
            assert all(r.ok for r in res.relays), res.relays
            # A relay is one copy per region: the trainer sent each relay the delta once.
            assert all(r.payload_bytes == res.delta_bytes for r in res.relays)
            hashes[v] = res.hash
            resp = await pub.commit(v)
            assert all(not isinstance(x, str) for x in resp.values()), resp
        deadline = time.time() + 60
        for n in nodes:
            while n.alive():
                assert time.time() < deadline, "subscribers did not reach v3"
                await asyncio.sleep(0.1)
            assert n.proc.returncode == 0
        results = {p.stem: json.loads(p.read_text()) for p in out.glob("*.json")}
        assert sorted(results) == [f"a{i}{k}" for i in range(2) for k in range(3)]
        want = digest(ws[3])
        total = sum(x.segments for x in pub.published if x.hash)
        for sid, r in results.items():
            assert r["version"] == 3 and r["digest"] == want and r["hash"] == hashes[3].hex(), (sid, r)
            assert [v for v, _ in r["applied"]] == [1, 2, 3]
            assert [h for _, h in r["applied"]] == [hashes[v].hex() for v in (1, 2, 3)]
            assert r["segments_received"] == total and r["errors"] == []
    finally:
        await pub.stop()


async def test_relay_sigkilled_mid_stream_subscribers_fall_back_and_get_every_segment_once(services) -> None:
    ws = versions(2, layers=4, hidden=64, density=0.2)
    (pa, a), (_pb, b) = start_relay(services, "ra"), start_relay(services, "rb")
    # The trainer's links to the relays are slow WAN paths, so that v2 is still arriving when ra dies.
    emus = [WanEmulator(r["data_endpoint"], LinkSpec(rate=50_000, rtt=0.01, chunk=4096)) for r in (a, b)]
    eps = [await e.start() for e in emus]
    pub = Publisher(
        job=JOB,
        key=KEY,
        token=TOKEN,
        relays=[a["address"], b["address"]],
        streams=2,
        grpc_listen="127.0.0.1:0",
        max_segment_bytes=4096,
        reconnect_timeout=2.0,
        relay_data_endpoints={a["address"]: eps[0], b["address"]: eps[1]},
    )
    await pub.start()
    subs = [subscriber(f"s{k}", [a["address"], b["address"], pub.grpc_endpoint], ws[0].copy()) for k in range(3)]
    try:
        await pub.publish(0, ws[0])
        await started(subs)
        r1 = await pub.publish(1, ws[1])
        await pub.commit(1)
        await asyncio.gather(*(s.wait_version(1, 20) for s in subs))
        publishing = asyncio.ensure_future(pub.publish(2, ws[2]))
        # Wait until every subscriber holds part (not all) of D_2, then SIGKILL its relay.
        deadline = time.time() + 30
        while not all(2 in s.staged and s.staged[2].tracker.received >= 3 for s in subs):
            assert time.time() < deadline and not publishing.done()
            await asyncio.sleep(0.02)
        partial = [s.staged[2].tracker.received for s in subs]
        pa.kill()
        r2 = await asyncio.wait_for(publishing, 60)
        assert not r2.relays[0].ok and r2.relays[1].ok
        assert all(p < r2.segments for p in partial)
        await pub.commit(2)
        await asyncio.gather(*(s.wait_version(2, 30) for s in subs))
        for s in subs:
            assert digest(s.weights) == digest(ws[2]) and s.active_hash == r2.hash
            assert s.follower.failovers >= 1 and s.follower.active_endpoint == b["address"]
            # Each segment staged exactly once; the fallback relay sent only what was missing.
            assert s.segments_received == r1.segments + r2.segments, (s.segments_received, s.duplicates)
            assert s.duplicates <= 2 * 2  # at most what was in flight on the dead stripes
            assert s.errors == []
    finally:
        for s in subs:
            await s.stop()
        await pub.stop()
        for e in emus:
            await e.stop()


async def test_a_subscriber_on_its_fallback_goes_back_to_its_relay_once_it_answers(services) -> None:
    """After a failover to the trainer (across the link, in a geo job), the subscriber returns to its own
    region's relay when that answers and holds what is being pulled, and later versions come through it."""
    ws = versions(2, layers=3, density=0.2)
    _proc, relay = start_relay(services, "home")
    pub = Publisher(job=JOB, key=KEY, token=TOKEN, relays=[relay["address"]], streams=2, grpc_listen="127.0.0.1:0")
    await pub.start()
    s = subscriber("s0", [relay["address"], pub.grpc_endpoint], ws[0].copy())
    s.follower.prefer_first_after = 0.5
    try:
        await pub.publish(0, ws[0])
        await started([s])
        s.follower.switch()  # as when a pull from the relay stalled
        deadline = time.time() + 20
        while s.follower.active_endpoint != pub.grpc_endpoint or not s.follower.connected:
            assert time.time() < deadline, s.follower.last_error
            await asyncio.sleep(0.05)
        failovers = s.follower.failovers
        while s.follower.active_endpoint != relay["address"] or not s.follower.connected:
            assert time.time() < deadline, s.follower.last_error
            await asyncio.sleep(0.05)
        assert s.follower.failovers == failovers  # going back is not counted as a failure
        for v in (1, 2):
            r = await pub.publish(v, ws[v])
            await pub.commit(v)
            await s.wait_version(v, 20)
        assert digest(s.weights) == digest(ws[2]) and s.active_hash == r.hash
        assert s.follower.active_endpoint == relay["address"] and s.errors == []
    finally:
        await s.stop()
        await pub.stop()


async def test_dropped_connection_and_corrupted_byte_on_the_way(services) -> None:
    """trainer -(stripe dropped)-> relay -(byte flipped)-> subscriber: both repaired, result exact."""
    ws = versions(1, layers=3, density=0.1)
    port, adv = free_port(), free_port()
    _, r = start_relay(
        services, "r1", ROLLART_DATA_LISTEN=f"127.0.0.1:{port}", ROLLART_DATA_ADVERTISE=f"127.0.0.1:{adv}"
    )
    total = sum(map(len, segments(ws[0], ws[1], 1, max_segment_bytes=4096)))
    # The trainer's first stripe dies a fifth of the way in; the subscriber's first stripe gets a flipped byte.
    up = WanEmulator(f"127.0.0.1:{port}", LinkSpec(drop_after={0: total // 5}, fault_direction="up"))
    down = WanEmulator(f"127.0.0.1:{port}", LinkSpec(corrupt_at={0: 5000}, fault_direction="down"), f"127.0.0.1:{adv}")
    pub = Publisher(
        job=JOB,
        key=KEY,
        token=TOKEN,
        relays=[r["address"]],
        streams=2,
        max_segment_bytes=4096,
        relay_data_endpoints={r["address"]: await up.start()},
    )
    await down.start()
    await pub.start()
    s = subscriber("s0", [r["address"]], ws[0].copy(), streams=2)
    try:
        await pub.publish(0, ws[0])
        await started([s])
        res = await pub.publish(1, ws[1])
        assert res.relays[0].ok and res.relays[0].resent >= 1
        await pub.commit(1)
        await s.wait_version(1, 30)
        assert up.conns[0].dropped and down.conns[0].corrupted
        assert digest(s.weights) == digest(ws[1]) and s.active_hash == res.hash
        assert s.segments_received == res.segments
    finally:
        await s.stop()
        await pub.stop()
        await up.stop()
        await down.stop()


async def test_missed_versions_catch_up_from_the_relay_cache(services) -> None:
    ws = versions(5, layers=3)
    _, r = start_relay(services, "r1")
    pub = Publisher(job=JOB, key=KEY, token=TOKEN, relays=[r["address"]], streams=2, max_segment_bytes=8192)
    await pub.start()
    s = None
    try:
        for v in range(0, 5):
            await pub.publish(v, ws[v])
            if v:
                await pub.commit(v)
        # s has been away since v1: D_2, D_3, D_4 were missed (3 versions). It comes back (with v1 and its
        # h(v1), which D_2 names as its base); Commit(5) arrives.
        w1 = ws[1].copy()
        w1.applied_hash = next(p.hash for p in pub.published if p.version == 1)
        s = subscriber("late", [r["address"]], w1)
        await started([s])
        r5 = await pub.publish(5, ws[5])
        await pub.commit(5)
        await s.wait_version(5, 30)
        assert digest(s.weights) == digest(ws[5]) and s.active_hash == r5.hash
        assert [v for v, _ in s.applied] == [2, 3, 4, 5]
        delta_bytes = sum(p.delta_bytes for p in pub.published if p.version >= 2)
        got = s.bytes_received + s.bytes_fetched
        assert got <= delta_bytes * 1.01 and got < ws[5].nbytes / 2  # K·|D|, not the model size
    finally:
        if s is not None:
            await s.stop()
        await pub.stop()


async def test_joiner_bootstraps_from_newest_checkpoint_and_replays_the_chain(services, tmp_path: Path) -> None:
    ws = versions(5, layers=3)
    store = open_store(tmp_path / "ckpt")
    _, r = start_relay(services, "r1")
    pub = Publisher(job=JOB, key=KEY, token=TOKEN, relays=[r["address"]], checkpoint_store=store, checkpoint_every=2)
    await pub.start()
    try:
        for v in range(6):
            await pub.publish(v, ws[v])
        assert store.versions() == [0, 2, 4]
        s = subscriber("joiner", [r["address"]], None, checkpoint_store=str(tmp_path / "ckpt"))
        try:
            await s.start()  # no weights: checkpoint v4 + D_5
            assert s.active_version == 5 and digest(s.weights) == digest(ws[5])
            assert [v for v, _ in s.applied] == [5] and s.checkpoint_loads == 1
            assert s.active_hash == pub.published[-1].hash
        finally:
            await s.stop()
    finally:
        await pub.stop()


async def test_delta_for_the_wrong_base_is_rejected_and_weights_untouched(services) -> None:
    ws = versions(2, layers=2)
    _, r = start_relay(services, "r1")
    pub = Publisher(job=JOB, key=KEY, token=TOKEN, relays=[r["address"]])
    await pub.start()
    s = subscriber("s0", [r["address"]], ws[1].copy())  # active v1
    try:
        await started([s])
        # A valid, signed D_2 -- but computed from v0 (base 0), not from the subscriber's v1.
        wrong = segments(ws[0], ws[2], 2)
        buf = pub.hub.buffer(2)
        for raw in wrong:
            await pub.hub.ingest(raw)
        assert buf.complete
        await pub.hub.push_version(r["data_endpoint"], 2)
        await s.wait_staged(2, 20)
        before = digest(s.weights)
        with pytest.raises(CommitError, match="based on version 0, but the active version is 1"):
            await s.commit(common_pb2.CommitOrder(order_id="o2", version=2), timeout=5)
        assert s.active_version == 1 and digest(s.weights) == before
    finally:
        await s.stop()
        await pub.stop()


async def test_real_tiny_qwen3_after_optimizer_steps(services, tmp_path: Path) -> None:
    pytest.importorskip("torch")
    from rollart.delta import load_safetensors
    from rollart_devtools.tiny_model import build_tiny_model

    small = {"layers": 2, "hidden": 128, "vocab_size": 512}
    build_tiny_model(tmp_path / "v0", seed=0, pretrain_steps=0, **small)
    build_tiny_model(tmp_path / "v1", seed=0, pretrain_steps=2, **small)  # two real AdamW steps later
    v0 = load_safetensors(tmp_path / "v0" / "model.safetensors")
    v1 = load_safetensors(tmp_path / "v1" / "model.safetensors")
    _, r = start_relay(services, "r1")
    pub = Publisher(job=JOB, key=KEY, token=TOKEN, relays=[r["address"]], streams=4, max_segment_bytes=64 * 1024)
    await pub.start()
    subs = [
        subscriber(
            f"q{k}", [r["address"]], load_safetensors(tmp_path / "v0" / "model.safetensors", writable=True), version=0
        )
        for k in range(2)
    ]
    try:
        await pub.publish(0, v0)
        await started(subs)
        res = await pub.publish(1, v1)
        assert res.first_segment_seconds is not None and res.first_segment_seconds < res.encode_seconds
        await pub.commit(1)
        await asyncio.gather(*(s.wait_version(1, 30) for s in subs))
        for s in subs:
            assert digest(s.weights) == digest(v1) and s.active_hash == res.hash
    finally:
        for s in subs:
            await s.stop()
        await pub.stop()


async def test_relay_sigterm_drains_its_subscribers_to_a_peer(services) -> None:
    ws = versions(1, layers=2)
    (pa, a), (_pb, b) = start_relay(services, "ra", ROLLART_GRACE_SECONDS="10"), start_relay(services, "rb")
    pub = Publisher(job=JOB, key=KEY, token=TOKEN, relays=[a["address"], b["address"]])
    await pub.start()
    s = subscriber("s0", [a["address"], b["address"]], ws[0].copy())
    try:
        await pub.publish(0, ws[0])
        await started([s])
        t0 = time.monotonic()
        pa.stop(timeout=15)  # SIGTERM: the relay announces it is draining and ends the watches at once
        assert time.monotonic() - t0 < 5, "the relay waited out its grace period on open watches"
        deadline = time.monotonic() + 10
        while s.follower.active_endpoint != b["address"] or not s.follower.connected:
            assert time.monotonic() < deadline
            await asyncio.sleep(0.05)
        assert "draining" in s.follower.last_error
        pub.relays = [b["address"]]
        res = await pub.publish(1, ws[1])
        await pub.commit(1)
        await s.wait_version(1, 20)
        assert digest(s.weights) == digest(ws[1]) and s.active_hash == res.hash
    finally:
        await s.stop()
        await pub.stop()


async def test_publisher_writes_buckets_to_a_real_mooncake_store(tmp_path: Path) -> None:
    import importlib.util

    from rollart.local.mooncake import mooncake_master_binary, start_mooncake_master

    if mooncake_master_binary() is None or importlib.util.find_spec("mooncake") is None:
        pytest.skip("mooncake is not installed")
    from rollart.weights.buckets import BucketReader, MooncakeConfig

    ws = versions(1, layers=2)
    master = start_mooncake_master(tmp_path / "mooncake")
    pub = Publisher(job=JOB, key=KEY, token=TOKEN, buckets=master.address, bucket_bytes=64 * 1024)
    await pub.start()
    try:
        await pub.publish(0, ws[0])
        r1 = await pub.publish(1, ws[1])
        assert len(r1.buckets) > 1 and r1.hash is not None  # the delta and the buckets, one publish
        reader = BucketReader(MooncakeConfig(master.address), JOB)
        try:
            got = await asyncio.to_thread(reader.pull, 1)
            assert digest(got.weights) == digest(ws[1])
            # The manifest names the version's h(v), the delta's hash (an actor checks it against the ledger).
            assert got.weights.applied_hash == r1.hash == r1.weights_hash
        finally:
            reader.close()
    finally:
        await pub.stop()
        master.stop()
