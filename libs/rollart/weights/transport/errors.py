"""The transport's failures: a handshake rejected (with the status the peer sent), a session that could not
complete. Callers fall back to another source on any of them (docs/weight-plane.md, "Striped transport")."""

from __future__ import annotations

# Handshake status codes (the CHALLENGE and RESULT messages).
ST_OK = 0
ST_PROTOCOL = 1
ST_UNKNOWN_JOB = 2
ST_AUTH = 3
ST_REFUSED = 4


class TransportError(Exception):
    """The weight transport failed."""


class HandshakeError(TransportError):
    """A connection's handshake was rejected; ``status`` is the handshake status code."""

    status = ST_PROTOCOL


class ProtocolError(HandshakeError):
    """The peer does not speak this protocol, or broke it."""


class UnknownJobError(HandshakeError):
    status = ST_UNKNOWN_JOB


class AuthenticationError(HandshakeError):
    """Challenge-response failed: the two sides do not hold the same job key."""

    status = ST_AUTH


class RefusedError(HandshakeError):
    """The peer authenticated us but will not serve this session (e.g. version not available)."""

    status = ST_REFUSED


class SessionError(TransportError):
    """A session could not complete: every stripe lost for too long, too many bad segments, or a fatal error."""


_STATUS_ERRORS: dict[int, type[HandshakeError]] = {
    ST_PROTOCOL: ProtocolError,
    ST_UNKNOWN_JOB: UnknownJobError,
    ST_AUTH: AuthenticationError,
    ST_REFUSED: RefusedError,
}
