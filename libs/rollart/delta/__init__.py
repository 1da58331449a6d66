"""Sparse delta checkpoints: extraction, segment encoding, verification and exact application.

numpy only (never torch). The byte format is specified in docs/delta-format.md (its place in the system:
docs/architecture.md, "Wire formats"). Typical use:

    base = load_safetensors("v1.safetensors"); target = load_safetensors("v2.safetensors")
    for seg in encode_delta(base, target, job="j", version=2, key=k):   # streaming
        send(seg)
    stager = DeltaStager(k, job="j", version=2, base_version=1)         # receiver, any order
    stager.add(seg) ...; delta = stager.finish()
    apply_delta(delta, weights)                                          # verified, all or nothing

Format version 3 (the default) names the base weights' identity h(v-1) (see ``identity``), codes values as
XOR with the base, codes streams with Zstandard when smaller, stores a tensor densely when that is smaller
and packs small tensors into shared segments; versions 1 and 2 stay readable and writable
(``format_version=1`` or ``2``). Modules: extract, writer, encode, decode, apply (``codec`` re-exports
them).

A relay that forwards without decoding uses ``parse_segment(raw, key)`` (verifies CRC and HMAC, reads
the header) and ``split_segments``/``peek_length`` to frame a byte stream.
"""

from .codec import (
    Delta,
    DeltaEncoder,
    DeltaStager,
    DeltaWriter,
    TensorDelta,
    TensorStats,
    apply_delta,
    apply_entries,
    changed_positions,
    check_base,
    decode_delta,
    encode_delta,
    extract_tensor,
    inspect_delta,
    param_map_for,
)
from .dtypes import ALL_DTYPES, DType
from .errors import (
    AuthError,
    BaseMismatchError,
    ChecksumError,
    DeltaError,
    FormatError,
    IncompatibleTargetError,
    MismatchError,
    SequenceError,
    TrailerError,
    TruncatedError,
    UnsupportedVersionError,
)
from .identity import weights_digest
from .names import EngineTensor, ParamMap, Part
from .safetensors_io import WeightSet, load_safetensors, save_safetensors
from .segment import (
    DEFAULT_MAX_SEGMENT_BYTES,
    FORMAT_V1,
    FORMAT_V2,
    FORMAT_V3,
    FORMAT_VERSION,
    MAGIC,
    Segment,
    peek_length,
)
from .segment import parse as parse_segment
from .segment import split as split_segments

__all__ = [
    "ALL_DTYPES",
    "DEFAULT_MAX_SEGMENT_BYTES",
    "FORMAT_V1",
    "FORMAT_V2",
    "FORMAT_V3",
    "FORMAT_VERSION",
    "MAGIC",
    "AuthError",
    "BaseMismatchError",
    "ChecksumError",
    "DType",
    "Delta",
    "DeltaEncoder",
    "DeltaError",
    "DeltaStager",
    "DeltaWriter",
    "EngineTensor",
    "FormatError",
    "IncompatibleTargetError",
    "MismatchError",
    "ParamMap",
    "Part",
    "Segment",
    "SequenceError",
    "TensorDelta",
    "TensorStats",
    "TrailerError",
    "TruncatedError",
    "UnsupportedVersionError",
    "WeightSet",
    "apply_delta",
    "apply_entries",
    "changed_positions",
    "check_base",
    "decode_delta",
    "encode_delta",
    "extract_tensor",
    "inspect_delta",
    "load_safetensors",
    "param_map_for",
    "parse_segment",
    "peek_length",
    "save_safetensors",
    "split_segments",
    "weights_digest",
]
