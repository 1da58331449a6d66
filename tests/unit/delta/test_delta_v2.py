"""Format version 2: sizes, base identity, determinism, and a fuzz of the decoder over every field."""

from __future__ import annotations

import hashlib
import struct
import zlib

import numpy as np
import pytest
from delta_testlib import KEY, OTHER_KEY, qwen3_like, same_bits, train_step

from rollart.delta import (
    AuthError,
    BaseMismatchError,
    ChecksumError,
    DeltaEncoder,
    DeltaError,
    DeltaStager,
    FormatError,
    MismatchError,
    SequenceError,
    TrailerError,
    TruncatedError,
    UnsupportedVersionError,
    WeightSet,
    apply_delta,
    decode_delta,
    encode_delta,
    weights_digest,
)
from rollart.delta import segment as sg


def bf16_model(rng: np.random.Generator, hidden: int = 256, layers: int = 2) -> WeightSet:
    """Real-shaped bf16 weights (N(0, 0.02) rounded to bf16), HF names, version 0."""
    shapes = {"model.embed_tokens.weight": (512, hidden), "model.norm.weight": (hidden,)}
    for i in range(layers):
        p = f"model.layers.{i}."
        shapes |= {
            p + "self_attn.q_proj.weight": (hidden, hidden),
            p + "self_attn.k_proj.weight": (hidden // 2, hidden),
            p + "self_attn.v_proj.weight": (hidden // 2, hidden),
            p + "self_attn.o_proj.weight": (hidden, hidden),
            p + "mlp.gate_proj.weight": (3 * hidden, hidden),
            p + "mlp.up_proj.weight": (3 * hidden, hidden),
            p + "mlp.down_proj.weight": (hidden, 3 * hidden),
        }
    arrays = {}
    for n, s in shapes.items():
        f = rng.standard_normal(s, dtype=np.float32) * np.float32(0.02)
        arrays[n] = (f.view(np.uint32) >> 16).astype(np.uint16)
    return WeightSet(arrays, {n: "BF16" for n in arrays}, version=0)


def optimizer_step(rng: np.random.Generator, ws: WeightSet, density: float) -> WeightSet:
    """About ``density`` of the entries move by 1-3 ulps (small optimizer steps), version + 1."""
    out = ws.copy()
    out.applied_hash = None
    for a in out.arrays.values():
        flat = a.reshape(-1)
        pos = np.flatnonzero(rng.random(flat.size) < density)
        flat[pos] = flat[pos] + rng.integers(1, 4, pos.size).astype(np.uint16)
    out.version = (ws.version or 0) + 1
    return out


# ------------------------------------------------------------------------------------------------- sizes


@pytest.mark.parametrize("density", [0.001, 0.01, 0.03, 0.1, 0.3, 0.6, 0.9, 1.0])
def test_never_larger_than_the_dense_tensor(density: float) -> None:
    rng = np.random.default_rng(int(density * 1000))
    v0 = bf16_model(rng)
    v1 = optimizer_step(rng, v0, density)
    enc = DeltaEncoder(v0, v1, job="j", version=1, key=KEY, format_version=2)
    segs = list(enc.segments())
    total = sum(map(len, segs))
    assert total <= 1.02 * v0.nbytes
    v1_ = DeltaEncoder(v0, v1, job="j", version=1, key=KEY, format_version=1)
    v1_size = sum(map(len, v1_.segments()))
    # never worse than version 1 but for the 44 bytes v2 adds to a segment (base hash, start, layout, codings)
    assert total <= v1_size + 44 * len(segs)
    overhead = sg.data_overhead(b"j", b"x" * 64, 2, sg.FORMAT_V2)
    for st in enc.writer.tensors.values():  # every tensor of at least 64 KiB, segment headers included
        if st.numel * 2 >= 64 << 10 and st.entries:
            assert st.index_bytes + st.value_bytes + overhead * st.segments <= 1.02 * st.numel * 2, st
    out = v0.copy()
    apply_delta(decode_delta(segs, KEY), out)
    assert same_bits(out, v1)
    if density >= 0.9:
        assert any(st.dense_segments for st in enc.writer.tensors.values())


def test_incompressible_values_stay_raw_and_dense_bounds_the_size() -> None:
    rng = np.random.default_rng(2)
    a = rng.integers(0, 2**16, 200_000, dtype=np.uint16)
    b = rng.integers(0, 2**16, 200_000, dtype=np.uint16)  # every entry changes to random bits
    v0 = WeightSet({"w": a}, {"w": "BF16"}, version=0)
    v1 = WeightSet({"w": b}, {"w": "BF16"}, version=1)
    segs = list(encode_delta(v0, v1, job="j", version=1, key=KEY, format_version=2))
    data = [sg.parse(s, KEY) for s in segs[:-1]]
    assert all(p.is_dense and p.value_coding == sg.CODING_RAW for p in data)
    assert sum(map(len, segs)) <= 1.02 * a.nbytes


def test_encoding_is_deterministic() -> None:
    rng = np.random.default_rng(3)
    v0 = bf16_model(rng, hidden=128)
    v1 = optimizer_step(rng, v0, 0.05)
    a = list(encode_delta(v0, v1, job="j", version=1, key=KEY, format_version=2, max_segment_bytes=20_000))
    b = list(
        encode_delta(v0.copy(), v1.copy(), job="j", version=1, key=KEY, format_version=2, max_segment_bytes=20_000)
    )
    assert a == b
    kinds = {(p.index_coding, p.value_coding) for p in (sg.parse(s, KEY) for s in a[:-1])}
    assert (sg.CODING_ZSTD, sg.CODING_ZSTD) in kinds


# ------------------------------------------------------------------------------------------ base identity


def test_base_hash_chain_and_mismatch_before_anything_is_staged() -> None:
    rng = np.random.default_rng(4)
    v0 = qwen3_like(rng)
    v1 = train_step(rng, v0, 0.05)
    h0 = weights_digest(v0.arrays, v0.dtypes)
    segs = list(encode_delta(v0, v1, job="j", version=1, key=KEY, format_version=2))
    d1 = decode_delta(segs, KEY)
    assert d1.format_version == 2 and d1.base_hash == h0
    assert all(sg.parse(s, KEY).base_hash == h0 for s in segs)
    # a stager expecting other base weights refuses the very first segment and stages nothing
    stager = DeltaStager(KEY, job="j", version=1, base_version=0, base_hash=b"\x07" * 32)
    with pytest.raises(BaseMismatchError):
        stager.add(segs[0])
    assert stager.received == [] and stager.base_hash == b"\x07" * 32
    with pytest.raises(BaseMismatchError):
        decode_delta(segs, KEY, base_hash=b"\x07" * 32)
    # another job's weights at the same version, same shapes: refused before any write
    other = train_step(np.random.default_rng(5), v0, 0.5)
    other.version = 0
    before = other.copy()
    with pytest.raises(BaseMismatchError, match="based on weights"):
        apply_delta(d1, other)  # no recorded hash: identified by content, which is not v0's
    other.applied_hash = hashlib.sha256(b"other job v0").digest()
    with pytest.raises(BaseMismatchError):
        apply_delta(d1, other)
    assert same_bits(other, before) and other.version == 0
    # the chain: D_2 names h(1) = h(D_1)
    t = v0.copy()
    apply_delta(d1, t)
    assert t.applied_hash == d1.hash
    v2 = train_step(rng, v1, 0.05)
    v1.applied_hash = d1.hash
    d2 = decode_delta(list(encode_delta(v1, v2, job="j", version=2, key=KEY, format_version=2)), KEY)
    assert d2.base_hash == d1.hash
    apply_delta(d2, t)
    assert same_bits(t, v2) and t.applied_hash == d2.hash
    # D_2 on weights at v1 reached another way (same version, other hash) is refused
    stale = v1.copy()
    stale.applied_hash = h0
    with pytest.raises(BaseMismatchError):
        apply_delta(d2, stale)


def test_unchanged_version_keeps_the_chain() -> None:
    rng = np.random.default_rng(6)
    v0 = qwen3_like(rng)
    v1 = v0.copy()
    v1.version = 1
    a = list(encode_delta(v0, v1, job="j", version=1, key=KEY, format_version=2, base_hash=b"\x01" * 32))
    b = list(encode_delta(v0, v1, job="j", version=1, key=KEY, format_version=2, base_hash=b"\x02" * 32))
    da, db = decode_delta(a, KEY), decode_delta(b, KEY)
    assert da.total_entries == 1 and len(a) == 2  # one no-op anchor entry
    assert da.hash != db.hash  # h(v) still depends on h(v-1)
    t = v0.copy()
    t.applied_hash = b"\x01" * 32
    assert apply_delta(da, t) and same_bits(t, v0) and t.applied_hash == da.hash


def test_version_one_is_still_read_and_written() -> None:
    rng = np.random.default_rng(7)
    v0 = qwen3_like(rng)
    v1 = train_step(rng, v0, 0.1)
    segs = list(encode_delta(v0, v1, job="j", version=1, key=KEY, format_version=1))
    assert {sg.parse(s, KEY).format_version for s in segs} == {1}
    d = decode_delta(segs, KEY)
    assert d.format_version == 1 and d.base_hash is None
    t = v0.copy()
    t.applied_hash = b"\x09" * 32  # version 1 names no base hash: only the version is checked
    apply_delta(d, t)
    assert same_bits(t, v1)
    with pytest.raises(MismatchError):  # one format per delta
        v2segs = list(encode_delta(v0, v1, job="j", version=1, key=KEY, format_version=2))
        decode_delta([v2segs[0], *segs[1:]], KEY)


# ---------------------------------------------------------------------------------------------------- fuzz


def field_map(raw: bytes) -> list[tuple[str, int, int]]:
    """(field, start, end) of every field of a version-2 segment, from its parse."""
    s = sg.parse(raw, KEY)
    jl = len(s.job.encode())
    f = [("magic", 0, 4), ("format_version", 4, 6), ("kind", 6, 7), ("flags", 7, 8), ("length", 8, 12)]
    f += [("seq", 12, 16), ("version", 16, 24), ("base_version", 24, 32), ("job_len", 32, 34)]
    f += [("job", 34, 34 + jl), ("base_hash", 34 + jl, 66 + jl)]
    p = 66 + jl
    if s.is_trailer:
        f += [("segment_count", p, p + 4), ("tensor_count", p + 4, p + 8), ("total_entries", p + 8, p + 16)]
        f += [("hash", p + 16, p + 48)]
    else:
        nl = len(s.name.encode())
        f += [("name_len", p, p + 2), ("name", p + 2, p + 2 + nl)]
        q = p + 2 + nl
        f += [("dtype", q, q + 1), ("ndim", q + 1, q + 2)]
        r = q + 2 + 8 * len(s.shape)
        if s.shape:
            f += [("shape", q + 2, r)]
        f += [("numel", r, r + 8), ("part", r + 8, r + 12), ("parts", r + 12, r + 16), ("layout", r + 16, r + 17)]
        f += [("index_coding", r + 17, r + 18), ("value_coding", r + 18, r + 19), ("reserved", r + 19, r + 20)]
        f += [("entries", r + 20, r + 28), ("start", r + 28, r + 36), ("index_bytes", r + 36, r + 44)]
        f += [("value_bytes", r + 44, r + 52)]
        if s.index_bytes:
            f += [("index_stream", r + 52, r + 52 + s.index_bytes)]
        v = r + 52 + s.index_bytes
        f += [("value_stream", v, v + s.value_bytes)]
    n = len(raw)
    f += [("crc", n - 36, n - 32), ("hmac", n - 32, n)]
    assert f[-1][2] == n and all(a[2] == b[1] for a, b in zip(f, f[1:], strict=False))
    return f


def reseal(raw: bytearray, key: bytes = KEY) -> bytes:
    """Recompute CRC and HMAC: the bytes then pass the integrity checks and reach the field checks."""
    body = bytes(raw[:-36])
    crc = struct.pack("<I", zlib.crc32(body))
    return body + crc + sg.mac(key, body + crc)


# Expected classes for a one-bit change of a field whose segment is then re-sealed (as by a buggy encoder
# holding the key). Content that still parses is caught by h(v) (TrailerError) at the latest.
RESEALED = {
    "magic": {FormatError},
    # 2 -> 3 is a version this decoder reads: a v2 body read as v3, or a v3 trailer among v2 segments
    "format_version": {UnsupportedVersionError, FormatError, MismatchError},
    "kind": {FormatError},
    "flags": {FormatError},
    "length": {TruncatedError, FormatError, ChecksumError},  # reframed: the CRC is read elsewhere
    "seq": {SequenceError, FormatError},  # the trailer: its seq must equal its segment count
    "version": {MismatchError, FormatError},
    "base_version": {BaseMismatchError, FormatError},
    "job_len": {FormatError},
    "job": {MismatchError, FormatError},
    "base_hash": {BaseMismatchError},
    "segment_count": {FormatError},
    "tensor_count": {TrailerError},
    "total_entries": {TrailerError},
    "hash": {TrailerError},
    "name_len": {FormatError},
    "name": {FormatError, TrailerError},
    "dtype": {FormatError, TrailerError},  # BF16 -> F16 keeps the width: only h(v) tells
    "ndim": {FormatError},
    "shape": {FormatError},
    "numel": {FormatError},
    "part": {FormatError, TrailerError},  # still parses: the structure rule or h(v) (checked first) tells
    "parts": {FormatError, TrailerError},
    "layout": {FormatError},
    "index_coding": {FormatError},
    "value_coding": {FormatError},
    "reserved": {FormatError},
    "entries": {FormatError},
    "start": {FormatError, TrailerError},
    "index_bytes": {FormatError},
    "value_bytes": {FormatError},
    "index_stream": {FormatError, TrailerError},
    "value_stream": {FormatError, TrailerError},
}


@pytest.fixture(scope="module")
def fuzz_case() -> tuple[WeightSet, list[bytes]]:
    rng = np.random.default_rng(8)
    v0 = bf16_model(rng, hidden=64, layers=1)
    v1 = optimizer_step(rng, v0, 0.05)
    v1.arrays["model.layers.0.self_attn.o_proj.weight"][:] += 1  # a fully changed tensor: dense segments
    segs = list(encode_delta(v0, v1, job="j", version=1, key=KEY, format_version=2, max_segment_bytes=3000))
    layouts = {(p.layout, p.index_coding, p.value_coding) for p in (sg.parse(s, KEY) for s in segs[:-1])}
    assert (sg.LAYOUT_DENSE, sg.CODING_RAW, sg.CODING_ZSTD) in layouts
    assert (sg.LAYOUT_SPARSE, sg.CODING_ZSTD, sg.CODING_ZSTD) in layouts
    return v0, segs


def attempt(v0: WeightSet, blob: bytes) -> type[DeltaError] | None:
    """Decode and apply ``blob`` to a copy of v0; on rejection check nothing was written."""
    target = v0.copy()
    try:
        apply_delta(decode_delta(blob, KEY, job="j", version=1, base_version=0), target)
    except DeltaError as exc:
        assert same_bits(target, v0) and target.version == 0 and target.applied_hash is None
        return type(exc)
    return None


def picks(start: int, end: int, rng: np.random.Generator, most: int = 12) -> list[int]:
    """Bit positions to flip in [start, end): all of them for small fields, a sample of big ones."""
    bits = range(8 * start, 8 * end)
    return list(bits) if len(bits) <= most * 2 else sorted(rng.choice(bits, most, replace=False).tolist())


def test_fuzz_bit_flips_in_every_field(fuzz_case: tuple[WeightSet, list[bytes]]) -> None:
    v0, segs = fuzz_case
    rng = np.random.default_rng(9)
    dense = next(i for i, s in enumerate(segs[:-1]) if sg.parse(s, KEY).is_dense)
    which = sorted({0, dense, len(segs) - 2, len(segs) - 1})  # first, a dense one, last data, trailer
    seen: dict[str, set[str]] = {}
    for k in which:
        for name, a, b in field_map(segs[k]):
            for bit in picks(a, b, rng):
                flipped = bytearray(segs[k])
                flipped[bit // 8] ^= 1 << (bit % 8)
                cases = {"raw": bytes(flipped)}
                if name not in ("crc", "hmac"):
                    cases["resealed"] = reseal(flipped)
                    body = bytes(flipped[:-36])
                    cases["crc only"] = body + struct.pack("<I", zlib.crc32(body)) + bytes(flipped[-32:])
                for how, seg in cases.items():
                    got = attempt(v0, b"".join([*segs[:k], seg, *segs[k + 1 :]]))
                    assert got is not None, (k, name, bit, how)
                    seen.setdefault(name, set()).add(got.__name__)
                    if how == "resealed":
                        assert got in RESEALED[name], (k, name, bit, got)
                    elif name in ("magic",):
                        assert issubclass(got, FormatError)
                    elif name == "format_version":  # 2 -> 3 is a version this decoder reads: then the CRC fails
                        v = struct.unpack_from("<H", flipped, 4)[0]
                        later = AuthError if how == "crc only" else ChecksumError
                        assert got is (later if v in sg.SUPPORTED_VERSIONS else UnsupportedVersionError)
                    elif name == "length":  # reframes the stream: cut short, misaligned, or a CRC over other bytes
                        assert got in (TruncatedError, FormatError, ChecksumError)
                    elif how == "crc only":
                        assert got is AuthError, (k, name, bit, got)
                    elif name == "hmac":
                        assert got is AuthError
                    else:
                        assert got is ChecksumError, (k, name, bit, got)
    assert set(seen) == set(RESEALED) | {"crc", "hmac"}  # every field of data segments and trailer


def test_fuzz_truncation_at_every_field_boundary_and_random_points(fuzz_case: tuple[WeightSet, list[bytes]]) -> None:
    v0, segs = fuzz_case
    blob = b"".join(segs)
    offsets = np.cumsum([0, *map(len, segs)])
    cuts = set()
    for k, seg in enumerate(segs):
        for _, a, b in field_map(seg):
            cuts |= {int(offsets[k]) + a, int(offsets[k]) + b}
    cuts |= set(np.random.default_rng(10).integers(1, len(blob), 200).tolist())
    cuts.discard(len(blob))
    for cut in sorted(cuts):
        assert attempt(v0, blob[:cut]) is TruncatedError, cut
    # a cut segment handed over on its own (a stream receiver) is truncated too
    for cut in (0, 11, 33, 60, len(segs[0]) - 1):
        with pytest.raises(TruncatedError):
            DeltaStager(KEY).add(segs[0][:cut])


def test_fuzz_random_garbage_and_foreign_keys(fuzz_case: tuple[WeightSet, list[bytes]]) -> None:
    v0, segs = fuzz_case
    rng = np.random.default_rng(11)
    for _ in range(200):
        k = int(rng.integers(0, len(segs)))
        seg = bytearray(segs[k])
        for pos in rng.integers(0, len(seg), int(rng.integers(1, 6))).tolist():
            seg[pos] = int(rng.integers(0, 256))
        bad = reseal(seg) if rng.random() < 0.5 else bytes(seg)
        if bad == segs[k]:  # only the CRC/HMAC was hit, and resealing restored them
            continue
        assert attempt(v0, b"".join([*segs[:k], bad, *segs[k + 1 :]]))
    assert attempt(v0, b"".join(reseal(bytearray(s), OTHER_KEY) for s in segs)) is AuthError
