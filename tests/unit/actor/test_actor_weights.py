"""The actor's weight handling without an engine: staging pushed deltas, chains, commits, rollbacks.

A fake engine stands in for vLLM: it loads the safetensors payload the actor hands over (as the worker
extension would), so these tests see exactly which tensors an update sends.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pytest

from rollart.delta import WeightSet, load_safetensors, save_safetensors
from rollart.v1 import common_pb2
from rollart_actor.weights import HostWeights, WeightError, WeightManager
from tests.unit.actor.actor_testlib import JOB, KEY, delta_segments, layer_projections, perturb, qwen_like


@dataclass
class _Stats:
    requests_recomputed: int = 0
    recomputed_tokens: int = 0
    prefix_cache_reset: bool = True
    pause_window_s: float = 0.001
    load_s: float = 0.001
    aborted: int = 0
    rpc: dict = field(default_factory=dict)
    completed_at: float = 0.0


class FakeEngine:
    """Loads the payload like the worker extension would; can be told to refuse."""

    def __init__(self, served: WeightSet) -> None:
        self.served = {n: a.copy() for n, a in served.arrays.items()}
        self.version = 0
        self.payload_names: list[list[str]] = []
        self.refuse = False

    async def update_weights(self, payload, to_version, *, mode="keep", wait_timeout=60.0, after_load=None):
        if self.refuse:
            raise WeightError("FAILED_PRECONDITION", "the engine refused the weights: test")
        ws = load_safetensors(payload)
        self.payload_names.append(sorted(ws.arrays))
        for n, a in ws.arrays.items():
            self.served[n] = np.array(a, copy=True)
        if after_load is not None:
            after_load()
        self.version = to_version
        return _Stats(rpc={"tensors": len(ws.arrays)})


@pytest.fixture
def model(tmp_path: Path) -> Path:
    ws = qwen_like(np.random.default_rng(0))
    d = tmp_path / "model"
    d.mkdir()
    save_safetensors(d / "model.safetensors", ws)
    return d


def _setup(model: Path, tmp_path: Path):
    host = HostWeights.load(model, 0)
    engine = FakeEngine(host.ws)
    return host, engine, WeightManager(host, engine, tmp_path / "work", key=KEY, job=JOB)


def _same(a: WeightSet, arrays: dict) -> bool:
    return all(np.array_equal(a.arrays[n], arrays[n]) for n in a.arrays)


def test_pushed_segments_out_of_order_with_duplicates_stage_and_commit_bit_exact(model: Path, tmp_path: Path) -> None:
    host, engine, mgr = _setup(model, tmp_path)
    base = load_safetensors(model / "model.safetensors")
    v1 = perturb(base, layer_projections(base, 1), seed=1)
    msgs, h1 = delta_segments(base, v1, version=1, base_version=0, max_segment_bytes=2048)
    assert len(msgs) > 3
    order = list(reversed(msgs)) + msgs[:2]  # trailer first, then every segment, then two repeats
    new = [mgr.stage_segment(m) for m in order]
    assert sum(new) == len(msgs) and new[-2:] == [False, False]
    [st] = mgr.staged(1)
    assert st.complete and st.verified and st.hash == h1 and st.parts_total == len(msgs)

    outcome, dup = asyncio.run(mgr.commit(common_pb2.CommitOrder(order_id="o1", version=1, hash=h1)))
    assert outcome.error is None and not dup
    res = outcome.result
    assert res.applied and (res.from_version, res.to_version) == (0, 1) and res.hash == h1
    assert host.version == 1 and host.hash == h1
    assert host.hashes_for([0, 1, 1]) == {1: h1}  # what chunks report; v0 was loaded without a known h(v)
    assert _same(v1, host.ws.arrays)  # the host copy is exactly v1
    assert _same(v1, engine.served)  # and so is what the engine serves
    # Only layer 1's projections went to the engine, as whole fused groups (q, k, v together; gate, up).
    assert engine.payload_names == [layer_projections(base, 1)]
    assert mgr.staged() == []  # committed versions leave staging
    again, dup = asyncio.run(mgr.commit(common_pb2.CommitOrder(order_id="o1", version=1, hash=h1)))
    assert dup and again.result.to_version == 1 and len(engine.payload_names) == 1


def test_delta_for_the_wrong_base_is_refused_and_nothing_is_staged(model: Path, tmp_path: Path) -> None:
    host, engine, mgr = _setup(model, tmp_path)
    base = load_safetensors(model / "model.safetensors")
    v1 = perturb(base, layer_projections(base, 0), seed=1)
    v2 = perturb(v1, layer_projections(v1, 1), seed=2)
    msgs, _ = delta_segments(v1, v2, version=2, base_version=1)
    with pytest.raises(WeightError) as err:
        mgr.stage_segment(msgs[0])
    assert err.value.code == "FAILED_PRECONDITION" and "based on v1" in str(err.value)
    assert mgr.staged() == []
    outcome, _ = asyncio.run(mgr.commit(common_pb2.CommitOrder(order_id="o2", version=2)))
    assert outcome.error is not None and outcome.error.code == "FAILED_PRECONDITION"
    assert "rejected" in str(outcome.error)
    assert host.version == 0 and _same(base, host.ws.arrays) and engine.payload_names == []


def test_chain_of_two_staged_deltas_applies_in_one_update(model: Path, tmp_path: Path) -> None:
    host, engine, mgr = _setup(model, tmp_path)
    base = load_safetensors(model / "model.safetensors")
    v1 = perturb(base, layer_projections(base, 0), seed=1)
    v2 = perturb(v1, layer_projections(v1, 1), seed=2)
    m1, h1 = delta_segments(base, v1, version=1, base_version=0)
    v1.applied_hash = h1  # D_2 names its base by h(v1)
    m2, h2 = delta_segments(v1, v2, version=2, base_version=1)
    with pytest.raises(WeightError):  # v2 before v1 started: its base is neither active nor staged
        mgr.stage_segment(m2[0])
    for m in m1[:1] + m2 + m1[1:]:  # once v1 is arriving, v2 (based on it) may stage alongside
        mgr.stage_segment(m)
    outcome, _ = asyncio.run(mgr.commit(common_pb2.CommitOrder(order_id="c", version=2, hash=h2)))
    assert outcome.error is None, outcome.error
    assert outcome.result.deltas_applied == 2 and host.version == 2
    assert _same(v2, engine.served) and len(engine.payload_names) == 1


def test_wrong_hash_is_data_loss_and_a_refused_engine_update_rolls_the_host_back(model: Path, tmp_path: Path) -> None:
    host, engine, mgr = _setup(model, tmp_path)
    base = load_safetensors(model / "model.safetensors")
    v1 = perturb(base, layer_projections(base, 1), seed=3)
    msgs, h1 = delta_segments(base, v1, version=1, base_version=0)
    for m in msgs:
        mgr.stage_segment(m)
    bad, _ = asyncio.run(mgr.commit(common_pb2.CommitOrder(order_id="x", version=1, hash=bytes(32))))
    assert bad.error is not None and bad.error.code == "DATA_LOSS"
    assert host.version == 0 and _same(base, host.ws.arrays)
    engine.refuse = True
    refused, _ = asyncio.run(mgr.commit(common_pb2.CommitOrder(order_id="y", version=1, hash=h1)))
    assert refused.error is not None and refused.error.code == "FAILED_PRECONDITION"
    assert host.version == 0 and _same(base, host.ws.arrays)  # the host copy was restored
    assert host.hashes_for([1]) == {}  # never active: no chunk may vouch for h1 under v1
    assert mgr.staged(1)[0].complete  # still staged: a later commit may succeed
    engine.refuse = False
    ok, _ = asyncio.run(mgr.commit(common_pb2.CommitOrder(order_id="y", version=1, hash=h1)))
    assert ok.error is None and host.version == 1 and _same(v1, engine.served)


def test_active_hash_history_is_per_version_bounded_and_forgets_unknown(model: Path) -> None:
    h = [bytes([i]) * 32 for i in range(HostWeights.HISTORY + 2)]
    host = HostWeights.load(model, 0, h[0])
    assert host.hashes_for([0]) == {0: h[0]}
    for v in range(1, HostWeights.HISTORY + 2):
        host.set_version(v, h[v])
    got = host.hashes_for(range(HostWeights.HISTORY + 2))
    assert len(got) == HostWeights.HISTORY and 0 not in got and 1 not in got and got[5] == h[5]
    host.set_version(5, None)  # v5 reloaded from weights without a hash: it is no longer vouched for
    assert 5 not in host.hashes_for([5]) and host.hash == b""


def test_bad_segments_are_invalid_argument(model: Path, tmp_path: Path) -> None:
    host, _, mgr = _setup(model, tmp_path)
    base = load_safetensors(model / "model.safetensors")
    v1 = perturb(base, layer_projections(base, 1), seed=4)
    msgs, _ = delta_segments(base, v1, version=1, base_version=0)
    forged, _ = delta_segments(base, v1, version=1, base_version=0, key=b"not-the-job-key-000000000000")
    corrupt = common_pb2.DeltaSegment()
    corrupt.CopyFrom(msgs[0])
    data = bytearray(corrupt.data)
    data[len(data) // 2] ^= 0xFF
    corrupt.data = bytes(data)
    lying = common_pb2.DeltaSegment()
    lying.CopyFrom(msgs[1])
    lying.sequence = 7
    other_job, _ = delta_segments(base, v1, version=1, base_version=0, job="other-job")
    for bad in (forged[0], corrupt, lying, other_job[0], common_pb2.DeltaSegment(job_id=JOB, version=1)):
        with pytest.raises(WeightError) as err:
            mgr.stage_segment(bad)
        assert err.value.code == "INVALID_ARGUMENT", (bad.sequence, str(err.value))
    assert all(not s.complete for s in mgr.staged())


def test_delta_that_does_not_fit_the_model_is_discarded(model: Path, tmp_path: Path) -> None:
    host, _, mgr = _setup(model, tmp_path)
    other = qwen_like(np.random.default_rng(1), hidden=16, kv=8, inter=24)  # another architecture
    other.version = 0
    changed = perturb(other, layer_projections(other, 0), seed=5)
    msgs, _ = delta_segments(other, changed, version=1, base_version=0)
    with pytest.raises(WeightError) as err:
        for m in msgs:
            mgr.stage_segment(m)
    assert err.value.code == "FAILED_PRECONDITION"
    [st] = mgr.staged(1)
    assert st.error and not st.complete and st.bytes_received == 0


def test_staged_full_weights_then_a_delta(model: Path, tmp_path: Path) -> None:
    host, engine, mgr = _setup(model, tmp_path)
    base = load_safetensors(model / "model.safetensors")
    v3 = perturb(base, layer_projections(base, 0) + layer_projections(base, 1), seed=6)
    v4 = perturb(v3, layer_projections(v3, 1), seed=7)
    v3.applied_hash = b"\x03" * 32  # h(v3) as the bucket manifest records it; D_4 names its base by it
    full = v3.copy()
    mgr.stage_full(3, full, v3.applied_hash, artifact="buckets", source="mooncake", parts=1, nbytes=full.nbytes)
    msgs, h4 = delta_segments(v3, v4, version=4, base_version=3)
    for m in msgs:
        mgr.stage_segment(m)
    outcome, _ = asyncio.run(mgr.commit(common_pb2.CommitOrder(order_id="f", version=4, hash=h4)))
    assert outcome.error is None, outcome.error
    assert host.version == 4 and host.hash == h4 and _same(v4, engine.served)
    assert len(engine.payload_names[-1]) == len(base.arrays)  # full weights: every tensor reloaded


def _order(oid: str, version: int, hash_: bytes = b"") -> common_pb2.CommitOrder:
    return common_pb2.CommitOrder(order_id=oid, version=version, hash=hash_)


def test_commit_transitions_refused_and_no_ops(model: Path, tmp_path: Path) -> None:
    """The active version moves only by a commit of a staged route; every other commit changes nothing."""
    host, engine, mgr = _setup(model, tmp_path)
    base = load_safetensors(model / "model.safetensors")
    v1 = perturb(base, layer_projections(base, 0), seed=8)
    msgs, h1 = delta_segments(base, v1, version=1, base_version=0)

    async def run() -> None:
        # A commit of a version nothing was staged for: FAILED_PRECONDITION, v0 stays.
        bad, _ = await mgr.commit(_order("unstaged", 1))
        assert bad.error is not None and bad.error.code == "FAILED_PRECONDITION" and "based on v0" in str(bad.error)
        assert host.version == 0 and engine.payload_names == [] and mgr.last_error
        for m in msgs:
            mgr.stage_segment(m)
        # The same order twice at once: applied once, the second waits for the first and is a duplicate.
        (a, dup_a), (b, dup_b) = await asyncio.gather(
            mgr.commit(_order("twice", 1, h1)), mgr.commit(_order("twice", 1, h1))
        )
        assert a.error is None and b.error is None and sorted([dup_a, dup_b]) == [False, True]
        assert host.version == 1 and host.hash == h1 and len(engine.payload_names) == 1 and mgr.last_error == ""
        # Another order for the active version (same or no hash), or for an older one: a no-op.
        for oid, v, h in (("again", 1, h1), ("no-hash", 1, b""), ("older", 0, b"")):
            same, dup = await mgr.commit(_order(oid, v, h))
            assert same.error is None and not dup and not same.result.applied
            assert (same.result.from_version, same.result.to_version) == (1, 1)
        assert len(engine.payload_names) == 1
        # The active version under another h(v): DATA_LOSS, and still nothing changes.
        other, _ = await mgr.commit(_order("other-hash", 1, bytes(32)))
        assert other.error is not None and other.error.code == "DATA_LOSS"
        assert host.version == 1 and host.hash == h1 and _same(v1, host.ws.arrays)
        # Segments of the active version are duplicates now, not errors.
        assert [mgr.stage_segment(m) for m in msgs] == [False] * len(msgs) and mgr.staged() == []

    asyncio.run(run())


def test_a_pushed_delta_whose_base_is_not_the_active_version_is_refused_after_a_commit(
    model: Path, tmp_path: Path
) -> None:
    host, engine, mgr = _setup(model, tmp_path)
    base = load_safetensors(model / "model.safetensors")
    v1 = perturb(base, layer_projections(base, 0), seed=9)
    m1, h1 = delta_segments(base, v1, version=1, base_version=0)
    for m in m1:
        mgr.stage_segment(m)
    outcome, _ = asyncio.run(mgr.commit(_order("c1", 1, h1)))
    assert outcome.error is None and host.version == 1
    # D_2 computed from v0 (base 0) while v1 is active: refused at its first segment, nothing staged.
    v2 = perturb(base, layer_projections(base, 1), seed=10)
    wrong, _ = delta_segments(base, v2, version=2, base_version=0)
    with pytest.raises(WeightError) as err:
        mgr.stage_segment(wrong[0])
    assert err.value.code == "FAILED_PRECONDITION" and "active version is v1" in str(err.value)
    assert mgr.staged() == [] and host.version == 1 and len(engine.payload_names) == 1


async def test_relay_deltas_stage_into_the_same_staging_and_commit_through_the_manager(
    model: Path, tmp_path: Path
) -> None:
    """A real publisher as the relay-like source: its commit orders and the actor's own Commit share one path."""
    from rollart.weights.publisher import Publisher
    from tests.conftest import TOKEN

    host, engine, mgr = _setup(model, tmp_path)
    mgr.commit_timeout = 20.0
    ws = [load_safetensors(model / "model.safetensors")]
    ws[0].version = 0
    for v, layer in ((1, 0), (2, 1), (3, 0)):
        ws.append(perturb(ws[-1], layer_projections(ws[-1], layer), seed=40 + v))
        ws[-1].version = v
    pub = Publisher(job=JOB, key=KEY, token=TOKEN, grpc_listen="127.0.0.1:0", max_segment_bytes=16 << 10)
    await pub.start()
    try:
        await pub.publish(0, ws[0])
        source = mgr.follow(subscriber_id="actor-u", token=TOKEN, sources=[pub.grpc_endpoint], streams=2)
        await asyncio.wait_for(source.follower.connected_event.wait(), 20)
        r1 = await pub.publish(1, ws[1])
        await pub.commit(1)  # the order arrives on the source's event stream
        for _ in range(400):
            if host.version == 1:
                break
            await asyncio.sleep(0.05)
        assert host.version == 1 and host.hash == r1.hash and _same(ws[1], engine.served)
        assert mgr.last_update is not None and mgr.last_update.to_version == 1 and mgr.staged() == []
        # Away while v2 and v3 are published; back, Commit(3) gathers both from the source and applies
        # them at one safe point.
        await mgr.unfollow()
        await pub.publish(2, ws[2])
        r3 = await pub.publish(3, ws[3])
        mgr.follow(subscriber_id="actor-u", token=TOKEN, sources=[pub.grpc_endpoint], streams=2)
        outcome, _ = await mgr.commit(_order("c3", 3, r3.hash))
        assert outcome.error is None, outcome.error
        assert outcome.result.deltas_applied == 2 and (outcome.result.from_version, outcome.result.to_version) == (1, 3)
        assert host.version == 3 and host.hash == r3.hash and _same(ws[3], engine.served)
        assert len(engine.payload_names) == 2 and mgr.staged() == []
        # A version the source never had: refused after fetching once, v3 stays.
        missing, _ = await mgr.commit(_order("c9", 9))
        assert missing.error is not None and host.version == 3
    finally:
        await mgr.unfollow()
        await pub.stop()
