"""Engine names for Qwen3/Llama-family checkpoints: fused q/k/v and gate/up tensors.

vLLM holds ``self_attn.q_proj``, ``k_proj`` and ``v_proj`` of a layer as one ``self_attn.qkv_proj``
parameter (rows q, then k, then v) and ``mlp.gate_proj``/``mlp.up_proj`` as ``mlp.gate_up_proj``
(rows gate, then up). Stacking along the first dimension of C-ordered tensors is concatenating their
flattened elements, so a position in the fused tensor is ``block offset + position in the member``
with fixed offsets (q at 0, k at numel(q), v at numel(q)+numel(k); gate at 0, up at numel(gate)).

A delta names fused tensors, so all members of a group are always updated together: vLLM loads a lone
``q_proj`` without error and then computes garbage (docs/platform.md).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

import numpy as np

from .errors import IncompatibleTargetError

# (pattern over HF names, engine suffix, member order). Group 1 is the module prefix, group 2 the member,
# group 3 the parameter kind (weight or bias).
_FUSIONS: tuple[tuple[re.Pattern[str], str, tuple[str, ...]], ...] = (
    (re.compile(r"^(.+\.self_attn)\.(q|k|v)_proj\.(weight|bias)$"), "qkv_proj", ("q", "k", "v")),
    (re.compile(r"^(.+\.mlp)\.(gate|up)_proj\.(weight|bias)$"), "gate_up_proj", ("gate", "up")),
)


@dataclass(frozen=True)
class Part:
    """One Hugging Face tensor inside an engine tensor, at ``offset`` elements of the flattened fused tensor."""

    hf_name: str
    offset: int
    numel: int
    shape: tuple[int, ...]


@dataclass(frozen=True)
class EngineTensor:
    name: str
    dtype: str
    shape: tuple[int, ...]
    parts: tuple[Part, ...]

    @property
    def numel(self) -> int:
        return sum(p.numel for p in self.parts)

    @property
    def fused(self) -> bool:
        return len(self.parts) > 1

    @property
    def hf_names(self) -> tuple[str, ...]:
        return tuple(p.hf_name for p in self.parts)

    @property
    def offsets(self) -> np.ndarray:
        return np.array([p.offset for p in self.parts], dtype=np.int64)


def _numel(shape: tuple[int, ...]) -> int:
    n = 1
    for d in shape:
        n *= d
    return n


class ParamMap:
    """Bidirectional mapping between Hugging Face parameter names and engine names.

    Built from the HF tensors' names, shapes and dtypes. A group is fused only when every member is
    present, all members share the dtype and trailing dimensions; otherwise its tensors keep their names.
    Names that match no fusion pattern (embeddings, norms, q_norm/k_norm, o_proj, down_proj, lm_head,
    names already in engine form) map to themselves.
    """

    def __init__(self, engine: Iterable[EngineTensor]) -> None:
        self._engine: dict[str, EngineTensor] = {}
        self._by_hf: dict[str, tuple[str, Part]] = {}
        for et in engine:
            if et.name in self._engine:
                raise ValueError(f"duplicate engine name {et.name!r}")
            self._engine[et.name] = et
            for p in et.parts:
                if p.hf_name in self._by_hf:
                    raise ValueError(f"HF name {p.hf_name!r} in two engine tensors")
                self._by_hf[p.hf_name] = (et.name, p)

    @classmethod
    def from_specs(cls, specs: Mapping[str, tuple[tuple[int, ...], str]], fuse: bool = True) -> ParamMap:
        """``specs``: HF name -> (shape, safetensors dtype), in checkpoint order."""

        def single(name: str) -> EngineTensor:
            shape, dtype = tuple(specs[name][0]), specs[name][1]
            return EngineTensor(name, dtype, shape, (Part(name, 0, _numel(shape), shape),))

        groups: dict[str, tuple[tuple[str, ...], dict[str, str]]] = {}  # engine name -> (members, found)
        order: list[tuple[bool, str]] = []  # (is group, HF or engine name), in order of first appearance
        for name in specs:
            for pattern, suffix, members in _FUSIONS if fuse else ():
                m = pattern.match(name)
                if m:
                    engine_name = f"{m.group(1)}.{suffix}.{m.group(3)}"
                    if engine_name not in groups:
                        groups[engine_name] = (members, {})
                        order.append((True, engine_name))
                    groups[engine_name][1][m.group(2)] = name
                    break
            else:
                order.append((False, name))
        tensors: list[EngineTensor] = []
        for is_group, name in order:
            if not is_group:
                tensors.append(single(name))
                continue
            members, found = groups[name]
            hf = [found[m] for m in members if m in found]
            complete = (
                len(hf) == len(members)
                and name not in specs
                and len({specs[h][1] for h in hf}) == 1
                and all(len(specs[h][0]) >= 1 for h in hf)
                and len({tuple(specs[h][0][1:]) for h in hf}) == 1
            )
            if not complete:  # keep HF names rather than guess a layout
                tensors.extend(single(h) for h in found.values())
                continue
            parts = []
            off = 0
            for h in hf:
                shape = tuple(specs[h][0])
                parts.append(Part(h, off, _numel(shape), shape))
                off += _numel(shape)
            fused_shape = (sum(p.shape[0] for p in parts), *parts[0].shape[1:])
            tensors.append(EngineTensor(name, specs[hf[0]][1], fused_shape, tuple(parts)))
        return cls(tensors)

    @classmethod
    def from_weights(cls, weights: object, fuse: bool = True) -> ParamMap:
        """From a :class:`~rollart.delta.WeightSet` (or anything with ``arrays`` and ``dtypes``)."""
        arrays = weights.arrays  # type: ignore[attr-defined]
        dtypes = weights.dtypes  # type: ignore[attr-defined]
        return cls.from_specs({n: (tuple(a.shape), dtypes[n]) for n, a in arrays.items()}, fuse=fuse)

    def __iter__(self):  # engine tensors in order
        return iter(self._engine.values())

    def __len__(self) -> int:
        return len(self._engine)

    def __contains__(self, engine_name: object) -> bool:
        return engine_name in self._engine

    def __eq__(self, other: object) -> bool:
        return isinstance(other, ParamMap) and list(self._engine.values()) == list(other._engine.values())

    def engine(self, engine_name: str) -> EngineTensor:
        try:
            return self._engine[engine_name]
        except KeyError:
            raise IncompatibleTargetError(f"target has no tensor {engine_name!r}") from None

    def engine_names(self) -> list[str]:
        return list(self._engine)

    def hf_names(self) -> list[str]:
        return list(self._by_hf)

    def to_engine(self, hf_name: str) -> tuple[str, int]:
        """HF name -> (engine name, block offset of that member in the flattened engine tensor)."""
        engine_name, part = self._by_hf[hf_name]
        return engine_name, part.offset

    def to_hf(self, engine_name: str) -> tuple[str, ...]:
        """Engine name -> every HF name of its group (all members, in block order)."""
        return self.engine(engine_name).hf_names

    def hf_group(self, hf_name: str) -> tuple[str, ...]:
        """All HF names that must be loaded together with ``hf_name``."""
        return self.to_hf(self._by_hf[hf_name][0])

    def split_positions(self, engine_name: str, positions: np.ndarray) -> list[tuple[Part, slice]]:
        """Sorted engine positions -> [(part, slice of ``positions`` that falls in it)], vectorised."""
        et = self.engine(engine_name)
        if not et.fused:
            return [(et.parts[0], slice(0, positions.size))]
        cuts = np.searchsorted(positions, et.offsets[1:], side="left")
        bounds = [0, *(int(c) for c in cuts), positions.size]
        return [(p, slice(bounds[i], bounds[i + 1])) for i, p in enumerate(et.parts) if bounds[i + 1] > bounds[i]]

    def fuse_arrays(self, arrays: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        """HF arrays -> engine arrays (fused tensors are new concatenated arrays, others are the same objects)."""
        out = {}
        for et in self:
            if et.fused:
                out[et.name] = np.concatenate([arrays[h].reshape(-1) for h in et.hf_names]).reshape(et.shape)
            else:
                out[et.name] = arrays[et.parts[0].hf_name]
        return out

    def unfuse_arrays(self, arrays: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        """Engine arrays -> HF arrays (views into the fused arrays)."""
        out = {}
        for et in self:
            flat = arrays[et.name].reshape(-1)
            for p in et.parts:
                out[p.hf_name] = flat[p.offset : p.offset + p.numel].reshape(p.shape)
        return out
