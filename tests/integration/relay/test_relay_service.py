"""The rollart-relay process: ready file, auth, malformed input, PushSegments verification, cache, chains."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import grpc
import numpy as np
import pytest

from rollart.runtime.auth import bearer
from rollart.v1 import common_pb2, relay_pb2, relay_pb2_grpc
from rollart.weights import transport as tp
from rollart.weights.relay_api import segment_message
from tests.conftest import TOKEN
from tests.unit.weights.weights_testlib import JOB, KEY, OTHER_KEY, model, segments, start_relay, step

MD = [bearer(TOKEN)]


def stub(address: str) -> relay_pb2_grpc.RelayStub:
    return relay_pb2_grpc.RelayStub(grpc.insecure_channel(address))


def code_of(call, *args, **kw) -> grpc.StatusCode:  # type: ignore[no-untyped-def]
    with pytest.raises(grpc.RpcError) as e:
        r = call(*args, **kw)
        if hasattr(r, "__iter__"):
            list(r)
    return e.value.code()


def chain(n: int, seed: int = 0, density: float = 0.03) -> tuple[list, list[list[bytes]]]:
    rng = np.random.default_rng(seed)
    ws = [model(rng)]
    for _ in range(n):
        ws.append(step(rng, ws[-1], density))
    return ws, [segments(ws[i - 1], ws[i], i) for i in range(1, n + 1)]


def push(address: str, segs: list[bytes]):  # type: ignore[no-untyped-def]
    return stub(address).PushSegments((segment_message(s) for s in segs), metadata=MD, timeout=10)


def test_ready_file_status_and_auth(services, tmp_path: Path) -> None:
    _, info = start_relay(services, "r1")
    assert info["data_endpoint"].startswith("127.0.0.1:") and info["relay_id"] == "r1"
    s = stub(info["address"])
    st = s.GetStatus(relay_pb2.RelayStatusRequest(), metadata=MD, timeout=5)
    assert st.relay_id == "r1" and st.data_endpoint == info["data_endpoint"] and st.cache_capacity_bytes > 0
    assert st.upstream.config.kind == relay_pb2.UPSTREAM_KIND_TRAINER
    # Every RPC needs the job token.
    assert code_of(s.GetStatus, relay_pb2.RelayStatusRequest(), timeout=5) == grpc.StatusCode.UNAUTHENTICATED
    assert (
        code_of(s.GetStatus, relay_pb2.RelayStatusRequest(), metadata=[bearer("wrong")], timeout=5)
        == grpc.StatusCode.UNAUTHENTICATED
    )
    assert code_of(s.FetchDeltas, relay_pb2.FetchDeltasRequest(), timeout=5) == grpc.StatusCode.UNAUTHENTICATED
    assert code_of(s.PushSegments, iter([]), timeout=5) == grpc.StatusCode.UNAUTHENTICATED
    assert push(info["address"], []).accepted == 0


def test_malformed_and_invalid_requests(services) -> None:
    _, info = start_relay(services, "r1")
    ch = grpc.insecure_channel(info["address"])
    s = relay_pb2_grpc.RelayStub(ch)
    raw = ch.unary_unary("/rollart.v1.Relay/Subscribe")
    assert code_of(raw, b"\xff\xff\xff\x07garbage", metadata=MD, timeout=5) == grpc.StatusCode.INVALID_ARGUMENT
    bad = grpc.StatusCode.INVALID_ARGUMENT
    assert code_of(s.Subscribe, relay_pb2.RelaySubscribeRequest(), metadata=MD, timeout=5) == bad
    assert (
        code_of(s.Subscribe, relay_pb2.RelaySubscribeRequest(subscriber_id="a", streams=1000), metadata=MD, timeout=5)
        == bad
    )
    assert (
        code_of(
            s.Subscribe,
            relay_pb2.RelaySubscribeRequest(subscriber_id="a", receive_endpoint="nohost"),
            metadata=MD,
            timeout=5,
        )
        == bad
    )
    assert (
        code_of(s.WatchEvents, relay_pb2.WatchRelayEventsRequest(subscriber_id="ghost"), metadata=MD, timeout=5)
        == grpc.StatusCode.FAILED_PRECONDITION
    )
    assert code_of(s.Commit, relay_pb2.RelayCommitRequest(), metadata=MD, timeout=5) == bad
    no_id = relay_pb2.RelayCommitRequest(order=common_pb2.CommitOrder(version=3))
    assert code_of(s.Commit, no_id, metadata=MD, timeout=5) == bad
    bad_hash = relay_pb2.RelayCommitRequest(order=common_pb2.CommitOrder(order_id="o", version=3, hash=b"x"))
    assert code_of(s.Commit, bad_hash, metadata=MD, timeout=5) == bad
    up = relay_pb2.SetUpstreamRequest(upstream=relay_pb2.RelayUpstream(kind=relay_pb2.UPSTREAM_KIND_RELAY))
    assert code_of(s.SetUpstream, up, metadata=MD, timeout=5) == bad
    assert code_of(s.FetchDeltas, relay_pb2.FetchDeltasRequest(), metadata=MD, timeout=5) == grpc.StatusCode.NOT_FOUND
    neg = relay_pb2.FetchDeltasRequest(from_version=-1, to_version=2)
    assert code_of(s.FetchDeltas, neg, metadata=MD, timeout=5) == bad
    assert code_of(s.PruneCache, relay_pb2.PruneCacheRequest(keep_last=-1), metadata=MD, timeout=5) == bad
    # Still serving after all that.
    assert s.GetStatus(relay_pb2.RelayStatusRequest(), metadata=MD, timeout=5).relay_id == "r1"


def test_push_segments_verifies_every_segment(services) -> None:
    _, info = start_relay(services, "r1")
    s = stub(info["address"])
    ws, deltas = chain(1)
    d1 = deltas[0]
    # A corrupted byte: CRC fails, the call ends INVALID_ARGUMENT, nothing of that segment is kept.
    corrupt = bytearray(d1[1])
    corrupt[len(corrupt) // 2] ^= 1
    with pytest.raises(grpc.RpcError) as e:
        push(info["address"], [d1[0], bytes(corrupt)])
    assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "ChecksumError" in e.value.details()
    # A forged segment (valid CRC, another key's HMAC).
    forged = segments(ws[0], ws[1], 1, key=OTHER_KEY)
    with pytest.raises(grpc.RpcError) as e:
        push(info["address"], forged[1:2])
    assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "AuthError" in e.value.details()
    # Message fields that disagree with the header.
    msg = segment_message(d1[2])
    msg.sequence = 7
    with pytest.raises(grpc.RpcError) as e:
        s.PushSegments(iter([msg]), metadata=MD, timeout=5)
    assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "disagree" in e.value.details()
    st = s.GetStatus(relay_pb2.RelayStatusRequest(), metadata=MD, timeout=5)
    assert [(c.version, c.segments) for c in st.cached] == [(1, 1)]  # only the one good segment
    # The rest arrives (duplicates ignored): complete and verified; FetchDeltas returns it byte for byte.
    resp = push(info["address"], d1)
    assert resp.accepted == len(d1) - 1 and resp.duplicates == 1
    assert resp.versions[0].complete and resp.versions[0].verified and len(resp.versions[0].hash) == 32
    got = [m.data for m in s.FetchDeltas(relay_pb2.FetchDeltasRequest(from_version=0, to_version=1), metadata=MD)]
    assert got == d1
    only = relay_pb2.FetchDeltasRequest(from_version=0, to_version=1, only_sequences=[2, 0])
    assert [m.sequence for m in s.FetchDeltas(only, metadata=MD)] == [0, 2]


def test_cache_chain_restart_prune_and_eviction(services, tmp_path: Path) -> None:
    cache = str(tmp_path / "cache")
    proc, info = start_relay(services, "r1", cache_dir=cache, ROLLART_CACHE_MAX_VERSIONS="3")
    ws, deltas = chain(4)
    for d in deltas:  # through the striped transport this time
        asyncio.run(
            tp.send_delta(info["data_endpoint"], d, job=JOB, key=KEY, version=d_version(d), streams=2, timeout=10)
        )
    s = stub(info["address"])
    st = s.GetStatus(relay_pb2.RelayStatusRequest(), metadata=MD, timeout=5)
    assert [c.version for c in st.cached] == [2, 3, 4]  # max 3 versions: v1 evicted
    assert all(c.complete and c.verified for c in st.cached)
    req = relay_pb2.FetchDeltasRequest(from_version=1, to_version=4)
    assert b"".join(m.data for m in s.FetchDeltas(req, metadata=MD)) == b"".join(b"".join(d) for d in deltas[1:])
    with pytest.raises(grpc.RpcError) as e:
        list(s.FetchDeltas(relay_pb2.FetchDeltasRequest(from_version=0, to_version=4), metadata=MD))
    assert e.value.code() == grpc.StatusCode.OUT_OF_RANGE and "full checkpoint" in e.value.details()
    with pytest.raises(grpc.RpcError) as e:
        list(s.FetchDeltas(relay_pb2.FetchDeltasRequest(from_version=3, to_version=9), metadata=MD))
    assert e.value.code() == grpc.StatusCode.NOT_FOUND
    # SIGKILL, restart on the same cache: the deltas are still served.
    proc.kill()
    _, info2 = start_relay(services, "r1b", cache_dir=cache, ROLLART_CACHE_MAX_VERSIONS="3")
    s2 = stub(info2["address"])
    assert b"".join(m.data for m in s2.FetchDeltas(req, metadata=MD)) == b"".join(b"".join(d) for d in deltas[1:])
    pr = s2.PruneCache(relay_pb2.PruneCacheRequest(keep_last=1), metadata=MD, timeout=5)
    assert list(pr.evicted) == [2, 3] and pr.bytes_freed > 0
    assert sorted(p.name for p in Path(cache).glob("*.dseg")) == ["v000000000004.dseg"]


def d_version(d: list[bytes]) -> int:
    from rollart.delta import segment as sg

    return sg.parse(d[0], None).version


def test_transport_handshake_errors_against_the_relay(services) -> None:
    _, info = start_relay(services, "r1", ROLLART_PULL_WAIT_SECONDS="0.3")
    _, deltas = chain(1)

    async def go(**kw):  # type: ignore[no-untyped-def]
        args = dict(job=JOB, key=KEY, version=1, streams=2, timeout=5)
        args.update(kw)
        return await tp.send_delta(info["data_endpoint"], deltas[0], **args)

    with pytest.raises(tp.AuthenticationError):
        asyncio.run(go(key=OTHER_KEY))
    with pytest.raises(tp.UnknownJobError):
        asyncio.run(go(job="someone-else"))
    with pytest.raises(tp.RefusedError, match="not available"):
        asyncio.run(tp.receive_delta(info["data_endpoint"], job=JOB, key=KEY, version=9, streams=1, timeout=10))
    asyncio.run(go())  # and the right one works


def test_relay_follows_an_upstream_relay_and_propagates_commits(services) -> None:
    _, a = start_relay(services, "ra")
    _, b = start_relay(
        services, "rb", ROLLART_UPSTREAM__KIND="relay", ROLLART_UPSTREAM__ENDPOINT=a["address"], ROLLART_STREAMS="2"
    )
    sa, sb = stub(a["address"]), stub(b["address"])
    # A watcher on the downstream relay (an actor would do this).
    sb.Subscribe(relay_pb2.RelaySubscribeRequest(subscriber_id="act", has_active_version=True), metadata=MD, timeout=5)
    events = sb.WatchEvents(relay_pb2.WatchRelayEventsRequest(subscriber_id="act"), metadata=MD, timeout=30)
    deadline = time.time() + 10
    while not any(
        x.subscriber_id == "rb" for x in sa.GetStatus(relay_pb2.RelayStatusRequest(), metadata=MD).subscribers
    ):
        assert time.time() < deadline, "the downstream relay did not subscribe upstream"
        time.sleep(0.05)
    _, deltas = chain(2)
    for d in deltas:
        push(a["address"], d)
    deadline = time.time() + 10
    while True:
        st = sb.GetStatus(relay_pb2.RelayStatusRequest(), metadata=MD, timeout=5)
        if [c.version for c in st.cached if c.complete] == [1, 2]:
            break
        assert time.time() < deadline, st
        time.sleep(0.05)
    assert st.upstream.connected and st.upstream.active_endpoint == a["address"]
    got = [m.data for m in sb.FetchDeltas(relay_pb2.FetchDeltasRequest(from_version=0, to_version=2), metadata=MD)]
    assert got == deltas[0] + deltas[1]
    order = common_pb2.CommitOrder(order_id="order-2", version=2)
    r1 = sa.Commit(relay_pb2.RelayCommitRequest(order=order), metadata=MD, timeout=5)
    assert "rb" in r1.delivered
    again = sa.Commit(relay_pb2.RelayCommitRequest(order=order), metadata=MD, timeout=5)
    assert again.duplicate
    for ev in events:
        if ev.HasField("commit"):
            assert ev.commit.order_id == "order-2" and ev.commit.version == 2
            break
    events.cancel()


def test_push_mode_subscriber_receives_each_version(services) -> None:
    """A subscriber with a receive_endpoint: the relay dials it and pushes every version (striped)."""
    from tests.unit.weights.weights_testlib import Endpoint

    _, info = start_relay(services, "r1")
    _, deltas = chain(2)

    async def go() -> None:
        ep = Endpoint()
        addr = await ep.start()
        try:
            await asyncio.to_thread(
                stub(info["address"]).Subscribe,
                relay_pb2.RelaySubscribeRequest(subscriber_id="p", receive_endpoint=addr, streams=2),
                metadata=MD,
                timeout=5,
            )
            for d in deltas:
                await asyncio.to_thread(push, info["address"], d)
            deadline = time.time() + 10
            while sum(1 for k in ep.sinks.values() if k.tracker.verified) < 2:
                assert time.time() < deadline, "pushes did not arrive"
                await asyncio.sleep(0.05)
            got = sorted((k.tracker.version, b"".join(k.ordered())) for k in ep.sinks.values())
            assert got == [(1, b"".join(deltas[0])), (2, b"".join(deltas[1]))]
        finally:
            await ep.stop()

    asyncio.run(go())
    st = stub(info["address"]).GetStatus(relay_pb2.RelayStatusRequest(), metadata=MD, timeout=5)
    sub = next(x for x in st.subscribers if x.subscriber_id == "p")
    assert sub.mode == relay_pb2.DELIVERY_MODE_PUSH and sub.sent_version == 2 and sub.bytes_sent > 0
