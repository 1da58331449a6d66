"""Golden bytes: the worked example of docs/delta-format.md, so the format cannot drift silently."""

from __future__ import annotations

import hashlib
import re
from pathlib import Path

import numpy as np

from rollart.delta import DeltaWriter, decode_delta
from rollart.delta import segment as sg

DOC = Path(__file__).resolve().parents[3] / "docs" / "delta-format.md"


def _dumps_in_doc() -> list[bytes]:
    blocks = re.findall(r"```\n(0000:.*?)```", DOC.read_text(), flags=re.S)
    return [bytes.fromhex("".join(line.split(":", 1)[1] for line in b.strip().splitlines())) for b in blocks]


def test_worked_example_matches_the_document() -> None:
    w = DeltaWriter(job="j1", version=2, base_version=1, key=b"secret", format_version=1)
    values = np.array([0x3F80, 0xBF80], dtype=np.uint16)
    segs = [*w.add_tensor("w", "BF16", (300,), np.array([3, 201]), values), w.trailer()]
    assert segs == _dumps_in_doc()[:2]
    assert segs[0][0x59:0x5C] == bytes.fromhex("03c601")  # 3, then 198 -> C6 01
    assert w.hash == hashlib.sha256(segs[0]).digest()
    d = decode_delta(segs, b"secret")
    assert d.tensors["w"].indices.tolist() == [3, 201] and d.tensors["w"].values.tolist() == [0x3F80, 0xBF80]


def test_crc_is_the_common_crc32() -> None:
    import zlib

    assert zlib.crc32(b"123456789") == 0xCBF43926


def test_version_2_worked_example() -> None:
    doc = _dumps_in_doc()[2:5]  # the v3 example follows (test_delta_v3.py)
    assert len(doc) == 3
    base_hash = bytes(range(32))
    # decoding the document's bytes (the Zstandard frame included) gives the example's content
    d = decode_delta(doc, b"secret", job="j1", version=2, base_version=1, base_hash=base_hash)
    assert d.format_version == 2 and d.base_hash == base_hash and d.hash == hashlib.sha256(doc[0] + doc[1]).digest()
    assert d.tensors["w"].indices.tolist() == [3, 201] and d.tensors["w"].values.tolist() == [0x3F80, 0xBF80]
    b = d.tensors["b"]
    assert b.dense_segments == 1 and b.indices.tolist() == list(range(64)) and set(b.values.tolist()) == {0x3F80}
    seg = sg.parse(doc[1], b"secret")
    assert (seg.layout, seg.index_coding, seg.value_coding, seg.value_bytes) == (2, 0, 1, 20)
    # the reference encoder reproduces them (the raw segment always; the frame with this libzstd)
    w = DeltaWriter(job="j1", version=2, base_version=1, key=b"secret", base_hash=base_hash, format_version=2)
    values = np.array([0x3F80, 0xBF80], dtype=np.uint16)
    full = np.full(64, 0x3F80, np.uint16)
    segs = [*w.add_tensor("w", "BF16", (300,), np.array([3, 201]), values)]
    segs += [*w.add_tensor("b", "BF16", (64,), np.arange(64), full, dense=lambda: full), w.trailer()]
    assert segs[0] == doc[0]
    assert segs == doc or sg.parse(segs[1], b"secret").value_coding == 1  # another libzstd may differ
    assert segs[0][0x85:0x88] == bytes.fromhex("03c601")
