from __future__ import annotations

import numpy as np
import pytest
from delta_testlib import KEY, OTHER_KEY, qwen3_like, same_bits, train_step
from hypothesis import given, settings
from hypothesis import strategies as st

from rollart.delta import (
    AuthError,
    BaseMismatchError,
    ChecksumError,
    DeltaStager,
    SequenceError,
    TruncatedError,
    apply_delta,
    decode_delta,
    encode_delta,
)

RNG = np.random.default_rng(11)
V0 = qwen3_like(RNG, layers=2, hidden=16)
V1 = train_step(RNG, V0, 0.2)
SEGS = list(encode_delta(V0, V1, job="job-s", version=1, key=KEY, max_segment_bytes=700))
REFERENCE = decode_delta(SEGS, KEY)


@settings(max_examples=60, deadline=None)
@given(st.permutations(range(len(SEGS))))
def test_any_arrival_order_assembles_the_same_delta(order: list[int]) -> None:
    stager = DeltaStager(KEY, job="job-s", version=1, base_version=0)
    for i, k in enumerate(order):
        assert not stager.complete
        stager.add(SEGS[k])
        assert stager.received == sorted(order[: i + 1]) or stager.expected_count is not None
    assert stager.complete and stager.missing() == []
    delta = stager.finish()
    assert delta.hash == REFERENCE.hash and delta.total_entries == REFERENCE.total_entries
    out = V0.copy()
    apply_delta(delta, out)
    assert same_bits(out, V1)


def test_missing_reports_exact_sequence_numbers() -> None:
    n = len(SEGS)
    assert n > 6
    stager = DeltaStager(KEY)
    assert stager.missing() == [0]  # nothing known yet: ask for the first
    for k in (0, 2, 3):
        stager.add(SEGS[k])
    assert stager.missing() == [1, 4]  # gap, plus "whatever follows 3"
    with pytest.raises(TruncatedError) as e:
        stager.finish()
    assert e.value.missing == [1, 4]
    stager.add(SEGS[-1])  # trailer: now the count is known
    assert stager.expected_count == n
    assert stager.missing() == [1, *range(4, n - 1)]
    for k in stager.missing():
        stager.add(SEGS[k])
    assert stager.complete and stager.finish().hash == REFERENCE.hash


def test_duplicates_are_ignored_and_conflicts_rejected() -> None:
    stager = DeltaStager(KEY)
    stager.add(SEGS[0])
    stager.add(SEGS[0])  # a retransmission after a reconnect
    assert stager.received == [0]
    other = list(encode_delta(V0, train_step(np.random.default_rng(1), V0, 0.2), job="job-s", version=1, key=KEY))
    with pytest.raises(SequenceError, match="two different"):
        stager.add(other[0])
    stager.add(SEGS[-1])
    with pytest.raises(SequenceError):
        stager.add(other[-1])


def test_bad_segments_are_refused_without_staging() -> None:
    stager = DeltaStager(KEY, job="job-s", version=1, base_version=0)
    bad = bytearray(SEGS[1])
    bad[40] ^= 0x10
    with pytest.raises(ChecksumError):
        stager.add(bytes(bad))
    forged = list(encode_delta(V0, V1, job="job-s", version=1, key=OTHER_KEY, max_segment_bytes=700))
    with pytest.raises(AuthError):
        stager.add(forged[1])
    wrong_base = list(encode_delta(V0, V1, job="job-s", version=1, base_version=0, key=KEY))
    ok = DeltaStager(KEY, base_version=7)
    with pytest.raises(BaseMismatchError):
        ok.add(wrong_base[0])
    assert stager.received == [] and ok.received == []
    assert stager.missing() == [0]
