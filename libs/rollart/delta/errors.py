"""Exception hierarchy of the delta codec.

Every failure the codec can detect raises a subclass of :class:`DeltaError`. Each class names the gRPC
status a service should answer with (``grpc_status``), so callers can map errors without a lookup table.
"""

from __future__ import annotations


class DeltaError(Exception):
    """Base class: the delta (or a segment of it) cannot be accepted."""

    grpc_status = "INVALID_ARGUMENT"


class FormatError(DeltaError):
    """Malformed bytes: bad magic, unknown dtype, inconsistent lengths, invalid LEB128, bad indices."""


class UnsupportedVersionError(FormatError):
    """The segment's format version is not one this decoder understands."""


class TruncatedError(DeltaError):
    """Bytes end early: a cut segment, missing segments, or no trailer."""

    def __init__(self, message: str, missing: list[int] | None = None) -> None:
        super().__init__(message)
        self.missing = list(missing or [])


class ChecksumError(DeltaError):
    """A segment's CRC-32 does not match its bytes (corruption in transit or on disk)."""

    grpc_status = "DATA_LOSS"


class AuthError(DeltaError):
    """A segment's HMAC does not verify under the job key (forged, or signed with another key)."""

    grpc_status = "UNAUTHENTICATED"


class SequenceError(DeltaError):
    """Segments out of order, duplicated with different bytes, or a sequence number out of range."""


class TrailerError(DeltaError):
    """The trailer's segment count, entry count or hash ``h(v)`` disagrees with the segments."""


class MismatchError(DeltaError):
    """A segment belongs to another job or version than the one being assembled."""


class BaseMismatchError(DeltaError):
    """The delta's base version is not the target's current version."""

    grpc_status = "FAILED_PRECONDITION"


class IncompatibleTargetError(DeltaError):
    """The target lacks a tensor of the delta, or its dtype, shape or layout differs."""

    grpc_status = "FAILED_PRECONDITION"
