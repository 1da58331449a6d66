from __future__ import annotations

import json
import struct
from pathlib import Path

import numpy as np
import pytest
from delta_testlib import random_raw, same_bits

from rollart.delta import ALL_DTYPES, FormatError, WeightSet, load_safetensors, save_safetensors


def test_round_trip_every_dtype(tmp_path: Path) -> None:
    rng = np.random.default_rng(1)
    shapes = [(3, 5), (7,), (), (2, 0, 3), (1, 1, 9)]
    arrays, dtypes = {}, {}
    for i, dtype in enumerate(ALL_DTYPES):
        name = f"t.{dtype.lower()}"
        arrays[name] = random_raw(rng, dtype, shapes[i % len(shapes)])
        dtypes[name] = dtype
    ws = WeightSet(arrays, dtypes, version=7, metadata={"format": "pt"})
    path = tmp_path / "m.safetensors"
    save_safetensors(path, ws)
    back = load_safetensors(path)
    assert back.version == 7 and back.metadata["format"] == "pt"
    assert back.dtypes == dtypes
    assert same_bits(back, ws)
    header_len = struct.unpack("<Q", path.read_bytes()[:8])[0]
    assert (8 + header_len) % 8 == 0  # data starts aligned
    header = json.loads(path.read_bytes()[8 : 8 + header_len])
    for name, info in header.items():
        if name != "__metadata__":
            width = np.dtype(arrays[name].dtype).itemsize
            assert info["data_offsets"][0] % width == 0  # every tensor aligned to its width


def test_mapped_read_only_and_copy_on_write(tmp_path: Path) -> None:
    path = tmp_path / "m.safetensors"
    save_safetensors(path, {"a": np.arange(10, dtype=np.float32)})
    ro = load_safetensors(path)
    assert not ro.arrays["a"].flags.writeable
    cow = load_safetensors(path, writable=True)
    cow.arrays["a"][:] = -1
    assert np.array_equal(load_safetensors(path).arrays["a"], np.arange(10, dtype=np.float32))


def test_interoperates_with_reference_implementation(tmp_path: Path) -> None:
    st = pytest.importorskip("safetensors.numpy")
    rng = np.random.default_rng(2)
    arrays = {
        "f32": rng.standard_normal((4, 3)).astype(np.float32),
        "f16": rng.standard_normal(5).astype(np.float16),
        "f64": rng.standard_normal(2),
        "i64": rng.integers(-9, 9, 6),
        "i8": rng.integers(-9, 9, 6).astype(np.int8),
        "u8": rng.integers(0, 255, 6).astype(np.uint8),
        "b": rng.integers(0, 2, 4).astype(bool),
    }
    theirs = tmp_path / "theirs.safetensors"
    st.save_file(arrays, str(theirs), metadata={"k": "v"})
    ours = load_safetensors(theirs)
    assert ours.metadata == {"k": "v"}
    for n, a in arrays.items():
        assert np.array_equal(ours.arrays[n], a) and ours.arrays[n].dtype == a.dtype
    mine = tmp_path / "mine.safetensors"
    save_safetensors(mine, arrays)
    back = st.load_file(str(mine))
    for n, a in arrays.items():
        assert np.array_equal(back[n], a)


def test_bf16_is_raw_uint16(tmp_path: Path) -> None:
    bits = np.array([0x3F80, 0xBF80, 0x7FC1, 0x8000], dtype=np.uint16)  # 1.0, -1.0, a NaN, -0.0
    path = tmp_path / "bf16.safetensors"
    save_safetensors(path, {"w": bits}, dtypes={"w": "BF16"})
    header_len = struct.unpack("<Q", path.read_bytes()[:8])[0]
    assert json.loads(path.read_bytes()[8 : 8 + header_len])["w"]["dtype"] == "BF16"
    back = load_safetensors(path)
    assert back.dtypes["w"] == "BF16" and np.array_equal(back.arrays["w"], bits)


def _write_raw(path: Path, header: dict | bytes, data: bytes) -> None:
    raw = header if isinstance(header, bytes) else json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(raw)) + raw + data)


@pytest.mark.parametrize(
    "header,data,why",
    [
        (b"{not json", b"", "not UTF-8 JSON"),
        ({"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 4]}}, b"\0" * 4, "do not match"),
        ({"a": {"dtype": "F32", "shape": [1], "data_offsets": [4, 8]}}, b"\0" * 8, "hole or overlap"),
        ({"a": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]}}, b"\0" * 8, "byte buffer length"),
        ({"a": {"dtype": "C64", "shape": [1], "data_offsets": [0, 8]}}, b"\0" * 8, "unsupported dtype"),
        ({"a": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]}}, b"\0" * 2, "do not match"),
        ({"a": {"dtype": "F32", "shape": [1]}}, b"\0" * 4, "bad header entry"),
    ],
)
def test_rejects_malformed(tmp_path: Path, header: dict | bytes, data: bytes, why: str) -> None:
    path = tmp_path / "bad.safetensors"
    _write_raw(path, header, data)
    with pytest.raises(FormatError, match=why):
        load_safetensors(path)


def test_rejects_huge_header_length(tmp_path: Path) -> None:
    path = tmp_path / "bad.safetensors"
    path.write_bytes(struct.pack("<Q", 2**40) + b"{}")
    with pytest.raises(FormatError, match="exceeds"):
        load_safetensors(path)
    path.write_bytes(b"\x01")
    with pytest.raises(FormatError, match="shorter than 8"):
        load_safetensors(path)
