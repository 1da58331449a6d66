"""Identity of a set of weights: the hash chain ``h(v)`` that deltas of format 2 and 3 name as their base.

- The first version of a job (weights that no delta produced, usually version 0) is identified by
  :func:`weights_digest`, a SHA-256 over its tensors (docs/delta-format.md, "Base identity").
- Every later version ``v`` reached through ``D_v`` is identified by ``h(v)``, the SHA-256 of ``D_v``'s data
  segments; ``D_v`` names ``h(v-1)`` in every segment, so ``h(v)`` commits to the whole chain.

A :class:`~rollart.delta.WeightSet` carries its identity in ``applied_hash`` (``rollart.hash`` in a
safetensors file's metadata).
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping

import numpy as np


def weights_digest(arrays: Mapping[str, np.ndarray], dtypes: Mapping[str, str], *, legacy: bool = False) -> bytes:
    """h(v) of a full set of weights that no delta produced: SHA-256 of ``rollart-weights/1\\0`` then, for
    every tensor in name order, ``name\\0dtype\\0shape\\0`` (shape as comma-separated decimals, empty for a
    0-d tensor) and its raw little-endian bytes. Independent of file layout.

    ``legacy=True``: the digest as written before the fix of the scalar case, which hashed a 0-d tensor's
    shape as ``1``; it differs from the current one only for weights holding a 0-d tensor."""
    h = hashlib.sha256(b"rollart-weights/1\0")
    for name in sorted(arrays):
        a = arrays[name]
        shape = (1,) if legacy and a.ndim == 0 else a.shape  # the shape of the tensor, not of a 1-d view of it
        h.update(f"{name}\0{dtypes[name]}\0{','.join(map(str, shape))}\0".encode())
        h.update(np.ascontiguousarray(a).reshape(-1).data.cast("B"))
    return h.digest()


def has_scalar(arrays: Mapping[str, np.ndarray]) -> bool:
    return any(a.ndim == 0 for a in arrays.values())


def digest_matches(arrays: Mapping[str, np.ndarray], dtypes: Mapping[str, str], expected: bytes) -> bool:
    """Whether ``expected`` identifies these weights by their digest: the current one, or (weights holding a
    0-d tensor only) the legacy one, so that deltas and records written before the scalar fix still apply."""
    if weights_digest(arrays, dtypes) == expected:
        return True
    return has_scalar(arrays) and weights_digest(arrays, dtypes, legacy=True) == expected
