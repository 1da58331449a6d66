"""Striped TCP transport of delta segments (docs/weight-plane.md, "Striped transport": wire format, handshake,
resume, early data, tail hedging).

The seam: one *session* carries the segments of one delta ``D_v`` over ``S`` authenticated TCP stripes. Either
side may dial (``open_push``: the dialer sends; ``open_pull``: the dialer receives; ``send_delta`` and
``receive_delta`` wrap them) or listen (``TransportServer``, whose ``admit`` picks the session a stripe joins).
The receiver verifies every segment before its ``SegmentSink`` sees it and keeps ``h(v)`` over them in sequence
order; a lost stripe is re-dialled and resumed, so the sender re-sends exactly what the receiver lacks. Any
failure is a ``TransportError``: the caller falls back to another source.

Modules: ``handshake`` (HELLO .. RESULT), ``framing`` (a stripe's frames), ``tracker`` (which segments are here),
``sessions`` / ``sender`` / ``receiver``, ``server``, ``client``, ``errors``.
"""

from .client import SendStats, new_session_id, open_pull, open_push, receive_delta, send_delta
from .errors import (
    ST_AUTH,
    ST_OK,
    ST_PROTOCOL,
    ST_REFUSED,
    ST_UNKNOWN_JOB,
    AuthenticationError,
    HandshakeError,
    ProtocolError,
    RefusedError,
    SessionError,
    TransportError,
    UnknownJobError,
)
from .framing import (
    _DONE,
    _FRAME,
    _RESUME,
    DEFAULT_MAX_FRAME_BYTES,
    F_DONE,
    F_ERROR,
    F_RESUME,
    F_SEG,
    NOTSENT_LOWAT,
    WRITE_HIGH_WATER,
    Connection,
    dial,
)
from .handshake import (
    _AUTH,
    _CHALLENGE,
    _HELLO,
    _RESULT,
    MAGIC,
    MAX_JOB_BYTES,
    MAX_STREAMS,
    PROTOCOL_VERSION,
    ROLE_NAMES,
    ROLE_PULL,
    ROLE_PUSH,
    Admit,
    Hello,
    client_handshake,
    server_handshake,
    validate_hello,
)
from .receiver import HEDGE_AFTER_S, VERIFY_IN_THREAD_BYTES, ReceiverSession
from .sender import SenderSession
from .server import TransportServer
from .sessions import Redial, _Session
from .tracker import SegmentSink, SegmentTracker, TrackerSink, seq_of

__all__ = [
    # The interface.
    "AuthenticationError",
    "Connection",
    "HandshakeError",
    "Hello",
    "ProtocolError",
    "ReceiverSession",
    "RefusedError",
    "SegmentSink",
    "SegmentTracker",
    "SendStats",
    "SenderSession",
    "SessionError",
    "TrackerSink",
    "TransportError",
    "TransportServer",
    "UnknownJobError",
    "dial",
    "open_pull",
    "open_push",
    "receive_delta",
    "send_delta",
    "seq_of",
    # Protocol constants and parts (relays, tests and benchmarks speak the wire format directly).
    "Admit",
    "DEFAULT_MAX_FRAME_BYTES",
    "F_DONE",
    "F_ERROR",
    "F_RESUME",
    "F_SEG",
    "HEDGE_AFTER_S",
    "MAGIC",
    "MAX_JOB_BYTES",
    "MAX_STREAMS",
    "NOTSENT_LOWAT",
    "PROTOCOL_VERSION",
    "ROLE_NAMES",
    "ROLE_PULL",
    "ROLE_PUSH",
    "ST_AUTH",
    "ST_OK",
    "ST_PROTOCOL",
    "ST_REFUSED",
    "ST_UNKNOWN_JOB",
    "VERIFY_IN_THREAD_BYTES",
    "WRITE_HIGH_WATER",
    "Redial",
    "_AUTH",
    "_CHALLENGE",
    "_DONE",
    "_FRAME",
    "_HELLO",
    "_RESULT",
    "_RESUME",
    "_Session",
    "client_handshake",
    "new_session_id",
    "server_handshake",
    "validate_hello",
]
