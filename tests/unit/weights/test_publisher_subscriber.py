"""Publisher and subscriber in one process (the trainer's own hub as the source): cadence, overlap, errors."""

from __future__ import annotations

import asyncio
from pathlib import Path

import numpy as np
import pytest

from rollart.v1 import common_pb2
from rollart.weights.checkpoint_store import open_store
from rollart.weights.publisher import Publisher
from rollart.weights.subscriber import CommitError, WeightSubscriber
from tests.conftest import TOKEN
from tests.unit.weights.weights_testlib import JOB, KEY, digest, model, step


async def test_checkpoint_cadence_overlap_and_direct_subscribers(tmp_path: Path) -> None:
    rng = np.random.default_rng(0)
    ws = [model(rng, layers=8, hidden=128)]
    for _ in range(4):
        ws.append(step(rng, ws[-1], 0.05))
    store = open_store(tmp_path / "ck")
    pub = Publisher(
        job=JOB,
        key=KEY,
        token=TOKEN,
        checkpoint_store=store,
        checkpoint_every=3,
        grpc_listen="127.0.0.1:0",
        max_segment_bytes=16384,
    )
    await pub.start()
    sub = WeightSubscriber(
        subscriber_id="d", job=JOB, key=KEY, token=TOKEN, sources=[pub.grpc_endpoint], weights=ws[0].copy(), streams=2
    )
    try:
        await pub.publish(0, ws[0])
        await sub.start()
        for v in range(1, 5):
            r = await pub.publish(v, ws[v])
            # The delta streams while it is extracted: its first segment was sealed before the last one (an ordering,
            # not a speed: a store-and-forward encoder would seal the first at the same time as the last).
            assert r.first_segment_seconds is not None and r.first_segment_seconds < r.encode_seconds
            await pub.commit(v)
            await sub.wait_version(v, 20)
            assert digest(sub.weights) == digest(ws[v]) and sub.active_hash == r.hash
        assert store.versions() == [0, 3]
        assert store.open(3).applied_hash == pub.published[3].hash  # h(v) recorded with the checkpoint
        with pytest.raises(ValueError):
            await pub.publish(4, ws[4])
    finally:
        await sub.stop()
        await pub.stop()


async def test_commit_checks_the_ordered_hash_and_missing_deltas() -> None:
    rng = np.random.default_rng(1)
    ws = [model(rng)]
    ws.append(step(rng, ws[0]))
    pub = Publisher(job=JOB, key=KEY, token=TOKEN, grpc_listen="127.0.0.1:0", relays=["127.0.0.1:1"])
    await pub.start()
    sub = WeightSubscriber(
        subscriber_id="d",
        job=JOB,
        key=KEY,
        token=TOKEN,
        sources=[pub.grpc_endpoint],
        weights=ws[0].copy(),
        streams=1,
        commit_timeout=5,
    )
    try:
        await pub.publish(0, ws[0])
        await sub.start()
        r1 = await pub.publish(1, ws[1])
        assert not r1.relays[0].ok and "127.0.0.1:1" in r1.relays[0].error  # an unreachable relay: reported
        await sub.wait_staged(1, 10)
        with pytest.raises(CommitError, match="order names"):
            await sub.commit(common_pb2.CommitOrder(order_id="x", version=1, hash=b"\x01" * 32))
        assert sub.active_version == 0
        with pytest.raises(CommitError) as e:
            await sub.commit(common_pb2.CommitOrder(order_id="y", version=5))
        assert e.value.code in ("NOT_FOUND", "FAILED_PRECONDITION")
        r = await sub.commit(common_pb2.CommitOrder(order_id="z", version=1))
        assert r.applied == [1] and digest(sub.weights) == digest(ws[1])
        assert (await sub.commit(common_pb2.CommitOrder(order_id="z", version=1))) is r  # idempotent
        st = sub.status()
        assert st.loaded and st.active_version == 1
    finally:
        await sub.stop()
        await pub.stop()
    await asyncio.sleep(0)
