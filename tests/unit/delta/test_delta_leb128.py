from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from rollart.delta import FormatError, leb128


def reference_leb128(v: int) -> bytes:
    """Textbook per-value encoder, the oracle for the vectorised one."""
    out = bytearray()
    while True:
        byte = v & 0x7F
        v >>= 7
        if v:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)


EDGES = {
    0: "00",
    127: "7f",
    128: "8001",
    198: "c601",
    16383: "ff7f",
    16384: "808001",
    2**32: "8080808010",
    2**63: "80808080808080808001",
    2**64 - 1: "ffffffffffffffffff01",
}


@pytest.mark.parametrize("value,hexstr", EDGES.items())
def test_edge_values(value: int, hexstr: str) -> None:
    enc = leb128.encode(np.array([value], dtype=np.uint64))
    assert enc.hex() == hexstr == reference_leb128(value).hex() == leb128.encode_int(value).hex()
    assert int(leb128.decode(enc, 1)[0]) == value
    assert int(leb128.encoded_lengths(np.array([value], dtype=np.uint64))[0]) == len(enc)


def test_edge_values_concatenated() -> None:
    values = np.array(list(EDGES), dtype=np.uint64)
    enc = leb128.encode(values)
    assert enc == b"".join(reference_leb128(int(v)) for v in values)
    assert np.array_equal(leb128.decode(enc, values.size), values)


u64s = hnp.arrays(
    np.uint64,
    st.integers(0, 300),
    elements=st.one_of(st.integers(0, 300), st.integers(0, 2**64 - 1), st.sampled_from(list(EDGES))),
)


@settings(deadline=None)  # a 200 ms deadline fails on a loaded machine, not on a wrong encoding
@given(u64s)
def test_round_trip_matches_reference(values: np.ndarray) -> None:
    enc = leb128.encode(values)
    assert enc == b"".join(reference_leb128(int(v)) for v in values)
    assert enc == b"".join(leb128.encode_int(int(v)) for v in values)
    assert np.array_equal(leb128.decode(enc, values.size), values)


@settings(deadline=None)
@given(st.lists(st.integers(0, 2**40), min_size=1, max_size=300, unique=True))
def test_index_stream_round_trip(positions: list[int]) -> None:
    idx = np.array(sorted(positions), dtype=np.int64)
    stream, lengths = leb128.encode_indices(idx)
    gaps = np.diff(idx, prepend=0)
    assert stream == b"".join(reference_leb128(int(g)) for g in gaps)
    assert int(lengths.sum()) == len(stream)
    assert np.array_equal(leb128.decode_indices(stream, idx.size, 2**40 + 1), idx)


@pytest.mark.parametrize(
    "stream,why",
    [
        (b"\x80", "ends inside"),
        (b"\x05\xc6", "ends inside"),
        (b"\x80" * 10 + b"\x01", "longer than 10"),
        (b"\xff" * 9 + b"\x02", r"exceeds 2\^64-1"),
        (b"\x80\x00", "non-canonical"),
        (b"\x05\xff\x00", "non-canonical"),
    ],
)
def test_decode_rejects_malformed(stream: bytes, why: str) -> None:
    with pytest.raises(FormatError, match=why):
        leb128.decode(stream)


def test_decode_rejects_count_mismatch() -> None:
    with pytest.raises(FormatError, match="header says"):
        leb128.decode(b"\x01\x02\x03", 2)
    with pytest.raises(FormatError, match="header says"):
        leb128.decode(b"\x01\x82\x01", 3)


def test_decode_indices_rejects_unsorted_and_out_of_range() -> None:
    with pytest.raises(FormatError, match="strictly increasing"):
        leb128.decode_indices(b"\x05\x00", 2, 100)  # duplicate position
    with pytest.raises(FormatError, match="strictly increasing"):
        leb128.decode_indices(b"\x05\x81\x01\x00", 3, 1000)  # general path too
    with pytest.raises(FormatError, match="out of range"):
        leb128.decode_indices(b"\x05\x05", 2, 10)  # 5, 10 with 10 elements
    with pytest.raises(FormatError, match="out of range"):
        leb128.decode_indices(b"\xc6\x01", 1, 198)
    # the uint64 running sum would wrap: 2^63 + 2^63 reads as 0
    with pytest.raises(FormatError, match="out of range"):
        leb128.decode_indices(leb128.encode(np.array([2**63 - 1, 2**63 - 1, 3], np.uint64)), 3, 2**63)


@pytest.mark.parametrize("value", [-1, 2**64])
def test_encode_int_refuses_out_of_range(value: int) -> None:
    with pytest.raises(ValueError, match="out of range"):
        leb128.encode_int(value)
