"""Format version 3 (records, XOR values), the spec's settled points (order, precedence, rollart.job, window
size) and the weights digest of a 0-d tensor."""

from __future__ import annotations

import hashlib
import hmac
import re
import struct
import zlib
from pathlib import Path

import numpy as np
import pytest
import zstandard
from delta_testlib import KEY, OTHER_KEY, qwen3_like, random_raw, same_bits, train_step
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rollart.delta import (
    ALL_DTYPES,
    AuthError,
    BaseMismatchError,
    ChecksumError,
    DeltaError,
    DeltaWriter,
    FormatError,
    IncompatibleTargetError,
    TruncatedError,
    WeightSet,
    apply_delta,
    decode_delta,
    encode_delta,
    inspect_delta,
    streams,
    weights_digest,
)
from rollart.delta import dtypes as dt
from rollart.delta import records as rc
from rollart.delta import segment as sg
from rollart.delta.identity import digest_matches

DOC = Path(__file__).resolve().parents[3] / "docs" / "delta-format.md"
SECRET = b"secret"


def _doc_section(title: str) -> list[bytes]:
    text = DOC.read_text()
    start = text.index(f"## {title}")
    end = text.index("\n## ", start + 1)
    blocks = re.findall(r"```\n(0000:.*?)```", text[start:end], flags=re.S)
    return [bytes.fromhex("".join(line.split(":", 1)[1] for line in b.strip().splitlines())) for b in blocks]


def _example_weights() -> tuple[WeightSet, WeightSet]:
    """The v3 worked example's base and target (docs/delta-format.md), in a dict order that is not name order."""
    w0 = np.zeros(300, np.uint16)
    w0[3], w0[201] = 0x3F80, 0xBF80
    w1 = w0.copy()
    w1[3], w1[201] = 0x3F81, 0xBF82
    dts = {"w": "BF16", "s": "BF16", "b": "BF16"}
    base = {"w": w0, "s": np.array(0x3F80, np.uint16), "b": np.full(64, 0x3F80, np.uint16)}
    target = {"w": w1, "s": np.array(0x4000, np.uint16), "b": np.full(64, 0x3F81, np.uint16)}
    return WeightSet(base, dict(dts), 1, bytes(range(32))), WeightSet(target, dict(dts), 2)


def encode3(v0: WeightSet, v1: WeightSet, **kw) -> list[bytes]:
    kw = {"job": "j", "version": (v0.version or 0) + 1, "key": KEY} | kw
    return list(encode_delta(v0, v1, **kw))


# ---------------------------------------------------------------------------------------------- worked example


def test_worked_example_is_what_the_reference_encoder_writes() -> None:
    doc = _doc_section("Worked example, version 3")
    assert len(doc) == 2
    base, target = _example_weights()
    segs = list(encode_delta(base, target, job="j1", version=2, key=SECRET))
    assert segs == doc
    d = decode_delta(doc, SECRET, job="j1", version=2, base_version=1, base_hash=bytes(range(32)))
    assert d.format_version == 3 and list(d.tensors) == ["b", "s", "w"] and d.segment_count == 1
    assert d.hash == hashlib.sha256(doc[0]).digest() and d.total_entries == 67
    assert d.tensors["w"].indices.tolist() == [3, 201] and d.tensors["w"].values.tolist() == [1, 2]
    assert d.tensors["s"].values.tolist() == [0x7F80] and d.tensors["s"].xor
    out = base.copy()
    assert apply_delta(d, out) and same_bits(out, target)
    recs = sg.parse(doc[0], SECRET).tensor_records
    assert [(r.name, r.layout, r.value_coding, r.transform, r.shape) for r in recs] == [
        ("b", 2, 1, 1, (64,)),
        ("s", 2, 0, 1, ()),
        ("w", 1, 0, 1, (300,)),
    ]
    assert doc[0][0x85:0x88] == bytes.fromhex("03c601")  # the index stream where the table says


# ---------------------------------------------------------------------------------------------- round trips


@st.composite
def tensor_pairs(draw: st.DrawFn) -> tuple[WeightSet, WeightSet, int]:
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    arrays, targets, dts = {}, {}, {}
    for i, dtype in enumerate(draw(st.lists(st.sampled_from(ALL_DTYPES), min_size=1, max_size=6))):
        shape = tuple(draw(st.lists(st.integers(1, 40), min_size=0, max_size=3)))
        name = f"t{draw(st.integers(0, 99))}.{i}.{dtype.lower()}"
        a = random_raw(rng, dtype, shape)
        b = a.copy()
        flat = b.reshape(-1)
        pos = np.flatnonzero(rng.random(flat.size) < draw(st.sampled_from([0.0, 0.01, 0.2, 0.6, 1.0])))
        flat[pos] = random_raw(rng, dtype, (pos.size,))
        arrays[name], targets[name], dts[name] = a, b, dtype
    max_bytes = draw(st.sampled_from([256, 700, 4096, sg.DEFAULT_MAX_SEGMENT_BYTES]))
    return WeightSet(arrays, dts, version=3), WeightSet(targets, dict(dts), version=4), max_bytes


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(tensor_pairs())
def test_v3_apply_reproduces_target_bit_for_bit(pair: tuple[WeightSet, WeightSet, int]) -> None:
    v0, v1, max_bytes = pair
    segs = encode3(v0, v1, max_segment_bytes=max_bytes)
    assert all(len(s) <= max_bytes for s in segs)
    delta = decode_delta(b"".join(segs), KEY, job="j", version=4, base_version=3)
    assert delta.format_version == 3
    names = [r.name for s in segs[:-1] for r in sg.parse(s, KEY).tensor_records]
    assert names == sorted(names)  # tensors in name order, each tensor's parts consecutive
    target = v0.copy()
    assert apply_delta(delta, target) is True and same_bits(target, v1)
    assert apply_delta(delta, target) is False and same_bits(target, v1)  # XOR values are not applied twice


@pytest.mark.parametrize("density", [0.001, 0.05, 0.3, 0.6, 1.0])
def test_fused_model_round_trip_and_every_path(density: float) -> None:
    rng = np.random.default_rng(int(density * 1000))
    v0 = qwen3_like(rng, layers=2, hidden=64)
    v1 = train_step(rng, v0, density)
    segs = encode3(v0, v1, max_segment_bytes=20_000)
    d = decode_delta(segs, KEY)
    assert "model.layers.0.self_attn.qkv_proj.weight" in d.tensors or density < 0.01
    out = v0.copy()
    apply_delta(d, out)
    assert same_bits(out, v1)
    if density >= 0.6:  # most of every large tensor changed: dense XOR records, no positions computed
        big = [td for td in d.tensors.values() if td.numel >= 4096]
        assert len(big) >= 8 and all(td.dense_segments == td.segments and td.xor for td in big)


def test_small_tensors_share_a_segment_and_big_ones_split() -> None:
    rng = np.random.default_rng(3)
    arrays = {f"norm.{i:02d}": random_raw(rng, "BF16", (64,)) for i in range(40)}
    arrays["big"] = random_raw(rng, "BF16", (200_000,))
    v0 = WeightSet(arrays, dict.fromkeys(arrays, "BF16"), version=0)
    v1 = train_step(rng, v0, 0.05)
    segs = encode3(v0, v1, max_segment_bytes=8192)
    parsed = [sg.parse(s, KEY) for s in segs[:-1]]
    assert all(len(s) <= 8192 for s in segs)
    counts = [len(p.tensor_records) for p in parsed]
    assert max(counts) > 10  # many norms in one segment
    big = [r for p in parsed for r in p.tensor_records if r.name == "big"]
    assert len(big) > 2 and [r.part for r in big] == list(range(len(big)))
    v2 = encode3(v0, v1, max_segment_bytes=8192, format_version=2)
    assert sum(map(len, segs)) < sum(map(len, v2))  # one header per segment, not per tensor
    out = v0.copy()
    apply_delta(decode_delta(segs, KEY), out)
    assert same_bits(out, v1)


def test_never_larger_than_xor_and_zstd1() -> None:
    """The issue's size bound on a model with small-ulp moves (the benchmark checks it at 64 MiB)."""
    rng = np.random.default_rng(11)
    shapes = {"embed": (2048, 256), "q": (256, 256), "up": (768, 256), "down": (256, 768), "norm": (256,)}
    base = {n: ((rng.standard_normal(s).astype(np.float32) * 0.02).view(np.uint32) >> 16).astype(np.uint16)
            for n, s in shapes.items()}  # fmt: skip
    v0 = WeightSet(base, dict.fromkeys(base, "BF16"), version=0)
    cctx = zstandard.ZstdCompressor(level=1)
    for density in (0.001, 0.01, 0.1, 0.5, 1.0):
        target = {}
        for n, a in base.items():
            b = a.copy().reshape(-1)
            pos = np.arange(b.size) if density == 1 else np.flatnonzero(rng.random(b.size) < density)
            b[pos] += rng.integers(1, 4, pos.size).astype(np.uint16)
            target[n] = b.reshape(a.shape)
        v1 = WeightSet(target, dict(v0.dtypes), version=1)
        xz = sum(len(cctx.compress(np.bitwise_xor(base[n], target[n]).data)) for n in base)
        segs = encode3(v0, v1)
        assert sum(map(len, segs)) <= xz, (density, sum(map(len, segs)), xz)
        out = v0.copy()
        apply_delta(decode_delta(segs, KEY), out)
        assert same_bits(out, v1)


def test_unchanged_version_is_one_xor_zero_entry() -> None:
    v0 = qwen3_like(np.random.default_rng(1))
    v1 = v0.copy()
    v1.version = 1
    segs = encode3(v0, v1)
    d = decode_delta(segs, KEY)
    assert d.total_entries == 1 and d.segment_count == 1
    (td,) = d.tensors.values()
    assert td.xor and td.values.tolist() == [0]
    out = v0.copy()
    assert apply_delta(d, out) and same_bits(out, v1) and out.applied_hash == d.hash


def test_decoder_accepts_any_tensor_order_and_v2_still_writes() -> None:
    w = DeltaWriter(job="j", version=1, base_version=0, key=KEY, base_hash=b"\1" * 32, pack=True)
    segs = [*w.add_tensor("w", "U8", (4,), np.array([1]), np.array([7], np.uint8))]
    segs += [*w.add_tensor("b", "U8", (4,), np.array([2]), np.array([9], np.uint8)), *w.flush(), w.trailer()]
    assert len(segs) == 2  # both records in one segment, "w" first
    d = decode_delta(segs, KEY)
    assert list(d.tensors) == ["w", "b"] and not d.tensors["w"].xor
    with pytest.raises(RuntimeError, match="flush"):
        w2 = DeltaWriter(job="j", version=1, base_version=0, key=KEY, base_hash=b"\1" * 32, pack=True)
        list(w2.add_tensor("w", "U8", (4,), np.array([1]), np.array([7], np.uint8)))
        w2.trailer()


# ---------------------------------------------------------------------------------------------- digest


def test_scalar_digest_computed_by_hand_from_the_spec() -> None:
    arrays = {"s": np.array(0x3F80, np.uint16), "v": np.array([1, 2], np.uint16)}
    dtypes = {"s": "BF16", "v": "BF16"}
    # the spec: "rollart-weights/1" 00, then per tensor in name order: name 00 dtype 00 shape 00 bytes,
    # the shape "as decimal numbers joined by ',' (empty for a scalar)"
    by_hand = hashlib.sha256(
        b"rollart-weights/1\x00" + b"s\x00BF16\x00\x00" + b"\x80\x3f" + b"v\x00BF16\x002\x00" + b"\x01\x00\x02\x00"
    ).digest()
    assert weights_digest(arrays, dtypes) == by_hand


def test_scalar_and_one_element_tensor_differ() -> None:
    scalar = {"x": np.array(7, np.int32)}
    one = {"x": np.array([7], np.int32)}
    assert weights_digest(scalar, {"x": "I32"}) != weights_digest(one, {"x": "I32"})
    # the legacy digest hashed the scalar as [1]: the two collided
    assert weights_digest(scalar, {"x": "I32"}, legacy=True) == weights_digest(one, {"x": "I32"})


def test_a_base_hashed_the_legacy_way_is_still_accepted() -> None:
    rng = np.random.default_rng(4)
    arrays = {"scale": np.array(0x3F80, np.uint16), "w": random_raw(rng, "BF16", (32, 8))}
    v0 = WeightSet(arrays, dict.fromkeys(arrays, "BF16"), version=0)
    v1 = train_step(rng, v0, 0.3)
    legacy = weights_digest(v0.arrays, v0.dtypes, legacy=True)
    assert legacy != weights_digest(v0.arrays, v0.dtypes) and digest_matches(v0.arrays, v0.dtypes, legacy)
    for fmt in (2, 3):  # a delta written against the legacy identity (an older encoder) applies
        d = decode_delta(encode3(v0, v1, base_hash=legacy, format_version=fmt), KEY)
        out = v0.copy()
        assert apply_delta(d, out) and same_bits(out, v1)
    # the legacy form of other weights is still another identity
    other = v0.copy()
    other.arrays["scale"][()] = 0x4000
    with pytest.raises(BaseMismatchError):
        apply_delta(d, other)
    # weights without a 0-d tensor have one digest only
    plain = WeightSet({"w": v0.arrays["w"]}, {"w": "BF16"}, version=0)
    assert weights_digest(plain.arrays, plain.dtypes, legacy=True) == weights_digest(plain.arrays, plain.dtypes)


# ---------------------------------------------------------------------------------------------- precedence


def _reseal(raw: bytes | bytearray, key: bytes = KEY) -> bytes:
    body = bytes(raw[: -sg.FOOTER_BYTES])
    body += struct.pack("<I", zlib.crc32(body))
    return body + hmac.new(key, body, hashlib.sha256).digest()


def _pair() -> tuple[WeightSet, WeightSet, list[bytes]]:
    rng = np.random.default_rng(6)
    v0 = qwen3_like(rng, layers=1, hidden=32)
    v1 = train_step(rng, v0, 0.2)
    segs = encode3(v0, v1, max_segment_bytes=900)
    assert len(segs) > 4
    return v0, v1, segs


def test_error_precedence_follows_the_spec() -> None:
    v0, _, segs = _pair()
    bad_crc = bytearray(segs[0])
    bad_crc[-40] ^= 1  # a body byte: the CRC fails (and so would the HMAC)
    bad_mac = bytearray(segs[1])
    bad_mac[-1] ^= 1  # the HMAC only
    # segment by segment: the first segment's fault wins, whichever it is
    with pytest.raises(ChecksumError):
        decode_delta([bytes(bad_crc), bytes(bad_mac), *segs[2:]], KEY)
    mac0 = bytearray(segs[0])
    mac0[-1] ^= 1
    crc1 = bytearray(segs[1])
    crc1[-40] ^= 1
    with pytest.raises(AuthError):
        decode_delta([bytes(mac0), bytes(crc1), *segs[2:]], KEY)
    # within a segment: the CRC before the HMAC (a corrupt byte is corruption, not forgery)
    both = bytearray(bad_crc)
    both[-1] ^= 1
    with pytest.raises(ChecksumError):
        decode_delta([bytes(both), *segs[1:]], KEY)
    # whole delta: a missing segment before a wrong h(v)
    tr = sg.parse(segs[-1], KEY)
    wrong = sg.build_trailer(key=KEY, job=b"j", version=1, base_version=0, segment_count=tr.segment_count,
                             tensor_count=tr.tensor_count, total_entries=tr.total_entries, digest=b"\0" * 32,
                             fmt=3, base_hash=tr.base_hash)  # fmt: skip
    with pytest.raises(TruncatedError):
        DeltaStagerAll(segs[:1] + segs[2:-1] + [wrong])
    # apply: the base checks before the target checks
    d = decode_delta(segs, KEY)
    target = v0.copy()
    del target.arrays[next(iter(target.arrays))]
    target.version = 5
    with pytest.raises(BaseMismatchError):
        apply_delta(d, target)
    target.version, target.applied_hash = 0, d.base_hash  # the right base, a tensor short
    with pytest.raises(IncompatibleTargetError):
        apply_delta(d, target)


def DeltaStagerAll(segs: list[bytes]) -> None:  # noqa: N802
    """Stage segments in the order given (a receiver of stripes) and finish."""
    from rollart.delta import DeltaStager

    st_ = DeltaStager(KEY)
    for s in segs:
        st_.add(s)
    st_.finish()


def test_apply_does_not_check_the_job_label() -> None:
    v0, v1, segs = _pair()
    d = decode_delta(segs, KEY)
    forked = v0.copy()
    forked.metadata = {"rollart.job": "another-job", "rollart.version": "0"}
    assert apply_delta(d, forked) and same_bits(forked, v1)  # same weights, same identity: applies
    elsewhere = v0.copy()
    elsewhere.metadata = {"rollart.job": "j"}
    elsewhere.applied_hash = b"\7" * 32  # the right job label, other weights: refused by identity
    with pytest.raises(BaseMismatchError):
        apply_delta(d, elsewhere)


# ---------------------------------------------------------------------------------------------- window size


def _frame_with_window(size: int, byte: int, exponent: int) -> bytes:
    """One Zstandard frame of ``size`` copies of ``byte`` (one RLE block), declaring a window of
    2^(10+exponent) bytes (RFC 8878: not single-segment, so a Window_Descriptor; a 2-byte content size,
    stored minus 256)."""
    assert 256 <= size < 65536 + 256
    fhd = 0b01 << 6  # Frame_Content_Size_flag 1: 2 bytes; Single_Segment 0; no checksum; no dictionary
    head = b"\x28\xb5\x2f\xfd" + bytes((fhd, exponent << 3)) + struct.pack("<H", size - 256)
    block = ((size << 3) | (1 << 1) | 1).to_bytes(3, "little")  # last block, RLE
    return head + block + bytes((byte,))


def test_a_window_above_8_mib_is_refused_with_a_clear_error() -> None:
    big = _frame_with_window(512, 7, 14)  # 2^24 = 16 MiB
    small = _frame_with_window(512, 7, 13)  # 8 MiB: the most a decoder must accept
    assert zstandard.ZstdDecompressor(max_window_size=1 << 25).decompress(big) == bytes([7]) * 512  # valid
    assert zstandard.get_frame_parameters(big).window_size == 1 << 24
    d = dt.by_name("U16")
    for frame, ok in ((small, True), (big, False)):
        head = rc.header(name=b"w", dtype=d, shape=(256,), part=0, parts=1, layout=rc.LAYOUT_DENSE,
                         index_coding=0, value_coding=1, transform=0, entries=256, start=0, index_bytes=0,
                         value_bytes=len(frame))  # fmt: skip
        seg = sg.build_v3(key=KEY, job=b"j", version=1, base_version=0, seq=0, base_hash=b"\0" * 32,
                          records=[(head, b"", frame)])  # fmt: skip
        (rec,) = sg.parse(seg, KEY).tensor_records
        if ok:
            assert streams.decode_record(rec).values.tolist() == [0x0707] * 256
        else:
            with pytest.raises(FormatError, match="window of 16777216 bytes exceeds the 8388608"):
                streams.decode_record(rec)
            with pytest.raises(FormatError, match="window"):  # and so the whole delta
                decode_delta([seg], KEY)


# ---------------------------------------------------------------------------------------------- hostile bytes


def test_v3_mutations_are_rejected_and_nothing_is_written() -> None:
    v0, _, segs = _pair()
    rng = np.random.default_rng(12)
    for k in (0, len(segs) // 2, len(segs) - 2):
        raw = segs[k]
        head = sg.v3_overhead(b"j") - sg.FOOTER_BYTES  # the records start here
        for pos in sorted(rng.choice(np.arange(head, len(raw) - sg.FOOTER_BYTES), 40, replace=False).tolist()):
            for how in ("raw", "resealed"):
                m = bytearray(raw)
                m[pos] ^= 1 << int(rng.integers(8))
                blob = bytes(m) if how == "raw" else _reseal(m)
                target = v0.copy()
                with pytest.raises(DeltaError):
                    apply_delta(decode_delta([*segs[:k], blob, *segs[k + 1 :]], KEY), target)
                assert same_bits(target, v0)
        for cut in sorted(rng.choice(np.arange(head, len(raw)), 20, replace=False).tolist()):
            with pytest.raises(DeltaError):
                decode_delta([*segs[:k], _reseal(raw[:cut] + raw[-sg.FOOTER_BYTES :]), *segs[k + 1 :]], KEY)
    with pytest.raises(AuthError):
        decode_delta([_reseal(segs[0], OTHER_KEY), *segs[1:]], KEY)
    info = inspect_delta(b"".join(segs), KEY)
    assert info["format_version"] == 3 and info["entries"] == decode_delta(segs, KEY).total_entries
