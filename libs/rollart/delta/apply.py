"""Applying a verified delta in place, and inspecting one: all checks first, then all writes.

Invariant: ``apply(D_v, weights at v-1) == v`` bit for bit, and a rejected delta (base, target or any
decoding check) leaves the target untouched; weights already at ``v`` with the same ``h(v)`` are left as
they are. XOR-coded values (format 3) are resolved against the target after the base checks proved it is
the base. Spec: docs/delta-format.md ("Applying").
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from . import dtypes as dt
from . import segment as sg
from .decode import Delta, decode_delta
from .errors import BaseMismatchError, IncompatibleTargetError
from .identity import digest_matches, weights_digest
from .names import ParamMap
from .safetensors_io import WeightSet


def param_map_for(delta: Delta, target: WeightSet) -> ParamMap:
    """The naming the delta was encoded in: engine names (fused, the default) or, for a delta encoded with
    ``fuse=False`` (``rollart delta encode --no-fuse``), the plain Hugging Face names."""
    fused = ParamMap.from_weights(target)
    if all(name in fused for name in delta.tensors):
        return fused
    plain = ParamMap.from_weights(target, fuse=False)
    return plain if all(name in plain for name in delta.tensors) else fused


def check_base(delta: Delta, target: WeightSet) -> bool:
    """The base checks ``apply_delta`` runs before anything else; False when the target already holds D_v.

    BaseMismatchError when the target's version is unknown or not the delta's base, or (version 2) when the
    target's identity is not the delta's ``h(v-1)``: ``target.applied_hash`` when recorded, otherwise the
    target's :func:`~rollart.delta.weights_digest` (which only the weights no delta produced can match).
    """
    if target.version == delta.version:
        if target.applied_hash is not None and target.applied_hash != delta.hash:
            raise BaseMismatchError(f"target is at version {delta.version} from a different delta")
        return False  # already applied: set semantics make re-applying a no-op, so skip the work
    if target.version is None:
        raise BaseMismatchError("target version unknown; set WeightSet.version to the delta's base")
    if target.version != delta.base_version:
        raise BaseMismatchError(
            f"delta {delta.version} is based on version {delta.base_version}, target is at {target.version}"
        )
    if delta.base_hash is not None:
        have = target.applied_hash
        if have is None:
            # Weights no delta produced: their digest, or its legacy form for weights holding a 0-d tensor
            # (digests written before the scalar fix; docs/delta-format.md, "Base identity").
            if digest_matches(target.arrays, target.dtypes, delta.base_hash):
                return True
            have = weights_digest(target.arrays, target.dtypes)
        if have != delta.base_hash:
            raise BaseMismatchError(
                f"delta {delta.version} is based on weights {delta.base_hash.hex()[:16]}…, the target's version "
                f"{target.version} is {have.hex()[:16]}… (another job, or other weights)"
            )
    return True


def _plan(delta: Delta, target: WeightSet, pm: ParamMap) -> list[tuple[np.ndarray, np.ndarray | slice, np.ndarray]]:
    """Check the whole delta against the target and list (flat raw target, positions or slice, values) writes."""
    plan: list[tuple[np.ndarray, np.ndarray | slice, np.ndarray]] = []
    for td in delta.tensors.values():
        et = pm.engine(td.name)
        if et.dtype != td.dtype:
            raise IncompatibleTargetError(f"{td.name}: delta dtype {td.dtype}, target {et.dtype}")
        if et.shape != td.shape:
            raise IncompatibleTargetError(f"{td.name}: delta shape {td.shape}, target {et.shape}")
        d = dt.by_name(td.dtype)
        flats = {}
        for part in et.parts:
            arr = target.arrays[part.hf_name]
            if not arr.flags.c_contiguous or not arr.flags.writeable:
                raise IncompatibleTargetError(f"{part.hf_name}: target array is not writable and contiguous")
            flats[part.hf_name] = arr.reshape(-1).view(d.raw)
        for piece in td.pieces:
            vals = piece.values.view(d.raw)
            if piece.indices is None:  # dense: one slice per member block it overlaps
                lo, hi = piece.start, piece.start + vals.size
                for part in et.parts:
                    a, b = max(lo, part.offset), min(hi, part.offset + part.numel)
                    if a < b:
                        sl, v = slice(a - part.offset, b - part.offset), vals[a - lo : b - lo]
                        flat = flats[part.hf_name]
                        plan.append((flat, sl, np.bitwise_xor(flat[sl], v) if piece.xor else v))
                continue
            for part, sl in pm.split_positions(td.name, piece.indices):
                pos = piece.indices[sl]
                pos = pos - part.offset if part.offset else pos
                flat = flats[part.hf_name]
                # XOR values resolve against the target as it is now: every plan is built before any write
                plan.append((flat, pos, np.bitwise_xor(flat[pos], vals[sl]) if piece.xor else vals[sl]))
    return plan


def apply_delta(delta: Delta, target: WeightSet, param_map: ParamMap | None = None) -> bool:
    """Apply a verified delta in place. Returns True if applied, False if the target already holds it.

    Runs :func:`check_base` (version, and for version 2 the base identity h(v-1)), then checks every
    tensor's presence, dtype, shape and writability, all before the first write, so a rejected delta
    leaves the target untouched. Without ``param_map`` the naming comes from :func:`param_map_for`.
    """
    if not check_base(delta, target):
        return False
    pm = param_map or param_map_for(delta, target)
    plan = _plan(delta, target, pm)
    for flat, pos, vals in plan:
        flat[pos] = vals
    target.version = delta.version
    target.applied_hash = delta.hash
    return True


def apply_entries(delta: Delta, arrays: Mapping[str, np.ndarray], param_map: ParamMap | None = None) -> None:
    """Set the delta's entries into ``arrays`` without any version bookkeeping: pure set semantics for new
    bits; XOR-coded entries (v3) are XORed in, which gives ``v`` only when ``arrays`` hold the base."""
    ws = WeightSet(dict(arrays), {n: dt.infer(a) for n, a in arrays.items()})
    if param_map is None:
        param_map = ParamMap.from_specs({n: (tuple(a.shape), _dtype_of(n, a, delta)) for n, a in arrays.items()})
    for flat, pos, vals in _plan(delta, ws, param_map):
        flat[pos] = vals


def _dtype_of(name: str, a: np.ndarray, delta: Delta) -> str:
    td = delta.tensors.get(name)
    return td.dtype if td is not None and dt.by_name(td.dtype).itemsize == a.dtype.itemsize else dt.infer(a)


# ---------------------------------------------------------------------------------------------------------
# inspection

# What decoding checks (docs/delta-format.md, "Decoding and verification"): inspect and apply run the same code.
DELTA_CHECKS = (
    "framing and segment lengths",
    "CRC-32 of every segment",
    "header fields, dtype, shape/numel, part/parts, layout, codings, transform, stream lengths (v3: every record)",
    "one job, version, format version, base version and base hash in every segment",
    "index streams: Zstandard frames (window <= 8 MiB), canonical LEB128, entry count, gaps >= 1, positions < numel",
    "value streams: Zstandard frames (window <= 8 MiB) and sizes, BOOL values 0/1",
    "sequence numbers in order, nothing after the trailer, no segment missing",
    "h(v), total entries and tensor count against the trailer",
    "structure: each tensor's parts complete, in order, not overlapping, in one run",
)
TARGET_CHECKS = (
    "base version and base hash h(v-1) against the target",
    "every tensor present in the target with the same dtype and shape, writable",
)


def inspect_delta(data: bytes | memoryview, key: bytes | None = None, base: WeightSet | None = None) -> dict[str, Any]:
    """Verify a .dseg buffer with every check ``apply`` runs, and summarise it.

    The delta is decoded by the same code as :func:`decode_delta`; HMACs are verified only when ``key`` is
    given (``authenticated``), and the target checks only when ``base`` is given. What was not checked is
    listed under ``not_checked``. Raises a DeltaError subclass on any failure (the same class apply raises).
    """
    delta = decode_delta(data, key)
    not_checked = [] if key is not None else ["HMAC-SHA256 of every segment (no job key)"]
    if base is None:
        not_checked += list(TARGET_CHECKS)
    else:
        if check_base(delta, base):
            _plan(delta, base, param_map_for(delta, base))
    tensors = []
    index_bytes = value_bytes = dense = 0
    segs: dict[str, dict[str, int]] = {}
    for raw in sg.split(data):
        s = sg.parse(raw, None)  # already verified above; read the per-record sizes
        for r in s.tensor_records:
            t = segs.setdefault(r.name, {"index_bytes": 0, "value_bytes": 0, "dense_segments": 0})
            t["index_bytes"] += r.index_bytes
            t["value_bytes"] += r.value_bytes
            t["dense_segments"] += r.is_dense
            index_bytes += r.index_bytes
            value_bytes += r.value_bytes
            dense += r.is_dense
    for name, td in delta.tensors.items():
        tensors.append(
            {
                "name": name,
                "dtype": td.dtype,
                "shape": list(td.shape),
                "entries": td.entries,
                "segments": td.segments,
                **segs[name],
            }
        )
    return {
        "job": delta.job,
        "version": delta.version,
        "base_version": delta.base_version,
        "format_version": delta.format_version,
        "base_hash": delta.base_hash.hex() if delta.base_hash is not None else None,
        "segments": delta.segment_count + 1,
        "data_segments": delta.segment_count,
        "dense_segments": dense,
        "entries": delta.total_entries,
        "index_bytes": index_bytes,
        "value_bytes": value_bytes,
        "total_bytes": delta.total_bytes,
        "hash": delta.hash.hex(),
        "authenticated": key is not None,
        "checked": list(DELTA_CHECKS)
        + (["HMAC-SHA256 of every segment"] if key is not None else [])
        + (list(TARGET_CHECKS) if base is not None else []),
        "not_checked": not_checked,
        "tensors": tensors,
    }
