"""Safetensors files without torch: memory-mapped reading, atomic writing.

Layout (https://github.com/huggingface/safetensors): u64 little-endian header length N, N bytes of UTF-8
JSON (``{name: {"dtype", "shape", "data_offsets": [begin, end]}, "__metadata__": {str: str}}``), then the
byte buffer; offsets are relative to the buffer start and must tile it without holes or overlap.
"""

from __future__ import annotations

import json
import mmap
import os
import struct
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from . import dtypes as dt
from .errors import FormatError

MAX_HEADER_BYTES = 100 * 1024 * 1024  # the reference implementation's limit
VERSION_KEY = "rollart.version"  # metadata keys this package writes
JOB_KEY = "rollart.job"
HASH_KEY = "rollart.hash"  # identity h(v) of the weights (rollart.delta.identity), hex
DELTA_HASH_KEY = "rollart.delta_hash"  # what older files call it; read, no longer written


@dataclass
class WeightSet:
    """Named tensors with their safetensors dtypes and, when known, the policy version they hold.

    Arrays are C-contiguous numpy arrays (bf16 as uint16 bit patterns). ``version`` and
    ``applied_hash`` (the identity h(v) of these weights: h(v) of the delta that produced them, or the
    weights digest of a first version) are what :func:`rollart.delta.apply_delta` checks. In a file they
    are the metadata ``rollart.version`` and ``rollart.hash`` (with ``rollart.job``: RollArt metadata).
    """

    arrays: dict[str, np.ndarray]
    dtypes: dict[str, str]
    version: int | None = None
    applied_hash: bytes | None = None
    metadata: dict[str, str] = field(default_factory=dict)

    @classmethod
    def from_arrays(
        cls,
        arrays: Mapping[str, np.ndarray],
        dtypes: Mapping[str, str] | None = None,
        version: int | None = None,
    ) -> WeightSet:
        dts = {name: (dtypes or {}).get(name) or dt.infer(a) for name, a in arrays.items()}
        for name, a in arrays.items():
            if a.dtype.itemsize != dt.by_name(dts[name]).itemsize:
                raise FormatError(f"{name}: {a.dtype} cannot hold {dts[name]}")
        return cls(dict(arrays), dts, version)

    def copy(self) -> WeightSet:
        return WeightSet(
            {k: np.array(v, copy=True, order="C") for k, v in self.arrays.items()},
            dict(self.dtypes),
            self.version,
            self.applied_hash,
            dict(self.metadata),
        )

    def __len__(self) -> int:
        return len(self.arrays)

    @property
    def nbytes(self) -> int:
        return sum(a.nbytes for a in self.arrays.values())


def read_header(path: str | os.PathLike[str]) -> tuple[dict, int]:
    """Parsed JSON header and the absolute offset of the byte buffer."""
    with open(path, "rb") as f:
        head = f.read(8)
        if len(head) < 8:
            raise FormatError(f"{path}: not a safetensors file (shorter than 8 bytes)")
        (n,) = struct.unpack("<Q", head)
        if n > MAX_HEADER_BYTES:
            raise FormatError(f"{path}: header length {n} exceeds {MAX_HEADER_BYTES}")
        raw = f.read(n)
    if len(raw) != n:
        raise FormatError(f"{path}: header cut short")
    try:
        header = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise FormatError(f"{path}: header is not UTF-8 JSON: {e}") from None
    if not isinstance(header, dict):
        raise FormatError(f"{path}: header is not a JSON object")
    return header, 8 + n


def load_safetensors(path: str | os.PathLike[str], writable: bool = False) -> WeightSet:
    """Memory-map a safetensors file.

    ``writable=False`` gives read-only views of the file; ``writable=True`` a private copy-on-write
    mapping (writes never reach the file, and only touched pages use memory).
    The version recorded in the metadata (``rollart.version``) becomes ``WeightSet.version``.
    """
    header, start = read_header(path)
    size = os.path.getsize(path)
    meta = header.pop("__metadata__", None) or {}
    if not isinstance(meta, dict) or not all(isinstance(v, str) for v in meta.values()):
        raise FormatError(f"{path}: __metadata__ must map strings to strings")
    buf_len = size - start
    spans = []
    for name, info in header.items():
        try:
            dtype = dt.by_name(info["dtype"])
            shape = tuple(int(x) for x in info["shape"])
            begin, end = (int(x) for x in info["data_offsets"])
        except (KeyError, TypeError, ValueError) as e:
            raise FormatError(f"{path}: bad header entry for {name!r}: {e}") from None
        if any(d < 0 for d in shape):
            raise FormatError(f"{path}: negative dimension in {name!r}")
        numel = int(np.prod(shape, dtype=object)) if shape else 1
        if not 0 <= begin <= end <= buf_len or end - begin != numel * dtype.itemsize:
            raise FormatError(f"{path}: data_offsets of {name!r} do not match its shape and dtype")
        spans.append((begin, end, name, dtype, shape))
    spans.sort(key=lambda s: (s[0], s[1]))
    pos = 0
    for begin, end, name, _, _ in spans:
        if begin != pos:
            raise FormatError(f"{path}: byte buffer has a hole or overlap at {name!r}")
        pos = end
    if pos != buf_len:
        raise FormatError(f"{path}: byte buffer length {buf_len} != sum of tensors {pos}")

    arrays: dict[str, np.ndarray] = {}
    dtypes: dict[str, str] = {}
    mm: mmap.mmap | None = None
    if size > start:
        with open(path, "rb") as f:
            mm = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_COPY if writable else mmap.ACCESS_READ)
    for begin, end, name, dtype, shape in sorted(spans, key=lambda s: s[2]):
        numel = (end - begin) // dtype.itemsize
        if numel == 0 or mm is None:
            a = np.zeros(shape, dtype=dtype.numpy)
        else:
            a = np.frombuffer(mm, dtype=dtype.numpy, count=numel, offset=start + begin).reshape(shape)
        arrays[name] = a
        dtypes[name] = dtype.name
    version = None
    if VERSION_KEY in meta:
        try:
            version = int(meta[VERSION_KEY])
        except ValueError:
            raise FormatError(f"{path}: metadata {VERSION_KEY}={meta[VERSION_KEY]!r} is not an integer") from None
    hash_hex = meta.get(HASH_KEY, meta.get(DELTA_HASH_KEY))
    try:
        applied = bytes.fromhex(hash_hex) if hash_hex is not None else None
    except ValueError:
        applied = None
    if applied is not None and len(applied) != 32:
        applied = None
    if hash_hex is not None and applied is None:
        raise FormatError(f"{path}: metadata {HASH_KEY}={hash_hex!r} is not a 64-digit hex hash")
    return WeightSet(arrays, dtypes, version, applied, dict(meta))


def save_safetensors(
    path: str | os.PathLike[str],
    weights: WeightSet | Mapping[str, np.ndarray],
    dtypes: Mapping[str, str] | None = None,
    metadata: Mapping[str, str] | None = None,
) -> None:
    """Write a safetensors file atomically (temporary file, fsync, rename).

    Tensors are laid out by decreasing item size so every tensor is aligned to its width; the header
    is padded with spaces to a multiple of 8 bytes. For a WeightSet, its version and applied hash are
    recorded in the metadata (``rollart.version``, ``rollart.hash``).
    """
    if isinstance(weights, WeightSet):
        ws = weights
    else:
        ws = WeightSet.from_arrays(weights, dtypes)
    meta = dict(ws.metadata)
    if ws.version is not None:
        meta[VERSION_KEY] = str(ws.version)
    meta.pop(DELTA_HASH_KEY, None)
    if ws.applied_hash is not None:
        meta[HASH_KEY] = ws.applied_hash.hex()
    meta.update(metadata or {})
    order = sorted(ws.arrays, key=lambda n: (-dt.by_name(ws.dtypes[n]).itemsize, n))
    header: dict[str, object] = {}
    if meta:
        header["__metadata__"] = {str(k): str(v) for k, v in meta.items()}
    offset = 0
    for name in order:
        a = ws.arrays[name]
        dtype = dt.by_name(ws.dtypes[name])
        if a.dtype.itemsize != dtype.itemsize:
            raise FormatError(f"{name}: {a.dtype} cannot hold {dtype.name}")
        header[name] = {
            "dtype": dtype.name,
            "shape": list(a.shape),
            "data_offsets": [offset, offset + a.nbytes],
        }
        offset += a.nbytes
    raw = json.dumps(header, separators=(",", ":")).encode("utf-8")
    raw += b" " * (-(8 + len(raw)) % 8)
    path = Path(path)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    try:
        with open(tmp, "wb") as f:
            f.write(struct.pack("<Q", len(raw)))
            f.write(raw)
            for name in order:
                a = np.ascontiguousarray(ws.arrays[name])
                if a.dtype.byteorder == ">":
                    a = a.astype(a.dtype.newbyteorder("<"))
                if a.size:
                    f.write(a.reshape(-1).view(np.uint8).data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    finally:
        if tmp.exists():
            tmp.unlink()
