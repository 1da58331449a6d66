"""Client channels: job token, TLS, default deadlines, trace propagation and retry with backoff.

Retries use gRPC's own retry policy (exponential backoff with jitter) and apply only to the methods a caller
names as idempotent, on UNAVAILABLE (and RESOURCE_EXHAUSTED where asked): a non-idempotent call is never
repeated behind the caller's back. Idempotent calls also wait for a server that is not up yet (wait_for_ready),
bounded by their deadline, so a restarting service costs its callers latency, not errors.
"""

from __future__ import annotations

import asyncio
import json
import os
from collections.abc import Iterable
from typing import Any

import grpc
from grpc import aio
from opentelemetry import trace
from opentelemetry.trace import SpanKind, Status, StatusCode

from . import telemetry
from .auth import bearer, channel_credentials
from .config import TLSConfig

DEFAULT_TIMEOUT_S = 30.0
CHANNEL_OPTIONS = [
    ("grpc.max_receive_message_length", 64 * 1024 * 1024),
    ("grpc.max_send_message_length", 64 * 1024 * 1024),
    ("grpc.keepalive_time_ms", 30_000),
    ("grpc.enable_retries", 1),
]


COMPRESSION_ENV = "ROLLART_GRPC_COMPRESSION"
COMPRESSIONS = {"gzip": grpc.Compression.Gzip, "deflate": grpc.Compression.Deflate, "none": None, "": None}


def channel_compression() -> grpc.Compression | None:
    """How this process's channels compress their requests (``ROLLART_GRPC_COMPRESSION``: gzip, deflate, none).

    Worth it where calls cross a slow link: a trajectory's token ids and per-token versions compress several-fold
    (the launcher turns gzip on for every instance of a job with regions). Servers accept it without a setting."""
    raw = os.environ.get(COMPRESSION_ENV, "").strip().lower()
    if raw not in COMPRESSIONS:
        raise ValueError(f"{COMPRESSION_ENV}={raw!r}: expected gzip, deflate or none")
    return COMPRESSIONS[raw]


def retry_service_config(
    idempotent: Iterable[str],
    *,
    max_attempts: int = 5,
    initial_backoff_s: float = 0.1,
    max_backoff_s: float = 2.0,
    codes: Iterable[str] = ("UNAVAILABLE",),
) -> str:
    """A gRPC service config retrying the given methods ("pkg.Service/Method" or "pkg.Service" for all)."""
    names = []
    for item in idempotent:
        service, _, method = item.partition("/")
        names.append({"service": service, "method": method} if method else {"service": service})
    if not names:
        return json.dumps({})
    return json.dumps(
        {
            "methodConfig": [
                {
                    "name": names,
                    "retryPolicy": {
                        "maxAttempts": max_attempts,
                        "initialBackoff": f"{initial_backoff_s}s",
                        "maxBackoff": f"{max_backoff_s}s",
                        "backoffMultiplier": 2,
                        "retryableStatusCodes": list(codes),
                    },
                }
            ]
        }
    )


def _details(
    details: aio.ClientCallDetails, token: str | None, timeout: float | None, span, idempotent: tuple[str, ...] = ()
) -> aio.ClientCallDetails:
    metadata = list(details.metadata or ())
    if token is not None and not any(k == "authorization" for k, _ in metadata):
        metadata.append(bearer(token))
    if span is not None:
        with trace.use_span(span, end_on_exit=False):
            telemetry.inject_metadata(metadata)
    else:
        telemetry.inject_metadata(metadata)
    method = details.method.decode() if isinstance(details.method, bytes) else details.method
    wait = details.wait_for_ready
    if wait is None and idempotent and method.lstrip("/").startswith(idempotent):
        # A call that is safe to repeat also waits for a server that is (re)starting, bounded by its deadline.
        wait = True
    return aio.ClientCallDetails(
        method=details.method,
        timeout=details.timeout if details.timeout is not None else timeout,
        metadata=aio.Metadata(*metadata),
        credentials=details.credentials,
        wait_for_ready=wait,
    )


class _Base:
    def __init__(
        self,
        token: str | None,
        default_timeout: float | None,
        stream_timeout: float | None,
        idempotent: tuple[str, ...] = (),
    ) -> None:
        self.token = token
        self.idempotent = idempotent
        self.default_timeout = default_timeout
        self.stream_timeout = stream_timeout
        self.tracer = telemetry.tracer("rollart.client")

    def _span(self, details: aio.ClientCallDetails):
        """The call's client span, or None without a tracer provider (no exporter): nothing is built then, and
        the current context (the caller's trace context and baggage) is what the call carries."""
        if not telemetry.tracing_enabled():
            return None
        method = details.method.decode() if isinstance(details.method, bytes) else details.method
        span = self.tracer.start_span(method, kind=SpanKind.CLIENT)
        span.set_attribute("rpc.system", "grpc")
        tid = telemetry.current_trajectory_id()
        if tid:
            span.set_attribute("rollart.trajectory_id", tid)
        return span

    @staticmethod
    def _finish(span, call) -> None:
        if span is None:
            return

        async def record() -> None:
            try:
                code = await call.code()
            except Exception:  # noqa: BLE001 - cancelled before a status arrived
                code = grpc.StatusCode.CANCELLED
            span.set_attribute("rpc.grpc.status_code", code.name)
            if code != grpc.StatusCode.OK:
                span.set_status(Status(StatusCode.ERROR, code.name))
            span.end()

        # aio calls report their status through a coroutine: read it once the call is done.
        call.add_done_callback(lambda _c: asyncio.ensure_future(record()))


class _UnaryUnary(_Base, aio.UnaryUnaryClientInterceptor):
    async def intercept_unary_unary(self, continuation, details, request):
        span = self._span(details)
        call = await continuation(_details(details, self.token, self.default_timeout, span, self.idempotent), request)
        self._finish(span, call)
        return call


class _UnaryStream(_Base, aio.UnaryStreamClientInterceptor):
    async def intercept_unary_stream(self, continuation, details, request):
        span = self._span(details)
        call = await continuation(_details(details, self.token, self.stream_timeout, span, self.idempotent), request)
        self._finish(span, call)
        return call


class _StreamUnary(_Base, aio.StreamUnaryClientInterceptor):
    async def intercept_stream_unary(self, continuation, details, request_iterator):
        span = self._span(details)
        call = await continuation(
            _details(details, self.token, self.default_timeout, span, self.idempotent), request_iterator
        )
        self._finish(span, call)
        return call


class _StreamStream(_Base, aio.StreamStreamClientInterceptor):
    async def intercept_stream_stream(self, continuation, details, request_iterator):
        span = self._span(details)
        call = await continuation(
            _details(details, self.token, self.stream_timeout, span, self.idempotent), request_iterator
        )
        self._finish(span, call)
        return call


def channel(
    address: str,
    *,
    token: str | None,
    tls: TLSConfig | None = None,
    idempotent: Iterable[str] = (),
    default_timeout: float | None = DEFAULT_TIMEOUT_S,
    stream_timeout: float | None = None,
    options: Iterable[tuple[str, Any]] = (),
) -> aio.Channel:
    """An aio channel to ``address`` that authenticates, traces, bounds unary calls and retries idempotent ones.

    ``stream_timeout`` bounds response streams (watches run until cancelled when it is None: they are bounded
    by keepalive and by the caller cancelling them).
    """
    idem = tuple(idempotent)
    interceptors = [
        cls(token, default_timeout, stream_timeout, idem)
        for cls in (_UnaryUnary, _UnaryStream, _StreamUnary, _StreamStream)
    ]
    opts = list(CHANNEL_OPTIONS) + list(options)
    opts.append(("grpc.service_config", retry_service_config(idem)))
    compression = channel_compression()
    creds = channel_credentials(tls)
    if creds is not None:
        if tls is not None and tls.server_name:
            opts.append(("grpc.ssl_target_name_override", tls.server_name))
        return aio.secure_channel(address, creds, options=opts, compression=compression, interceptors=interceptors)
    return aio.insecure_channel(address, options=opts, compression=compression, interceptors=interceptors)


def bare_channel(address: str, tls: TLSConfig | None = None) -> aio.Channel:
    """A channel without client interceptors and without gRPC's retry filter, for hot streaming calls that are
    never retried by gRPC (the caller routes a failed call again itself), where the retry filter and the
    interceptors cost CPU on every call. Callers add the token, trace context and baggage to each call's metadata
    themselves."""
    opts: list[tuple[str, Any]] = [*(o for o in CHANNEL_OPTIONS if o[0] != "grpc.enable_retries")]
    opts.append(("grpc.enable_retries", 0))
    creds = channel_credentials(tls)
    if creds is None:
        return aio.insecure_channel(address, options=opts)
    if tls is not None and tls.server_name:
        opts.append(("grpc.ssl_target_name_override", tls.server_name))
    return aio.secure_channel(address, creds, options=opts)


def sync_channel(address: str, *, token: str | None, tls: TLSConfig | None = None) -> tuple[grpc.Channel, list]:
    """A blocking channel plus the metadata to pass on each call (CLI tools and tests)."""
    creds = channel_credentials(tls)
    if creds is None:
        ch = grpc.insecure_channel(address)
    else:
        opts = [("grpc.ssl_target_name_override", tls.server_name)] if tls is not None and tls.server_name else []
        ch = grpc.secure_channel(address, creds, options=opts)
    return ch, ([bearer(token)] if token else [])
