"""One way to fail a RollArt call: one coded error type, one mapping to a gRPC status.

Servicers (and the validators and cores below them) *raise*; they never call ``context.abort`` themselves. The
server's handler wrapper (``rollart.runtime.handlers.wrap``) ends the call with :func:`status_of` of what a
handler raised:

* a :class:`ServiceError` -> its code, message and trailing metadata. Fixed-code subclasses
  (:class:`InvalidArgument`, :class:`NotFound`, ...) serve the servicers; :class:`Coded` (a code chosen at run
  time, as a ``grpc.StatusCode`` or its name) is the base of every domain error (the ledger's ``LedgerError``,
  the actor's ``WeightError``, the weights hub's ``HubError``, ...), so no other module maps errors to statuses;
* a known library error: redis ``ConnectionError``/``TimeoutError`` -> UNAVAILABLE, pydantic
  ``ValidationError`` -> INVALID_ARGUMENT (field taken from the first error's location);
* anything else propagates unchanged (grpc reports UNKNOWN and logs it: that is a bug to fix, not a status).

Invariants: details are at most :data:`MAX_DETAILS_BYTES` UTF-8 bytes and every trailing-metadata value at most
:data:`MAX_METADATA_VALUE_BYTES`; a caller's value is echoed through :func:`shorten`. See docs/architecture.md.

Example::

    from rollart.runtime import errors

    if request.max_workers <= 0:
        raise errors.InvalidArgument("max_workers", "must be > 0")  # "max_workers: must be > 0"
    if pool is None:
        raise errors.NotFound(f"no pool named {errors.shorten(request.name)}")
"""

from __future__ import annotations

from collections.abc import Sequence

import grpc
from grpc import aio

#: Upper bound on a status' details (UTF-8 bytes). gRPC sends details as the ``grpc-message`` header.
MAX_DETAILS_BYTES = 1024
#: Upper bound on one trailing-metadata value (UTF-8 bytes).
MAX_METADATA_VALUE_BYTES = 256
#: Characters of a caller's value kept by :func:`shorten`.
ECHO_CHARS = 100
#: Trailing-metadata key naming the offending request field of an INVALID_ARGUMENT status.
MD_FIELD = "rollart-field"

Trailing = Sequence[tuple[str, str]]


def shorten(value: object, limit: int = ECHO_CHARS) -> str:
    """``repr`` of a caller's value, cut to ``limit`` characters plus ``…(N bytes)`` when longer.

    Strings are quoted as ``repr`` quotes them (so ``''`` and control characters stay visible).
    """
    text = repr(value) if isinstance(value, (str, bytes)) else str(value)
    if len(text) <= limit:
        return text
    if isinstance(value, str):
        size = len(value.encode())
    elif isinstance(value, bytes):
        size = len(value)
    else:
        size = len(text.encode())
    return f"{text[:limit]}…({size} bytes)"


def truncate_bytes(text: str, limit: int) -> str:
    """``text`` cut so its UTF-8 encoding is at most ``limit`` bytes (never splits a character)."""
    raw = text.encode()
    if len(raw) <= limit:
        return text
    marker = f"…(+{len(raw)} bytes)".encode()
    cut = raw[: max(0, limit - len(marker))].decode(errors="ignore")
    return cut + marker.decode()


Code = grpc.StatusCode | str


def status_code(code: Code) -> grpc.StatusCode:
    """The ``grpc.StatusCode`` of ``code`` (a ``StatusCode`` or its name); UNKNOWN for an unknown name."""
    if isinstance(code, grpc.StatusCode):
        return code
    return grpc.StatusCode.__members__.get(code, grpc.StatusCode.UNKNOWN)


class ServiceError(Exception):
    """Ends the RPC with :attr:`code` and :attr:`message` (and optional trailing metadata).

    Subclasses fix the code; :class:`Coded` and :func:`error_for` take one chosen at run time. ``code`` is kept
    as given (a ``grpc.StatusCode`` or its name); :attr:`status` is always the ``grpc.StatusCode``.
    """

    code: Code = grpc.StatusCode.UNKNOWN

    def __init__(self, message: str, *, trailing: Trailing = ()) -> None:
        super().__init__(message)
        self.message = message
        self.trailing: list[tuple[str, str]] = list(trailing)

    @property
    def status(self) -> grpc.StatusCode:
        return status_code(self.code)

    @property
    def code_name(self) -> str:
        """The status' name (``"NOT_FOUND"``)."""
        return self.status.name

    def details(self) -> str:
        return self.message


class Coded(ServiceError):
    """A :class:`ServiceError` whose code is chosen where it is raised: the base of every domain error.

    ``code`` is a ``grpc.StatusCode`` or its name (``"FAILED_PRECONDITION"``) and is kept as given, so a domain
    error compares its code the way it always did; the mapper reads :attr:`status`.
    """

    def __init__(self, code: Code, message: str, *, trailing: Trailing = ()) -> None:
        super().__init__(message, trailing=trailing)
        self.code = code


class InvalidArgument(ServiceError):
    """The request is malformed; ``field`` names the offending field (dotted path, ``""`` if none).

    Details read ``"<field>: <message>"`` (``message`` phrased to follow the field name: "must be > 0", "is
    required"); the field also travels as trailing metadata :data:`MD_FIELD`.
    """

    code = grpc.StatusCode.INVALID_ARGUMENT

    def __init__(self, field: str, message: str, *, trailing: Trailing = ()) -> None:
        super().__init__(message, trailing=trailing)
        self.field = field
        if field:
            self.trailing.append((MD_FIELD, field))

    def details(self) -> str:
        # ("max_workers", "must be > 0") -> "max_workers: must be > 0"; a message that already starts with the
        # field is kept as written.
        if not self.field or self.message.startswith(self.field):
            return self.message
        return f"{self.field}: {self.message}"


class NotFound(ServiceError):
    code = grpc.StatusCode.NOT_FOUND


class AlreadyExists(ServiceError):
    code = grpc.StatusCode.ALREADY_EXISTS


class FailedPrecondition(ServiceError):
    code = grpc.StatusCode.FAILED_PRECONDITION


class OutOfRange(ServiceError):
    code = grpc.StatusCode.OUT_OF_RANGE


class Aborted(ServiceError):
    """A concurrency conflict: the caller may retry the whole operation."""

    code = grpc.StatusCode.ABORTED


class Unavailable(ServiceError):
    """A dependency (store, peer) is unreachable or the service is draining: retry later."""

    code = grpc.StatusCode.UNAVAILABLE


class ResourceExhausted(ServiceError):
    code = grpc.StatusCode.RESOURCE_EXHAUSTED


class PermissionDenied(ServiceError):
    code = grpc.StatusCode.PERMISSION_DENIED


class Unauthenticated(ServiceError):
    code = grpc.StatusCode.UNAUTHENTICATED


class DeadlineExceeded(ServiceError):
    code = grpc.StatusCode.DEADLINE_EXCEEDED


class Internal(ServiceError):
    code = grpc.StatusCode.INTERNAL


class Unimplemented(ServiceError):
    code = grpc.StatusCode.UNIMPLEMENTED


_BY_CODE: dict[grpc.StatusCode, type[ServiceError]] = {
    status_code(cls.code): cls
    for cls in (
        NotFound,
        AlreadyExists,
        FailedPrecondition,
        OutOfRange,
        Aborted,
        Unavailable,
        ResourceExhausted,
        PermissionDenied,
        Unauthenticated,
        DeadlineExceeded,
        Internal,
        Unimplemented,
    )
}


def error_for(code: Code, message: str, *, trailing: Trailing = ()) -> ServiceError:
    """The :class:`ServiceError` for ``code`` (a ``grpc.StatusCode`` or its name, e.g. ``"NOT_FOUND"``).

    For codes decided at run time; the fixed-code subclass where there is one (an unknown name gives UNKNOWN).
    """
    code = status_code(code)
    if code == grpc.StatusCode.INVALID_ARGUMENT:
        return InvalidArgument("", message, trailing=trailing)
    cls = _BY_CODE.get(code)
    if cls is not None:
        return cls(message, trailing=trailing)
    return Coded(code, message, trailing=trailing)


def _library_error(exc: BaseException) -> ServiceError | None:
    """Known third-party errors that have an obvious status."""
    try:
        from redis.exceptions import ConnectionError as RedisConnectionError
        from redis.exceptions import TimeoutError as RedisTimeoutError
    except ImportError:  # pragma: no cover - redis is a dependency of rollart
        pass
    else:
        if isinstance(exc, (RedisConnectionError, RedisTimeoutError)):
            return Unavailable(f"store unavailable: {exc}")
    try:
        from pydantic import ValidationError
    except ImportError:  # pragma: no cover - pydantic is a dependency of rollart
        pass
    else:
        if isinstance(exc, ValidationError):
            errs = exc.errors()
            field = ".".join(str(p) for p in errs[0].get("loc", ())) if errs else ""
            parts = [
                f"{'.'.join(str(p) for p in e.get('loc', ())) or '(root)'}: {e.get('msg', '')}" for e in errs[:5]
            ]
            more = f" (+{len(errs) - 5} more)" if len(errs) > 5 else ""
            return InvalidArgument(field, "; ".join(parts) + more if parts else str(exc))
    return None


def status_of(exc: BaseException) -> tuple[grpc.StatusCode, str, tuple[tuple[str, str], ...]] | None:
    """``(code, details, trailing_metadata)`` for ``exc``, bounded in size; ``None`` if it has no mapping.

    The one place an exception becomes a gRPC status.
    """
    err = exc if isinstance(exc, ServiceError) else _library_error(exc)
    if err is None:
        return None
    details = truncate_bytes(err.details(), MAX_DETAILS_BYTES)
    trailing = tuple((k, truncate_bytes(str(v), MAX_METADATA_VALUE_BYTES)) for k, v in err.trailing)
    return err.status, details, trailing


def is_mapped(exc: BaseException) -> bool:
    """Whether :func:`status_of` has a status for ``exc``."""
    return isinstance(exc, ServiceError) or _library_error(exc) is not None


async def abort(context: aio.ServicerContext, exc: BaseException) -> None:
    """End the call with the status of ``exc`` (raises ``aio.AbortError``); re-raises ``exc`` if unmapped.

    Used by the handler wrapper; a servicer just raises.
    """
    status = status_of(exc)
    if status is None:
        raise exc
    code, details, trailing = status
    await context.abort(code, details, trailing_metadata=trailing)


async def _through_unary(request: object, context: aio.ServicerContext, run):
    return await run()


async def _through_stream(request: object, context: aio.ServicerContext, run):
    async for item in run():
        yield item


class StatusInterceptor(aio.ServerInterceptor):
    """Applies this mapping on a gRPC server not built by ``rollart.runtime.server.serve`` (whose telemetry
    interceptor already does), e.g. the publisher's standalone Relay endpoint."""

    async def intercept_service(self, continuation, details: grpc.HandlerCallDetails):
        from .handlers import wrap  # handlers imports this module

        handler = await continuation(details)
        return None if handler is None else wrap(handler, _through_unary, _through_stream)
