"""The delta codec's public surface, kept at its old import path: ``rollart.delta.codec``.

The work is split by job: :mod:`.extract` (what changed), :mod:`.writer` and :mod:`.encode` (segments
out), :mod:`.decode` (segments in, verified and assembled) and :mod:`.apply` (checks, then writes;
inspection). Invariant of the whole: ``apply(D_v, v-1) == v`` bit for bit, and a delta failing any check
writes nothing. Byte format: docs/delta-format.md.
"""

from __future__ import annotations

from .apply import (
    DELTA_CHECKS,
    TARGET_CHECKS,
    apply_delta,
    apply_entries,
    check_base,
    inspect_delta,
    param_map_for,
)
from .decode import Delta, DeltaStager, TensorDelta, decode_delta
from .encode import DeltaEncoder, encode_delta
from .errors import DeltaError
from .extract import _gap_stream, changed_positions, extract_tensor
from .writer import DENSE_CANDIDATE_FRACTION, DENSE_CANDIDATE_FRACTION_V3, DeltaWriter, TensorStats

__all__ = [
    "DELTA_CHECKS",
    "DENSE_CANDIDATE_FRACTION",
    "DENSE_CANDIDATE_FRACTION_V3",
    "TARGET_CHECKS",
    "Delta",
    "DeltaEncoder",
    "DeltaError",
    "DeltaStager",
    "DeltaWriter",
    "TensorDelta",
    "TensorStats",
    "_gap_stream",
    "apply_delta",
    "apply_entries",
    "changed_positions",
    "check_base",
    "decode_delta",
    "encode_delta",
    "extract_tensor",
    "inspect_delta",
    "param_map_for",
]
