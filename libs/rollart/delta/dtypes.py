"""Safetensors dtypes: wire codes, widths and the numpy types used to hold them.

bf16 and the 8-bit float formats have no numpy type; they are held as raw unsigned integers of the same
width (bf16 -> uint16, F8_* -> uint8). The codec never does arithmetic on values: it compares and copies
bit patterns, so raw integer views are exact (NaN payloads and -0.0 included).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .errors import FormatError


@dataclass(frozen=True)
class DType:
    name: str  # safetensors spelling
    code: int  # u8 on the wire (docs/delta-format.md)
    itemsize: int
    numpy: np.dtype  # how arrays of this dtype are held in memory (little-endian)

    @property
    def raw(self) -> np.dtype:
        """Unsigned integer of the same width: the type bit patterns are compared and copied as."""
        return _RAW[self.itemsize]


_RAW: dict[int, np.dtype] = {1: np.dtype("u1"), 2: np.dtype("<u2"), 4: np.dtype("<u4"), 8: np.dtype("<u8")}

_TABLE = [
    DType("BOOL", 1, 1, np.dtype("?")),
    DType("U8", 2, 1, np.dtype("u1")),
    DType("I8", 3, 1, np.dtype("i1")),
    DType("F8_E5M2", 4, 1, np.dtype("u1")),
    DType("F8_E4M3", 5, 1, np.dtype("u1")),
    DType("I16", 6, 2, np.dtype("<i2")),
    DType("U16", 7, 2, np.dtype("<u2")),
    DType("F16", 8, 2, np.dtype("<f2")),
    DType("BF16", 9, 2, np.dtype("<u2")),
    DType("I32", 10, 4, np.dtype("<i4")),
    DType("U32", 11, 4, np.dtype("<u4")),
    DType("F32", 12, 4, np.dtype("<f4")),
    DType("F64", 13, 8, np.dtype("<f8")),
    DType("I64", 14, 8, np.dtype("<i8")),
    DType("U64", 15, 8, np.dtype("<u8")),
    DType("F8_E8M0", 16, 1, np.dtype("u1")),
]

BY_NAME: dict[str, DType] = {d.name: d for d in _TABLE}
BY_CODE: dict[int, DType] = {d.code: d for d in _TABLE}
ALL_DTYPES: tuple[str, ...] = tuple(d.name for d in _TABLE)

# Default safetensors dtype for a numpy array when the caller does not say (uint16 is U16, not BF16).
_FROM_NUMPY = {
    np.dtype("?"): "BOOL",
    np.dtype("u1"): "U8",
    np.dtype("i1"): "I8",
    np.dtype("<i2"): "I16",
    np.dtype("<u2"): "U16",
    np.dtype("<f2"): "F16",
    np.dtype("<i4"): "I32",
    np.dtype("<u4"): "U32",
    np.dtype("<f4"): "F32",
    np.dtype("<f8"): "F64",
    np.dtype("<i8"): "I64",
    np.dtype("<u8"): "U64",
}


def by_name(name: str) -> DType:
    try:
        return BY_NAME[name]
    except KeyError:
        raise FormatError(f"unsupported dtype {name!r}") from None


def by_code(code: int) -> DType:
    try:
        return BY_CODE[code]
    except KeyError:
        raise FormatError(f"unknown dtype code {code}") from None


def infer(array: np.ndarray) -> str:
    """Safetensors dtype name for a numpy array (uint16 maps to U16; pass BF16 explicitly)."""
    dt = array.dtype.newbyteorder("<") if array.dtype.byteorder == ">" else array.dtype
    try:
        return _FROM_NUMPY[np.dtype(dt)]
    except KeyError:
        raise FormatError(f"no safetensors dtype for numpy dtype {array.dtype}") from None


def raw_view(array: np.ndarray, dtype: DType) -> np.ndarray:
    """Flat raw-unsigned view of a C-contiguous array (no copy)."""
    if array.dtype.itemsize != dtype.itemsize:
        raise FormatError(f"array itemsize {array.dtype.itemsize} does not match {dtype.name}")
    return array.reshape(-1).view(dtype.raw)
