"""The hub shared by relays and the publisher: buffers, cache, chains, events, commits (in-process)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import numpy as np
import pytest

from rollart.delta import segment as sg
from rollart.v1 import common_pb2, relay_pb2
from rollart.weights.hub import DeltaHub, HubError
from tests.unit.weights.weights_testlib import JOB, KEY, model, segments, step


def deltas(n: int, seed: int = 0) -> list[list[bytes]]:
    rng = np.random.default_rng(seed)
    ws = [model(rng)]
    for _ in range(n):
        ws.append(step(rng, ws[-1]))
    return [segments(ws[i - 1], ws[i], i) for i in range(1, n + 1)]


def hub(tmp: Path | None = None, **kw) -> DeltaHub:  # type: ignore[no-untyped-def]
    return DeltaHub(job=JOB, key=KEY, relay_id="h", cache_dir=tmp, **kw)


async def fill(h: DeltaHub, d: list[bytes]) -> None:
    for raw in d:
        await h.ingest(raw)


async def test_followers_get_segments_as_they_arrive_and_store_and_forward_waits() -> None:
    d = deltas(1)[0]
    for saf in (False, True):
        h = hub(store_and_forward=saf)
        got: list[bytes] = []
        buf = h.buffer(1)

        async def follow(buf=buf, got=got, saf=saf) -> None:  # type: ignore[no-untyped-def]
            async for raw in buf.follow(wait_complete=saf):
                got.append(raw)

        task = asyncio.ensure_future(follow())
        await fill(h, d[:3])
        await asyncio.sleep(0.01)
        assert len(got) == (0 if saf else 3)  # cut-through forwards at once; store-and-forward holds
        await fill(h, d[3:])
        await asyncio.wait_for(task, 5)
        assert got == d


async def test_cache_on_disk_bounded_and_reloaded(tmp_path: Path) -> None:
    ds = deltas(4)
    size = sum(map(len, ds[0]))
    h = hub(tmp_path, capacity_bytes=int(size * 2.5), memory_versions=1)
    await h.start(data_listen=None)
    for d in ds:
        await fill(h, d)
        await asyncio.sleep(0)
    await asyncio.gather(*list(h._persisting.values()))
    assert h.complete_versions() == [3, 4]  # the byte budget holds two deltas
    assert sorted(p.name for p in tmp_path.glob("*.dseg")) == ["v000000000003.dseg", "v000000000004.dseg"]
    assert not h.versions[3].segs and h.versions[4].segs  # older versions are read from disk
    got = [raw async for _b, raw in h.fetch(2, 4)]
    assert got == ds[2] + ds[3]
    await h.stop()
    again = hub(tmp_path)
    await again.start(data_listen=None)
    assert again.complete_versions() == [3, 4]
    assert [raw async for _b, raw in again.fetch(3, 4)] == ds[3]
    await again.stop()


async def test_corrupt_cache_file_is_dropped_on_load(tmp_path: Path) -> None:
    ds = deltas(1)
    raw = bytearray(b"".join(ds[0]))
    raw[100] ^= 0xFF
    (tmp_path / "v000000000001.dseg").write_bytes(bytes(raw))
    h = hub(tmp_path)
    await h.start(data_listen=None)
    assert h.complete_versions() == [] and not list(tmp_path.glob("*.dseg"))
    await h.stop()


async def test_chain_errors_name_the_problem() -> None:
    ds = deltas(3)
    h = hub()
    await fill(h, ds[1])
    await fill(h, ds[2])
    with pytest.raises(HubError) as e:
        h.chain(0, 3, follow=False)
    assert e.value.code == "OUT_OF_RANGE"
    with pytest.raises(HubError) as e:
        h.chain(1, 7, follow=False)
    assert e.value.code == "NOT_FOUND"
    assert [b.version for b in h.chain(1, 0, follow=False)] == [2, 3]
    partial = hub()
    await fill(partial, ds[0][:2])
    with pytest.raises(HubError) as e:
        partial.chain(0, 1, follow=False)
    assert e.value.code == "FAILED_PRECONDITION"


async def test_events_commits_and_targets() -> None:
    h = hub()
    for sid, kind in (("a1", 1), ("a2", 1), ("r9", 2)):
        h.subscribe(relay_pb2.RelaySubscribeRequest(subscriber_id=sid, kind=kind))
    streams = {sid: h.watch(sid) for sid in ("a1", "a2", "r9")}
    order = common_pb2.CommitOrder(order_id="o1", version=1, actor_ids=["a1"])
    first = {sid: asyncio.ensure_future(s.__anext__()) for sid, s in streams.items()}
    await asyncio.sleep(0)
    resp = h.commit(order)
    assert sorted(resp.delivered) == ["a1", "r9"] and not resp.duplicate  # relays forward every order
    await asyncio.sleep(0.01)
    assert first["a1"].done() and first["r9"].done() and not first["a2"].done()
    assert h.commit(order).duplicate
    first["a2"].cancel()
    # A late watcher replays retained events meant for it.
    late = h.watch("a1", from_sequence=0)
    ev = await asyncio.wait_for(late.__anext__(), 1)
    assert ev.commit.order_id == "o1"
    with pytest.raises(HubError):
        h.commit(common_pb2.CommitOrder(version=1))


async def test_subscribe_reports_catch_up_and_needs_checkpoint() -> None:
    ds = deltas(3)
    h = hub()
    for d in ds[1:]:
        await fill(h, d)
    r = h.subscribe(relay_pb2.RelaySubscribeRequest(subscriber_id="x", has_active_version=True, active_version=1))
    assert list(r.catch_up_versions) == [2, 3] and not r.needs_checkpoint
    r = h.subscribe(relay_pb2.RelaySubscribeRequest(subscriber_id="y", has_active_version=True, active_version=0))
    assert list(r.catch_up_versions) == [] and r.needs_checkpoint


async def test_ingest_rejects_foreign_jobs_and_bad_segments() -> None:
    from rollart.delta.errors import AuthError

    h = hub()
    other = DeltaHub(job="other", key=KEY, relay_id="o")
    d = deltas(1)[0]
    with pytest.raises(HubError):
        await other.ingest(d[0])
    bad = bytearray(d[0])
    bad[-1] ^= 1
    with pytest.raises(AuthError):
        await h.ingest(bytes(bad))
    assert not h.versions
    assert sg.parse(d[0], KEY).seq == 0


async def test_a_pull_session_dialled_before_its_version_arrives_is_one_session() -> None:
    """Every stripe of a pull session waits for the version at admission; the first one through opens the
    session and the others join it, so each segment is sent once, not once per stripe."""
    from rollart.weights import transport as tp

    d = deltas(1)[0]
    h = hub(pull_wait=10)
    await h.start("127.0.0.1:0")
    try:
        sink = tp.TrackerSink(tp.SegmentTracker(JOB, 1))
        opening = asyncio.ensure_future(
            tp.open_pull(h.data_endpoint, job=JOB, key=KEY, version=1, sink=sink, streams=3)
        )
        await asyncio.sleep(0.3)  # all three stripes are waiting in admission
        assert not opening.done()
        await fill(h, d)
        session = await asyncio.wait_for(opening, 10)
        await session.wait(10)
        assert sink.ordered() == d and sink.tracker.verified
        assert session.duplicates == 0 and sink.tracker.duplicates == 0
    finally:
        await h.stop()


def test_a_new_hub_exports_its_byte_counters_at_zero() -> None:
    from prometheus_client import REGISTRY

    DeltaHub(job=JOB, key=KEY, relay_id="fresh-hub")
    for direction in ("in", "out"):  # so rollart:weight_bytes:rate1m is 0, not "no data", before the first delta
        value = REGISTRY.get_sample_value("rollart_weights_hub_bytes_total", {"hub": "fresh-hub", "direction": direction})
        assert value == 0.0
