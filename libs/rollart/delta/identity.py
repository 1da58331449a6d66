"""Identity of a set of weights: the hash chain ``h(v)`` that version-2 deltas name as their base.

- The first version of a job (weights that no delta produced, usually version 0) is identified by
  :func:`weights_digest`, a SHA-256 over its tensors.
- Every later version ``v`` reached through ``D_v`` is identified by ``h(v)``, the SHA-256 of ``D_v``'s data
  segments; a version-2 ``D_v`` names ``h(v-1)`` in every segment, so ``h(v)`` commits to the whole chain.

A :class:`~rollart.delta.WeightSet` carries its identity in ``applied_hash`` (``rollart.hash`` in a
safetensors file's metadata).
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping

import numpy as np


def weights_digest(arrays: Mapping[str, np.ndarray], dtypes: Mapping[str, str]) -> bytes:
    """h(v) of a full set of weights that no delta produced: SHA-256 of ``rollart-weights/1\\0`` then, for
    every tensor in name order, ``name\\0dtype\\0shape\\0`` (shape as comma-separated decimals) and its raw
    little-endian bytes. Independent of file layout, so a checkpoint file and the trainer's export agree."""
    h = hashlib.sha256(b"rollart-weights/1\0")
    for name in sorted(arrays):
        a = np.ascontiguousarray(arrays[name])
        h.update(f"{name}\0{dtypes[name]}\0{','.join(map(str, a.shape))}\0".encode())
        h.update(a.data.cast("B"))
    return h.digest()
