from __future__ import annotations

import struct
import zlib

import numpy as np
import pytest
from delta_testlib import KEY, OTHER_KEY, mutate, qwen3_like, random_raw, same_bits, train_step
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rollart.delta import (
    ALL_DTYPES,
    AuthError,
    BaseMismatchError,
    ChecksumError,
    DeltaEncoder,
    DeltaError,
    DeltaWriter,
    FormatError,
    IncompatibleTargetError,
    MismatchError,
    ParamMap,
    SequenceError,
    TrailerError,
    TruncatedError,
    UnsupportedVersionError,
    WeightSet,
    apply_delta,
    apply_entries,
    decode_delta,
    encode_delta,
    inspect_delta,
)
from rollart.delta import segment as sg


def encode(v0: WeightSet, v1: WeightSet, **kw) -> list[bytes]:
    kw = {"job": "job-1", "version": 1, "key": KEY} | kw
    return list(encode_delta(v0, v1, **kw))


def small_pair(seed: int = 0, density: float = 0.1) -> tuple[WeightSet, WeightSet]:
    rng = np.random.default_rng(seed)
    v0 = qwen3_like(rng, layers=1, hidden=16)
    return v0, train_step(rng, v0, density)


# ---------------------------------------------------------------------------------------------- exactness


@st.composite
def tensor_pairs(draw: st.DrawFn) -> tuple[WeightSet, WeightSet, int]:
    seed = draw(st.integers(0, 2**32 - 1))
    rng = np.random.default_rng(seed)
    dtypes = draw(st.lists(st.sampled_from(ALL_DTYPES), min_size=1, max_size=5))
    density = draw(st.sampled_from([0.0, 0.01, 0.3, 1.0]))
    arrays, targets, dts = {}, {}, {}
    for i, dtype in enumerate(dtypes):
        shape = tuple(draw(st.lists(st.integers(1, 9), min_size=0, max_size=3)))
        name = f"layer.{i}.{dtype.lower()}"
        arrays[name] = random_raw(rng, dtype, shape)
        targets[name] = mutate(rng, arrays[name], dtype, density)
        dts[name] = dtype
    max_bytes = draw(st.sampled_from([256, 400, 4096, sg.DEFAULT_MAX_SEGMENT_BYTES]))
    return WeightSet(arrays, dts, version=3), WeightSet(targets, dict(dts), version=4), max_bytes


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(tensor_pairs(), st.sampled_from([1, 2]))
def test_apply_reproduces_target_bit_for_bit(pair: tuple[WeightSet, WeightSet, int], fmt: int) -> None:
    v0, v1, max_bytes = pair
    segs = encode(v0, v1, version=4, base_version=3, max_segment_bytes=max_bytes, format_version=fmt)
    assert all(len(s) <= max_bytes for s in segs)
    delta = decode_delta(b"".join(segs), KEY, job="job-1", version=4, base_version=3)
    assert delta.format_version == fmt
    target = v0.copy()
    assert apply_delta(delta, target) is True
    assert same_bits(target, v1)
    assert target.version == 4 and target.applied_hash == delta.hash
    if fmt == 2:  # sparse pieces hold changed positions only; dense pieces and the anchor cover the rest
        return
    # set semantics: applying the entries again changes nothing
    apply_entries(delta, target.arrays)
    assert same_bits(target, v1)
    # and apply_delta on a target already at v is a no-op
    assert apply_delta(delta, target) is False
    assert same_bits(target, v1)
    # decoded values are the target's bit patterns at exactly the changed positions
    for td in delta.tensors.values():
        a = v0.arrays[td.name].reshape(-1).view(f"u{v0.arrays[td.name].itemsize}")
        b = v1.arrays[td.name].reshape(-1).view(a.dtype)
        assert np.array_equal(td.indices, np.flatnonzero(a != b))


def test_special_float_bit_patterns_are_exact() -> None:
    base = np.array([0.0, 1.0, np.nan, -0.0, np.inf], dtype=np.float32)
    new = base.copy()
    new[0] = -0.0  # equal as floats, different bits
    new.view(np.uint32)[2] = 0x7FC00001  # another NaN payload
    v0 = WeightSet({"w": base}, {"w": "F32"}, version=0)
    v1 = WeightSet({"w": new}, {"w": "F32"}, version=1)
    delta = decode_delta(encode(v0, v1), KEY)
    assert delta.tensors["w"].indices.tolist() == [0, 2]
    out = v0.copy()
    apply_delta(delta, out)
    assert out.arrays["w"].view(np.uint32).tolist() == new.view(np.uint32).tolist()


def test_unchanged_model_gives_trailer_only() -> None:
    v0, _ = small_pair()
    v1 = v0.copy()
    v1.version = 1
    segs = encode(v0, v1, format_version=1)
    assert len(segs) == 1
    delta = decode_delta(segs, KEY)
    assert delta.total_entries == 0 and delta.hash == __import__("hashlib").sha256(b"").digest()
    out = v0.copy()
    assert apply_delta(delta, out) and out.version == 1 and same_bits(out, v1)


def test_large_tensor_is_split_into_bounded_segments() -> None:
    rng = np.random.default_rng(5)
    a = random_raw(rng, "BF16", (512, 256))
    b = mutate(rng, a, "BF16", 0.5)
    b[-1, -1] ^= 1  # make the last position change too
    v0 = WeightSet({"big": a}, {"big": "BF16"}, version=0)
    v1 = WeightSet({"big": b}, {"big": "BF16"}, version=1)
    segs = encode(v0, v1, max_segment_bytes=8192, format_version=2)
    parsed = [sg.parse(s, KEY) for s in segs]
    data = [p for p in parsed if not p.is_trailer]
    assert len(data) > 20 and all(len(s) <= 8192 for s in segs)
    assert [p.part for p in data] == list(range(len(data))) and {p.parts for p in data} == {len(data)}
    out = v0.copy()
    apply_delta(decode_delta(segs, KEY), out)
    assert same_bits(out, v1)
    # version 3: the same, one record per segment (a part fills its segment)
    segs = encode(v0, v1, max_segment_bytes=8192)
    recs = [r for s in segs for r in sg.parse(s, KEY).tensor_records]
    assert len(recs) > 20 and all(len(s) <= 8192 for s in segs) and len(recs) == len(segs) - 1
    assert [r.part for r in recs] == list(range(len(recs))) and {r.parts for r in recs} == {len(recs)}
    out = v0.copy()
    apply_delta(decode_delta(segs, KEY), out)
    assert same_bits(out, v1)


def test_encoder_streams_before_extraction_ends() -> None:
    v0, v1 = small_pair(density=0.2)
    touched: list[str] = []

    class Spy(dict):
        def __getitem__(self, k: str) -> np.ndarray:
            touched.append(k)
            return super().__getitem__(k)

    v1s = WeightSet(Spy(v1.arrays), v1.dtypes, 1)
    gen = encode_delta(v0, v1s, job="j", version=1, key=KEY, max_segment_bytes=600)  # v3 packs up to a segment
    first = next(gen)
    assert sg.parse(first, KEY).seq == 0
    assert len(set(touched)) < len(v1.arrays)  # later tensors not compared yet
    rest = list(gen)
    assert len(set(touched)) == len(v1.arrays) and sg.parse(rest[-1], KEY).is_trailer


@pytest.mark.parametrize("fmt", [1, 2])
def test_writer_accepts_precomputed_positions(fmt: int) -> None:
    w = DeltaWriter(
        job="j", version=9, base_version=8, key=KEY, max_segment_bytes=300, format_version=fmt, base_hash=b"h" * 32
    )
    idx = np.array([0, 5, 200, 70_000, 2**33], dtype=np.int64)
    vals = np.arange(5, dtype=np.int64) - 2
    segs = list(w.add_tensor("emb", "I64", (2**34,), idx, vals)) + [w.trailer()]
    d = decode_delta(segs, KEY)
    assert d.tensors["emb"].indices.tolist() == idx.tolist() and d.tensors["emb"].values.tolist() == vals.tolist()
    assert d.hash == w.hash and d.version == 9 and d.base_version == 8
    with pytest.raises(ValueError, match="ascending"):
        list(
            DeltaWriter(job="j", version=1, base_version=0, key=KEY, format_version=1).add_tensor(
                "x", "U8", (4,), [2, 1], np.ones(2, np.uint8)
            )
        )
    with pytest.raises(ValueError, match="below"):
        DeltaWriter(job="j", version=1, base_version=1, key=KEY, format_version=1)
    with pytest.raises(ValueError, match="base_hash"):  # version 2 names its base
        DeltaWriter(job="j", version=1, base_version=0, key=KEY)


def test_inspect_reports_sizes() -> None:
    v0, v1 = small_pair()
    segs = encode(v0, v1, max_segment_bytes=1024)
    info = inspect_delta(b"".join(segs), KEY)
    d = decode_delta(segs, KEY)
    assert info["version"] == 1 and info["base_version"] == 0 and info["segments"] == len(segs)
    assert info["entries"] == d.total_entries and info["total_bytes"] == sum(map(len, segs))
    assert info["hash"] == d.hash.hex() and info["authenticated"] is True
    assert {t["name"]: t["entries"] for t in info["tensors"]} == {n: t.entries for n, t in d.tensors.items()}
    assert sum(t["index_bytes"] for t in info["tensors"]) == info["index_bytes"]
    assert info["value_bytes"] <= 2 * info["entries"]  # bf16, Zstandard byte planes when smaller
    assert info["format_version"] == 3 and info["base_hash"] == d.base_hash.hex()
    assert info["not_checked"] and all("target" not in c for c in info["checked"])  # no base given


# ---------------------------------------------------------------------------------------------- rejections


def test_wrong_base_is_rejected_and_target_untouched() -> None:
    v0, v1 = small_pair()
    delta = decode_delta(encode(v0, v1), KEY)
    target = v0.copy()
    target.version = 5
    before = target.copy()
    with pytest.raises(BaseMismatchError):
        apply_delta(delta, target)
    assert same_bits(target, before) and target.version == 5
    target.version = None
    with pytest.raises(BaseMismatchError, match="unknown"):
        apply_delta(delta, target)
    with pytest.raises(BaseMismatchError):  # the stager pins the expected base
        decode_delta(encode(v0, v1), KEY, base_version=3)
    # at version v but from another delta (same version, different content)
    other = decode_delta(encode(v0, train_step(np.random.default_rng(9), v0, 0.1)), KEY)
    t2 = v0.copy()
    apply_delta(delta, t2)
    with pytest.raises(BaseMismatchError, match="different delta"):
        apply_delta(other, t2)


def test_every_corrupted_byte_is_rejected() -> None:
    v0, v1 = small_pair(density=0.02)
    segs = encode(v0, v1, max_segment_bytes=512)
    blob = b"".join(segs)
    assert len(blob) < 20_000
    kinds: set[str] = set()
    for i in range(len(blob)):
        bad = bytearray(blob)
        bad[i] ^= 0x01 << (i % 8)
        with pytest.raises(DeltaError) as e:
            decode_delta(bytes(bad), KEY)
        kinds.add(type(e.value).__name__)
    assert "ChecksumError" in kinds  # most flips; length/magic/version flips give framing errors


def test_corrupted_payload_gives_checksum_error() -> None:
    v0, v1 = small_pair()
    segs = encode(v0, v1)
    bad = bytearray(segs[0])
    bad[len(bad) // 2] ^= 0xFF
    with pytest.raises(ChecksumError):
        decode_delta([bytes(bad), *segs[1:]], KEY)


def test_forged_segments_are_rejected() -> None:
    v0, v1 = small_pair()
    segs = encode(v0, v1)
    with pytest.raises(AuthError):
        decode_delta(segs, OTHER_KEY)
    forged = encode(v0, train_step(np.random.default_rng(7), v0, 0.3), key=OTHER_KEY)
    with pytest.raises(AuthError):  # a forger's segment (valid CRC) spliced into a genuine stream
        decode_delta([forged[0], *segs[1:]], KEY)
    # recomputing the CRC after tampering does not help without the key
    bad = bytearray(segs[0][: -sg.FOOTER_BYTES])
    bad[-1] ^= 1
    bad += struct.pack("<I", zlib.crc32(bad)) + segs[0][-32:]
    with pytest.raises(AuthError):
        decode_delta([bytes(bad), *segs[1:]], KEY)


def test_truncation_anywhere_is_rejected() -> None:
    v0, v1 = small_pair()
    blob = b"".join(encode(v0, v1, max_segment_bytes=600))
    for cut in range(0, len(blob), max(1, len(blob) // 150)):
        with pytest.raises(DeltaError):
            decode_delta(blob[:cut], KEY)
    with pytest.raises(TruncatedError):
        decode_delta(blob[:-1], KEY)
    with pytest.raises(TruncatedError):
        sg.parse(blob[:10], KEY)


def test_missing_trailer_missing_segment_and_reordering() -> None:
    v0, v1 = small_pair()
    segs = encode(v0, v1, max_segment_bytes=600)
    assert len(segs) > 4
    with pytest.raises(TruncatedError, match="trailer"):
        decode_delta(segs[:-1], KEY)
    with pytest.raises(SequenceError):
        decode_delta(segs[:2] + segs[3:], KEY)
    with pytest.raises(SequenceError):
        decode_delta([segs[1], segs[0], *segs[2:]], KEY)
    with pytest.raises(FormatError, match="after the trailer"):
        decode_delta(segs + [segs[0]], KEY)


def test_trailer_inconsistencies() -> None:
    v0, v1 = small_pair()
    segs = encode(v0, v1)
    tr = sg.parse(segs[-1], KEY)
    common = dict(
        key=KEY, job=b"job-1", version=1, base_version=0, tensor_count=tr.tensor_count, fmt=3, base_hash=tr.base_hash
    )
    wrong_hash = sg.build_trailer(
        **common, segment_count=tr.segment_count, total_entries=tr.total_entries, digest=b"\0" * 32
    )
    with pytest.raises(TrailerError, match="h\\(v\\)"):
        decode_delta(segs[:-1] + [wrong_hash], KEY)
    wrong_total = sg.build_trailer(
        **common, segment_count=tr.segment_count, total_entries=tr.total_entries + 1, digest=tr.hash
    )
    with pytest.raises(TrailerError, match="entries"):
        decode_delta(segs[:-1] + [wrong_total], KEY)
    fewer = sg.build_trailer(
        **common, segment_count=tr.segment_count - 1, total_entries=tr.total_entries, digest=tr.hash
    )
    with pytest.raises(SequenceError):
        decode_delta(segs[:-1] + [fewer], KEY)


def test_segments_of_another_delta_are_rejected() -> None:
    v0, v1 = small_pair()
    a = encode(v0, v1, version=1)
    b = encode(v0, v1, version=2, base_version=0)
    with pytest.raises(MismatchError):
        decode_delta([a[0], *b[1:]], KEY)
    c = encode(v0, v1, job="job-2")
    with pytest.raises(MismatchError):
        decode_delta([a[0], *c[1:]], KEY)
    with pytest.raises(MismatchError):
        decode_delta(a, KEY, job="job-2")


def test_bad_magic_and_format_version() -> None:
    v0, v1 = small_pair()
    seg = encode(v0, v1)[0]
    with pytest.raises(FormatError, match="magic"):
        sg.parse(b"XXXX" + seg[4:], KEY)
    bumped = bytearray(seg)
    bumped[4:6] = struct.pack("<H", 4)
    with pytest.raises(UnsupportedVersionError):
        sg.parse(bytes(bumped), KEY)


def test_incompatible_target_is_rejected_before_any_write() -> None:
    v0, v1 = small_pair(density=0.3)
    delta = decode_delta(encode(v0, v1), KEY)
    v0.applied_hash = delta.base_hash  # the base's identity is right: only the tensors differ
    names = list(delta.tensors)
    assert len(names) > 3
    # the last tensor of the delta is missing from the target: nothing may have been written before
    target = v0.copy()
    last_hf = ParamMap.from_weights(v0).to_hf(names[-1])[-1]
    del target.arrays[last_hf]
    del target.dtypes[last_hf]
    before = target.copy()
    with pytest.raises(IncompatibleTargetError):
        apply_delta(delta, target)
    assert same_bits(target, before) and target.version == 0
    # read-only arrays (a plain mapped checkpoint) are refused up front
    ro = v0.copy()
    for a in ro.arrays.values():
        a.flags.writeable = False
    with pytest.raises(IncompatibleTargetError, match="writable"):
        apply_delta(delta, ro)
    # a dtype mismatch
    wrong = v0.copy()
    wrong.dtypes = {n: "F16" for n in wrong.dtypes}
    with pytest.raises(IncompatibleTargetError, match="dtype"):
        apply_delta(delta, wrong)


def test_encoder_refuses_mismatched_checkpoints() -> None:
    v0, v1 = small_pair()
    del v1.arrays["model.norm.weight"], v1.dtypes["model.norm.weight"]
    with pytest.raises(IncompatibleTargetError):
        DeltaEncoder(v0, v1, job="j", version=1, key=KEY)


@settings(max_examples=40, deadline=None)
@given(
    st.lists(st.integers(0, 2**40 - 1), min_size=1, max_size=400, unique=True),
    st.sampled_from([256, 300, 1000, 5000]),
)
def test_multibyte_gaps_split_within_bound(positions: list[int], max_bytes: int) -> None:
    idx = np.array(sorted(positions), dtype=np.int64)
    vals = (idx * 7 + 1).astype(np.uint32)
    fmt = 1 + len(positions) % 2
    w = DeltaWriter(
        job="j", version=2, base_version=1, key=KEY, max_segment_bytes=max_bytes, format_version=fmt, base_hash=KEY[:32]
    )
    segs = [*w.add_tensor("sparse", "U32", (2**40,), idx, vals), w.trailer()]
    assert all(len(s) <= max_bytes for s in segs)
    d = decode_delta(segs, KEY)
    assert np.array_equal(d.tensors["sparse"].indices, idx) and np.array_equal(d.tensors["sparse"].values, vals)
    assert d.tensors["sparse"].segments == len(segs) - 1
