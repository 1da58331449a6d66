"""Golden bytes: the worked example of docs/delta-format.md, so the format cannot drift silently."""

from __future__ import annotations

import hashlib
import re
from pathlib import Path

import numpy as np

from rollart.delta import DeltaWriter, decode_delta

DOC = Path(__file__).resolve().parents[3] / "docs" / "delta-format.md"


def _dumps_in_doc() -> list[bytes]:
    blocks = re.findall(r"```\n(0000:.*?)```", DOC.read_text(), flags=re.S)
    return [bytes.fromhex("".join(line.split(":", 1)[1] for line in b.strip().splitlines())) for b in blocks]


def test_worked_example_matches_the_document() -> None:
    w = DeltaWriter(job="j1", version=2, base_version=1, key=b"secret", format_version=1)
    values = np.array([0x3F80, 0xBF80], dtype=np.uint16)
    segs = [*w.add_tensor("w", "BF16", (300,), np.array([3, 201]), values), w.trailer()]
    assert segs == _dumps_in_doc()
    assert segs[0][0x59:0x5C] == bytes.fromhex("03c601")  # 3, then 198 -> C6 01
    assert w.hash == hashlib.sha256(segs[0]).digest()
    d = decode_delta(segs, b"secret")
    assert d.tensors["w"].indices.tolist() == [3, 201] and d.tensors["w"].values.tolist() == [0x3F80, 0xBF80]


def test_crc_is_the_common_crc32() -> None:
    import zlib

    assert zlib.crc32(b"123456789") == 0xCBF43926
