"""The staged-version state machine (rollart.weights.staging): ARRIVING -> STAGED | REJECTED, routes, pruning."""

from __future__ import annotations

import numpy as np
import pytest

from rollart.delta import WeightSet, encode_delta
from rollart.delta import segment as sg
from rollart.delta.errors import IncompatibleTargetError
from rollart.v1 import common_pb2
from rollart.weights.staging import ARRIVING, REJECTED, STAGED, StagingError, VersionStaging
from tests.unit.weights.weights_testlib import JOB, KEY, OTHER_KEY, model, step


def messages(
    base: WeightSet, target: WeightSet, version: int, base_version: int, *, key: bytes = KEY, job: str = JOB
) -> tuple[list[common_pb2.DeltaSegment], bytes]:
    """D_version as DeltaSegment messages (several segments) and its h(v)."""
    raws = list(
        encode_delta(
            base,
            target,
            job=job,
            version=version,
            base_version=base_version,
            key=key,
            max_segment_bytes=2048,
            format_version=2,
        )
    )
    out = []
    for raw in raws:
        seg = sg.parse(raw, key)
        out.append(
            common_pb2.DeltaSegment(
                job_id=job,
                version=version,
                base_version=base_version,
                sequence=seg.seq,
                trailer=seg.is_trailer,
                data=raw,
            )
        )
    return out, sg.parse(raws[-1], key).hash


@pytest.fixture(scope="module")
def chain() -> tuple[list[WeightSet], list[list[common_pb2.DeltaSegment]], list[bytes]]:
    """v0..v3 and D_1..D_3 (each based on the version before), with h(v)."""
    rng = np.random.default_rng(7)
    ws = [model(rng, layers=2, hidden=32)]
    msgs: list[list[common_pb2.DeltaSegment]] = [[]]
    hashes = [b""]
    for v in range(1, 4):
        nxt = step(rng, ws[-1], 0.05)
        m, h = messages(ws[-1], nxt, v, v - 1)
        nxt.applied_hash = h
        ws.append(nxt)
        msgs.append(m)
        hashes.append(h)
    assert all(len(m) > 3 for m in msgs[1:])
    return ws, msgs, hashes


def push(st: VersionStaging, msgs: list[common_pb2.DeltaSegment], active: int) -> list[bool]:
    return [st.stage_message(m, active, source="push", pushed=True) for m in msgs]


def test_arriving_out_of_order_then_staged_duplicates_ignored(chain) -> None:
    _, msgs, hashes = chain
    st = VersionStaging(key=KEY, job=JOB)
    d1 = msgs[1]
    assert push(st, list(reversed(d1[1:])), 0) == [True] * (len(d1) - 1)  # trailer first, seq 0 last
    e = st.entries[1]
    assert e.state == ARRIVING and e.base_version == 0 and e.hash == hashes[1]  # the trailer's claim
    assert st.missing() == {1: [0]}
    assert push(st, d1[1:2], 0) == [False] and st.duplicates == 1  # a duplicate while arriving
    [p] = st.staged(1)
    assert not p.complete and p.parts_received == len(d1) - 1 and p.parts_total == len(d1)
    assert push(st, d1[:1], 0) == [True]
    assert e.state == STAGED and e.delta is not None and e.delta.hash == hashes[1]
    assert push(st, d1[:2], 0) == [False, False]  # staged: nothing more goes in
    assert st.segments_received == len(d1) and st.staged_deltas() == [1] and st.missing() == {}
    [p] = st.staged()
    assert p.complete and p.verified and p.hash == hashes[1] and p.source == "push"
    route = st.route(0, 1)
    assert route.full is None and [d.version for d in route.deltas] == [1] and route.hash == hashes[1]


def test_pushed_delta_on_a_base_neither_active_nor_staged_is_refused(chain) -> None:
    _, msgs, _ = chain
    st = VersionStaging(key=KEY, job=JOB)
    with pytest.raises(StagingError) as err:
        st.stage_message(msgs[2][0], 0, source="push", pushed=True)
    assert err.value.code == "FAILED_PRECONDITION" and "based on v1" in str(err.value)
    assert st.entries == {} and 2 in st.rejected
    with pytest.raises(StagingError) as err:
        st.route(0, 2)
    assert err.value.code == "FAILED_PRECONDITION" and err.value.at == 0 and "v2 was rejected" in str(err.value)
    # Once D_1 is arriving, D_2 (based on it) may stage alongside; the route is v0 -> v1 -> v2.
    push(st, msgs[1][:1], 0)
    push(st, msgs[2], 0)
    with pytest.raises(StagingError, match="still arriving"):
        st.route(0, 2)
    push(st, msgs[1][1:], 0)
    assert [d.version for d in st.route(0, 2).deltas] == [1, 2]


def test_pulled_delta_on_another_base_stages_but_is_no_route(chain) -> None:
    ws, _, _ = chain
    wrong, _ = messages(ws[0], ws[2], 2, 0)  # a valid, signed D_2 computed from v0 (base 0)
    st = VersionStaging(key=KEY, job=JOB)
    assert all(st.stage_message(m, 1, source="fetch", pushed=False) for m in wrong)  # active v1
    assert st.entries[2].state == STAGED and st.entries[2].base_version == 0
    with pytest.raises(StagingError) as err:
        st.route(1, 2)
    assert err.value.code == "FAILED_PRECONDITION" and err.value.at == 1
    assert "based on version 0, but the active version is 1" in str(err.value)
    with pytest.raises(StagingError, match="no staged delta is based on v3"):
        st.route(3, 4)  # nothing here says why: the generic reason


def test_a_whole_delta_that_does_not_fit_is_rejected_then_may_arrive_again(chain) -> None:
    _, msgs, hashes = chain

    def refuse(delta) -> None:  # type: ignore[no-untyped-def]
        raise IncompatibleTargetError("the served model has no such tensor")

    st = VersionStaging(key=KEY, job=JOB, fits=refuse)
    push(st, msgs[1][:-1], 0)
    with pytest.raises(StagingError) as err:
        push(st, msgs[1][-1:], 0)
    assert err.value.code == "FAILED_PRECONDITION"
    e = st.entries[1]
    assert e.state == REJECTED and e.delta is None
    [p] = st.staged(1)
    assert p.error and not p.complete and p.bytes_received == 0 and p.parts_received == 0
    with pytest.raises(StagingError, match="v1 was rejected"):
        st.route(0, 1)
    st.fits = None  # (say the model was replaced): the version may be pushed again, from scratch
    assert push(st, msgs[1], 0) == [True] * len(msgs[1])
    assert st.entries[1].state == STAGED and st.route(0, 1).hash == hashes[1]


def test_bad_segments_are_invalid_argument_and_stage_nothing(chain) -> None:
    ws, msgs, _ = chain
    st = VersionStaging(key=KEY, job=JOB)
    forged, _ = messages(ws[0], ws[1], 1, 0, key=OTHER_KEY)
    other_job, _ = messages(ws[0], ws[1], 1, 0, job="other-job")
    corrupt = common_pb2.DeltaSegment()
    corrupt.CopyFrom(msgs[1][0])
    data = bytearray(corrupt.data)
    data[len(data) // 2] ^= 0xFF
    corrupt.data = bytes(data)
    lying = common_pb2.DeltaSegment()
    lying.CopyFrom(msgs[1][1])
    lying.sequence = 7
    for bad in (forged[0], corrupt, lying, other_job[0], common_pb2.DeltaSegment(job_id=JOB, version=1)):
        with pytest.raises(StagingError) as err:
            st.stage_message(bad, 0, source="push", pushed=True)
        assert err.value.code == "INVALID_ARGUMENT", str(err.value)
    assert st.entries == {} and st.segments_received == 0
    with pytest.raises(StagingError) as err:
        VersionStaging(key=None, job=JOB).stage_message(msgs[1][0], 0, source="push", pushed=True)
    assert err.value.code == "FAILED_PRECONDITION"


def test_active_and_older_versions_are_duplicates_and_prune_drops_them(chain) -> None:
    _, msgs, _ = chain
    st = VersionStaging(key=KEY, job=JOB)
    push(st, msgs[1], 0)
    push(st, msgs[2], 0)
    st.prune(1)  # the owner made v1 active
    assert sorted(st.entries) == [2]
    assert push(st, msgs[1], 1) == [False] * len(msgs[1]) and sorted(st.entries) == [2]
    assert st.open(1, 1, "relay") is None and st.sink(2, 1, "relay") is None  # active; staged already
    assert [d.version for d in st.route(1, 2).deltas] == [2]


async def test_a_pull_sink_stages_parsed_segments(chain) -> None:
    _, msgs, hashes = chain
    st = VersionStaging(key=KEY, job=JOB)
    sink = st.sink(1, 0, "relay-a")
    assert sink is not None and st.arriving(0, 1) == []  # nothing in yet, no pull under way
    assert st.arriving(0, 1, pulling=lambda v: v == 1)[0].version == 1  # a pull is: wait for it
    for m in msgs[1]:
        assert await sink.put(sg.parse(m.data, KEY))
    assert not await sink.put(sg.parse(msgs[1][0].data, KEY))  # staged: nothing more goes in
    assert sink.tracker.complete and st.entries[1].state == STAGED and st.entries[1].source == "relay-a"
    assert st.route(0, 1).hash == hashes[1] and st.sink(1, 0, "relay-a") is None


def test_full_weights_then_deltas_and_bounded_staging(chain) -> None:
    ws, msgs, hashes = chain
    st = VersionStaging(key=KEY, job=JOB, max_versions=3)
    push(st, msgs[1][:1], 0)  # v1 arriving
    st.add_full(2, ws[2].copy(), hashes[2], artifact="buckets", source="mooncake", parts=3, nbytes=123)
    push(st, msgs[3], 0)  # D_3 is based on v2, which is staged (as full weights)
    route = st.route(0, 3)
    assert route.full is not None and route.full.version == 2 and [d.version for d in route.deltas] == [3]
    assert route.hash == hashes[3] and st.route(0, 2).hash == hashes[2] and st.route(0, 2).deltas == []
    [p2] = st.staged(2)
    assert p2.base_version == -1 and p2.complete and p2.parts_received == p2.parts_total == 3
    assert p2.artifact == common_pb2.WEIGHT_ARTIFACT_BUCKETS and p2.bytes_received == 123
    st.add_full(4, ws[3].copy(), b"", artifact="checkpoint", source="file", parts=1, nbytes=1)
    assert sorted(st.entries) == [2, 3, 4]  # full at 3: the unfinished v1 went first
