"""Streaming encoding of ``D_v`` from two weight sets: :class:`DeltaEncoder` and :func:`encode_delta`.

Invariant: the output decodes to exactly the target's bits at every changed position and names the base's
identity ``h(v-1)``. Format 3 (default) codes values against the base (XOR), packs small tensors' records
into shared segments and writes a tensor densely without finding positions when most of it changed;
formats 1 and 2 stay writable. Byte layout and the encoder's choices: docs/delta-format.md.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping

import numpy as np

from . import dtypes as dt
from . import segment as sg
from .errors import IncompatibleTargetError
from .extract import extract_tensor
from .identity import weights_digest
from .names import EngineTensor, ParamMap
from .safetensors_io import WeightSet
from .scratch import Scratch
from .scratch import acquire as acquire_scratch
from .scratch import release as release_scratch
from .writer import (
    DENSE_DIRECT_FRACTION,
    PROBE_ELEMENTS,
    DeltaWriter,
)


def _flat_target(et: EngineTensor, target: Mapping[str, np.ndarray]) -> Callable[[], np.ndarray]:
    """The engine tensor's new values, flat (members concatenated in block order), built on demand."""

    def build() -> np.ndarray:
        if not et.fused:
            return np.ascontiguousarray(target[et.parts[0].hf_name]).reshape(-1)
        return np.concatenate([np.ascontiguousarray(target[p.hf_name]).reshape(-1) for p in et.parts])

    return build


def _raw_flat(a: np.ndarray, d: dt.DType) -> np.ndarray:
    return np.ascontiguousarray(a).reshape(-1).view(d.raw)


def _base_view(et: EngineTensor, base: Mapping[str, np.ndarray]) -> Callable[[np.ndarray | None], np.ndarray]:
    """The base's bits of an engine tensor at flat positions (ascending; None: all of it, flat)."""
    d = dt.by_name(et.dtype)
    flats = [(_raw_flat(base[p.hf_name], d), p.offset) for p in et.parts]

    def at(idx: np.ndarray | None) -> np.ndarray:
        if idx is None:
            return flats[0][0] if len(flats) == 1 else np.concatenate([f for f, _ in flats])
        if len(flats) == 1:
            return flats[0][0][idx]
        out = np.empty(idx.size, d.raw)
        cuts = np.searchsorted(idx, [off for _, off in flats[1:]])
        lo = 0
        for (f, off), hi in zip(flats, [*cuts.tolist(), idx.size], strict=True):
            out[lo:hi] = f[idx[lo:hi] - off]
            lo = hi
        return out

    return at


def _xor_flat(
    et: EngineTensor, base: WeightSet, target: WeightSet, scratch: Scratch | None
) -> Callable[[], np.ndarray]:
    """target XOR base over the engine tensor, flat (into the scratch's buffer when given)."""
    d = dt.by_name(et.dtype)

    def build() -> np.ndarray:
        out = np.empty(et.numel, d.raw) if scratch is None else scratch.array("xor", et.numel, d.raw)
        for p in et.parts:
            a, b = _raw_flat(base.arrays[p.hf_name], d), _raw_flat(target.arrays[p.hf_name], d)
            np.bitwise_xor(b, a, out=out[p.offset : p.offset + p.numel])
        return out

    return build


def _changed_fraction(et: EngineTensor, base: WeightSet, target: WeightSet) -> float:
    """Changed fraction of an evenly strided sample of the engine tensor (up to PROBE_ELEMENTS elements a member)."""
    d = dt.by_name(et.dtype)
    changed = total = 0
    for p in et.parts:
        a, b = _raw_flat(base.arrays[p.hf_name], d), _raw_flat(target.arrays[p.hf_name], d)
        step = max(1, a.size // PROBE_ELEMENTS)
        sa, sb = a[::step], b[::step]
        changed += int(np.count_nonzero(sa != sb))
        total += sa.size
    return changed / total if total else 0.0


class DeltaEncoder:
    """Extracts and encodes ``D_v`` between two weight sets, streaming.

    ``segments()`` is a generator: each tensor is compared and its segments yielded (v3: as they fill)
    before the next tensor is looked at, so a sender transmits while extraction goes on. Tensors are
    encoded in ascending order of their engine names (every format version). Statistics (``hash``,
    ``segment_count``...) are on ``self.writer`` once the generator is exhausted.

    Versions 2 and 3 (default 3): ``base_hash`` is h(v-1); by default ``base.applied_hash``, and for weights
    that record none, their :func:`~rollart.delta.weights_digest` (the identity of weights no delta produced).
    """

    def __init__(
        self,
        base: WeightSet,
        target: WeightSet,
        *,
        job: str,
        version: int,
        key: bytes,
        base_version: int | None = None,
        max_segment_bytes: int = sg.DEFAULT_MAX_SEGMENT_BYTES,
        param_map: ParamMap | None = None,
        format_version: int = sg.FORMAT_VERSION,
        base_hash: bytes | None = None,
    ) -> None:
        self.param_map = param_map or ParamMap.from_weights(base)
        if ParamMap.from_weights(target) != ParamMap.from_weights(base):
            raise IncompatibleTargetError("base and target differ in tensor names, shapes or dtypes")
        self.base, self.target = base, target
        bv = version - 1 if base_version is None else base_version
        if format_version != sg.FORMAT_V1 and base_hash is None:
            base_hash = base.applied_hash or weights_digest(base.arrays, base.dtypes)
        self.writer = DeltaWriter(
            job=job,
            version=version,
            base_version=bv,
            key=key,
            max_segment_bytes=max_segment_bytes,
            format_version=format_version,
            base_hash=base_hash,
            pack=True,
        )

    def _tensor(self, et: EngineTensor) -> Iterator[bytes]:
        w = self.writer
        if w.format_version != sg.FORMAT_V3:
            idx, vals = extract_tensor(et, self.base.arrays, self.target.arrays, w._scratch)
            dense = _flat_target(et, self.target.arrays)
            yield from w.add_tensor(et.name, et.dtype, et.shape, idx, vals, dense, _extracted=True)
            return
        xor = _xor_flat(et, self.base, self.target, w._scratch)
        if et.numel >= PROBE_ELEMENTS and _changed_fraction(et, self.base, self.target) >= DENSE_DIRECT_FRACTION:
            yield from w.add_dense(et.name, et.dtype, et.shape, xor(), xor=True)
            return
        idx, vals = extract_tensor(et, self.base.arrays, self.target.arrays, w._scratch, xor=True)
        dense = _flat_target(et, self.target.arrays)
        base = _base_view(et, self.base.arrays)
        yield from w.add_tensor(et.name, et.dtype, et.shape, idx, vals, dense, base=base, _extracted=True,
                                _xor_dense=xor, _values_xor=True)  # fmt: skip

    def segments(self) -> Iterator[bytes]:
        w = self.writer
        w._scratch = acquire_scratch()  # one tensor's intermediates at a time: each is coded before the next
        order = sorted(self.param_map, key=lambda t: t.name)  # docs/delta-format.md, structure rule 5
        try:
            for et in order:
                yield from self._tensor(et)
        finally:
            release_scratch(w._scratch)
            w._scratch = None
        if w.format_version != sg.FORMAT_V1 and w.segment_count == 0 and not w._pending:
            et = next((t for t in order if t.numel), None)
            if et is None:
                raise ValueError(f"a version-{w.format_version} delta needs at least one element in the weights")
            first = np.ascontiguousarray(self.target.arrays[et.parts[0].hf_name]).reshape(-1)[:1]
            yield from w.add_anchor(et.name, et.dtype, et.shape, first)
        yield from w.flush()
        yield w.trailer()

    def __iter__(self) -> Iterator[bytes]:
        return self.segments()


def encode_delta(base: WeightSet, target: WeightSet, **kwargs: object) -> Iterator[bytes]:
    """Generator of the segments of ``D_v`` (see :class:`DeltaEncoder` for the arguments)."""
    return DeltaEncoder(base, target, **kwargs).segments()  # type: ignore[arg-type]
