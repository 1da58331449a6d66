"""Format-2 deltas through the weight plane: checkpoints record job, version and hash; the hub and the
transport carry the segments unchanged; a subscriber refuses a delta for other base weights before applying."""

from __future__ import annotations

import hashlib
from pathlib import Path

import numpy as np
import pytest

from rollart.delta import load_safetensors, weights_digest
from rollart.delta import segment as sg
from rollart.delta.safetensors_io import HASH_KEY, JOB_KEY, VERSION_KEY
from rollart.v1 import common_pb2
from rollart.weights.checkpoint_store import CHECKPOINT_FILE, open_store
from rollart.weights.publisher import Publisher
from rollart.weights.subscriber import CommitError, WeightSubscriber
from tests.conftest import TOKEN
from tests.unit.weights.weights_testlib import JOB, KEY, digest, model, step


async def test_checkpoints_record_identity_and_segments_travel_unchanged(tmp_path: Path) -> None:
    rng = np.random.default_rng(0)
    ws = [model(rng)]
    for _ in range(3):
        ws.append(step(rng, ws[-1], 0.05))
    store = open_store(tmp_path / "ck")
    pub = Publisher(
        job=JOB, key=KEY, token=TOKEN, checkpoint_store=store, checkpoint_every=2, grpc_listen="127.0.0.1:0"
    )
    await pub.start()
    sub = None
    try:
        r0 = await pub.publish(0, ws[0])
        assert r0.hash is None and r0.weights_hash == weights_digest(ws[0].arrays, ws[0].dtypes)
        # a subscriber on the v0 checkpoint: its identity comes from the file's metadata
        sub = WeightSubscriber(
            subscriber_id="s", job=JOB, key=KEY, token=TOKEN, sources=[pub.grpc_endpoint],
            weights=store.open(0, writable=True),
        )  # fmt: skip
        await sub.start()
        assert sub.active_version == 0 and sub.active_hash == r0.weights_hash
        for v in range(1, 4):
            r = await pub.publish(v, ws[v])
            assert r.weights_hash == r.hash
            await pub.commit(v)
            await sub.wait_version(v, 20)
            assert digest(sub.weights) == digest(ws[v]) and sub.active_hash == r.hash
        # the segments in the publisher's hub are the encoder's bytes (default format), naming h(v-1)
        for v in range(1, 4):
            buf = pub.hub.versions[v]
            segs = [sg.parse(buf.segs[seq], KEY) for seq in sorted(buf.segs)]
            assert {s.format_version for s in segs} == {sg.FORMAT_VERSION}
            assert {s.base_hash for s in segs} == {pub.published[v - 1].weights_hash}
            assert (
                hashlib.sha256(b"".join(bytes(s.raw) for s in segs if not s.is_trailer)).digest()
                == pub.published[v].hash
            )
        # checkpoints record job, version and hash in the safetensors metadata
        for v in (0, 2):
            meta = load_safetensors(tmp_path / "ck" / f"v{v:012d}" / CHECKPOINT_FILE).metadata
            assert meta[JOB_KEY] == JOB and meta[VERSION_KEY] == str(v)
            assert meta[HASH_KEY] == pub.published[v].weights_hash.hex()
            assert store.open(v).applied_hash == pub.published[v].weights_hash
    finally:
        if sub is not None:
            await sub.stop()
        await pub.stop()


async def test_subscriber_refuses_a_delta_for_other_base_weights() -> None:
    rng = np.random.default_rng(1)
    ws = [model(rng)]
    ws.append(step(rng, ws[0]))
    pub = Publisher(job=JOB, key=KEY, token=TOKEN, grpc_listen="127.0.0.1:0")
    await pub.start()
    mine = ws[0].copy()
    mine.applied_hash = hashlib.sha256(b"another job's version 0, same shapes and bits").digest()
    sub = WeightSubscriber(
        subscriber_id="s",
        job=JOB,
        key=KEY,
        token=TOKEN,
        sources=[pub.grpc_endpoint],
        weights=mine,
        streams=1,
        commit_timeout=5,
    )
    try:
        await pub.publish(0, ws[0])
        await sub.start()
        await pub.publish(1, ws[1])
        await sub.wait_staged(1, 10)
        with pytest.raises(CommitError, match="BaseMismatchError") as e:
            await sub.commit(common_pb2.CommitOrder(order_id="x", version=1))
        assert e.value.code == "FAILED_PRECONDITION"
        assert sub.active_version == 0 and digest(sub.weights) == digest(ws[0])  # nothing applied
    finally:
        await sub.stop()
        await pub.stop()
