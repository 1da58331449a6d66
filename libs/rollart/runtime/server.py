"""gRPC server bootstrap every RollArt service uses.

``run_service(service, cfg)`` starts a ``grpc.aio`` server on uvloop with: the job-token interceptor, telemetry
(per-RPC metrics, server spans with the caller's trace context and trajectory baggage), the standard health and
reflection services, a Prometheus /metrics endpoint, and graceful shutdown on SIGTERM/SIGINT (health flips to
NOT_SERVING, in-flight calls drain for ``grace_seconds``, then the service's own ``stop`` runs).
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import signal
import socket
from collections.abc import AsyncIterator, Sequence
from pathlib import Path
from typing import Any, Protocol

import grpc
from grpc import aio
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection
from opentelemetry import context, trace
from opentelemetry.trace import SpanKind, Status, StatusCode

from . import telemetry, validation
from .auth import UNAUTHENTICATED_PREFIXES, TokenAuthInterceptor, server_credentials
from .config import ServiceConfig
from .handlers import wrap

log = logging.getLogger(__name__)

#: Listen hosts that bind every interface: nobody can dial them, so they are never advertised as they are.
UNSPECIFIED_HOSTS = ("0.0.0.0", "::", "[::]", "")


class StartupError(Exception):
    """Raised by a service's ``start()`` when something it needs cannot work (e.g. its Redis does not answer).

    The message names the setting to fix; ``serve`` logs it as one ``startup failed`` line and exits with
    status 1 (no traceback, so a restarting container repeats one clear line, not a stack)."""


def advertised_address(listen_host: str, port: int, advertise: str | None) -> str:
    """The address peers dial to reach this server (what ``on_serving`` registers).

    ``advertise`` wins (HOST keeps the bound ``port``); otherwise the listen host, where an unspecified one
    (0.0.0.0, ::) becomes this machine's address: the hostname's, which is the pod IP in Kubernetes and the
    container's IP on a compose network (the hostname itself if it does not resolve)."""
    if advertise:
        host, sep, p = advertise.rpartition(":")
        if sep and p.isdigit() and not host.endswith(":"):
            return advertise
        return f"{advertise}:{port}"
    if listen_host not in UNSPECIFIED_HOSTS:
        return f"{listen_host}:{port}"
    name = socket.gethostname()
    try:
        host = socket.gethostbyname(name)
    except OSError:
        host = name
    return f"{host}:{port}"


class _PeerGoneFilter(logging.Filter):
    """grpc logs ``ExecuteBatchError`` with a traceback at ERROR when a stream's client cancels (or its deadline
    passes) while the server is sending: that is the client leaving, not a server fault. Demoted to one INFO
    line without the traceback."""

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno >= logging.ERROR and str(record.msg).startswith("ExecuteBatchError raised in core"):
            record.levelno, record.levelname = logging.INFO, "INFO"
            record.msg, record.args, record.exc_info, record.exc_text = (
                "stream ended by its client while a response was being sent",
                (),
                None,
                None,
            )
        return True


logging.getLogger("grpc._cython.cygrpc").addFilter(_PeerGoneFilter())

MAX_MESSAGE_BYTES = 64 * 1024 * 1024
#: Receive limit of a service that declares none (gRPC's own default). A request over its service's limit is
#: refused with RESOURCE_EXHAUSTED before it is read; the limit bounds what any caller, authenticated or not,
#: can make a service hold for one request.
DEFAULT_MAX_RECEIVE_BYTES = 4 * 1024 * 1024
SERVER_OPTIONS = [
    ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
    ("grpc.keepalive_time_ms", 30_000),
    ("grpc.http2.min_ping_interval_without_data_ms", 10_000),
    ("grpc.keepalive_permit_without_calls", 1),
]


def receive_limit(service: Any, cfg: ServiceConfig) -> int:
    """The service's maximum request size in bytes: ``max_receive_message_bytes`` from the configuration, else
    the service's own ``max_receive_message_bytes`` (sized to its largest legitimate request), else 4 MiB."""
    configured: int | None = getattr(cfg, "max_receive_message_bytes", None)
    if configured:
        return int(configured)
    return int(getattr(service, "max_receive_message_bytes", DEFAULT_MAX_RECEIVE_BYTES))


class Service(Protocol):
    """What a service hands to the bootstrap."""

    #: Short name, e.g. "resource-manager" (logs, metrics, traces).
    name: str
    #: Fully-qualified gRPC service names it serves, e.g. ["rollart.v1.ResourceManager"] (read-only here, so a
    #: plain list attribute satisfies it).
    @property
    def service_names(self) -> Sequence[str]: ...

    def add_to_server(self, server: aio.Server) -> None: ...

    async def start(self) -> None: ...

    async def stop(self) -> None: ...

    # Optional: ``async def on_serving(self, address: str) -> None`` runs once the server accepts calls (e.g. to
    # register with the resource manager under the bound address).
    # Optional: ``max_receive_message_bytes: int``, the largest request the service accepts (default 4 MiB);
    # the ``max_receive_message_bytes`` configuration key overrides it.
    # Optional: ``request_limits: rollart.runtime.validation.Limits``, the string/list/map bounds every request
    # is held to before a handler runs (default ``validation.DEFAULT_LIMITS``).


def _code_of(exc: BaseException | None, context_: aio.ServicerContext) -> str:
    if exc is None:
        code = context_.code()
        return code.name if isinstance(code, grpc.StatusCode) else "OK"
    if isinstance(exc, aio.AbortError):
        code = context_.code()
        return code.name if isinstance(code, grpc.StatusCode) else "UNKNOWN"
    if isinstance(exc, (asyncio.CancelledError, GeneratorExit)):  # GeneratorExit: a stream closed unfinished
        return "CANCELLED"
    return "UNKNOWN"


class TelemetryInterceptor(aio.ServerInterceptor):
    """Per-RPC metrics and a server span that continues the caller's trace (and its trajectory baggage).

    Without a tracer provider (no exporter: ``telemetry.setup_tracing``) no span is built: the handler runs in
    the caller's extracted context as it is, so its own calls carry the caller's traceparent and baggage on."""

    def __init__(self, service: str) -> None:
        self.service = service
        self.tracer = telemetry.tracer("rollart.server")
        # Metric children by label values (``labels()`` hashes and checks its arguments on every call); bounded by
        # the served methods (an unknown method has no handler and never gets here) times the status codes.
        self._in_flight = telemetry.RPC_IN_FLIGHT.labels(service)
        self._seconds: dict[str, Any] = {}
        self._totals: dict[tuple[str, str], Any] = {}

    def _total(self, method: str, code: str) -> Any:
        child = self._totals.get((method, code))
        if child is None:
            child = self._totals[(method, code)] = telemetry.RPC_TOTAL.labels(self.service, method, code)
        return child

    async def intercept_service(self, continuation, details: grpc.HandlerCallDetails):
        handler = await continuation(details)
        if handler is None or details.method.startswith("/grpc.health.v1.Health/"):
            return handler
        method = details.method
        parent = telemetry.extract_context(details.invocation_metadata)
        seconds = self._seconds.get(method)
        if seconds is None:
            seconds = self._seconds[method] = telemetry.RPC_SECONDS.labels(self.service, method)
        traced = telemetry.tracing_enabled()

        def begin() -> tuple[Any, context.Context, telemetry.Stopwatch]:
            span = None
            span_ctx = parent
            if traced:
                span = self.tracer.start_span(method, context=parent, kind=SpanKind.SERVER)
                span.set_attribute("rpc.system", "grpc")
                span.set_attribute("rpc.method", method)
                tid = telemetry.current_trajectory_id(parent)
                if tid:
                    span.set_attribute("rollart.trajectory_id", tid)
                span_ctx = trace.set_span_in_context(span, parent)
            self._in_flight.inc()
            return span, span_ctx, telemetry.Stopwatch()

        def end(span: Any, watch: telemetry.Stopwatch, exc: BaseException | None, ctx: aio.ServicerContext) -> None:
            code = _code_of(exc, ctx)
            self._in_flight.dec()
            self._total(method, code).inc()
            seconds.observe(watch.elapsed())
            if span is None:
                return
            span.set_attribute("rpc.grpc.status_code", code)
            if code != "OK":
                span.set_status(Status(StatusCode.ERROR, code))
            span.end()

        async def unary(request: Any, ctx: aio.ServicerContext, run):
            span, span_ctx, watch = begin()
            exc: BaseException | None = None
            token = context.attach(span_ctx)  # detached below, in this same task and step
            try:
                return await run()
            except BaseException as e:  # noqa: BLE001 - recorded, then re-raised
                exc = e
                raise
            finally:
                context.detach(token)
                end(span, watch, exc, ctx)

        async def stream(request: Any, ctx: aio.ServicerContext, run) -> AsyncIterator[Any]:
            # The span's context is attached around each step of the service's generator, never across a
            # ``yield``: a cancelled stream's generator is closed later by the event loop's finaliser in another
            # task (another contextvars Context), where detaching a token attached here would fail ("Failed to
            # detach context", logged as an ERROR with a traceback). An empty context (no span, nothing from the
            # caller) is not attached at all: nothing would change.
            span, span_ctx, watch = begin()
            exc: BaseException | None = None
            items = run()
            try:
                if not span_ctx:
                    async for item in items:
                        yield item
                else:
                    while True:
                        token = context.attach(span_ctx)
                        try:
                            item = await items.__anext__()
                        except StopAsyncIteration:
                            break
                        finally:
                            context.detach(token)
                        yield item
            except BaseException as e:  # noqa: BLE001
                exc = e
                raise
            finally:
                token = context.attach(span_ctx)
                try:
                    await items.aclose()
                finally:
                    context.detach(token)
                    end(span, watch, exc, ctx)

        return wrap(handler, unary, stream)


class RequestLimitsInterceptor(aio.ServerInterceptor):
    """Holds every request message of the service's RPCs to ``limits`` (string lengths, repeated fields, maps;
    ``validation.check_limits``) before the handler runs: INVALID_ARGUMENT naming the field otherwise."""

    def __init__(self, limits: validation.Limits) -> None:
        self.limits = limits

    async def intercept_service(self, continuation, details: grpc.HandlerCallDetails):
        handler = await continuation(details)
        if handler is None or details.method.startswith(UNAUTHENTICATED_PREFIXES):
            return handler
        limits = self.limits

        async def unary(request: Any, ctx: aio.ServicerContext, run):
            return await run()

        async def stream(request: Any, ctx: aio.ServicerContext, run) -> AsyncIterator[Any]:
            async for item in run():
                yield item

        return wrap(handler, unary, stream, check=lambda message: validation.check_limits(message, limits))


async def serve(service: Service, cfg: ServiceConfig, stop_event: asyncio.Event | None = None) -> None:
    """Run ``service`` until SIGTERM/SIGINT (or ``stop_event``), then drain and stop."""
    name = cfg.instance_name or service.name
    telemetry.setup_tracing(service.name, cfg.tracing)
    metrics_port = None
    if cfg.metrics_listen:
        _, metrics_port = telemetry.start_metrics_server(cfg.metrics_listen)

    interceptors: list[aio.ServerInterceptor] = [TelemetryInterceptor(service.name)]
    token = cfg.token()
    if token is not None and not cfg.insecure_disable_auth:
        interceptors.append(TokenAuthInterceptor(token))
    elif cfg.insecure_disable_auth:
        log.warning("authentication disabled (insecure_disable_auth): every caller is trusted")
    # After authentication: a refused caller's request is not even parsed, let alone walked.
    interceptors.append(RequestLimitsInterceptor(getattr(service, "request_limits", validation.DEFAULT_LIMITS)))

    options = [*SERVER_OPTIONS, ("grpc.max_receive_message_length", receive_limit(service, cfg))]
    server = aio.server(interceptors=interceptors, options=options)
    service.add_to_server(server)
    health_servicer = health.aio.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
    names = list(service.service_names)
    reflection.enable_server_reflection(
        names + [health_pb2.DESCRIPTOR.services_by_name["Health"].full_name, reflection.SERVICE_NAME], server
    )
    creds = server_credentials(cfg.tls)
    port = server.add_secure_port(cfg.listen, creds) if creds else server.add_insecure_port(cfg.listen)
    if port == 0:
        raise RuntimeError(f"could not listen on {cfg.listen}")
    host = cfg.listen.rpartition(":")[0]
    address = f"{host}:{port}"
    advertised = advertised_address(host, port, cfg.advertise)

    try:
        await service.start()
    except StartupError as exc:
        log.error("startup failed: %s", exc)
        await server.stop(0)
        raise SystemExit(1) from None
    await server.start()
    for svc in ["", *names]:
        await health_servicer.set(svc, health_pb2.HealthCheckResponse.SERVING)
    on_serving = getattr(service, "on_serving", None)
    if on_serving is not None:
        try:
            await on_serving(advertised)
        except Exception as exc:
            # E.g. the resource manager refused the registration: say why, release the port, exit non-zero.
            details = exc.details() if hasattr(exc, "details") else str(exc)
            code = exc.code() if hasattr(exc, "code") else None
            if cfg.resource_manager and code in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED):
                # Registering is the call a service makes on start: name the settings that decide whether it works
                # (a certificate from the wrong CA only shows as a handshake that never completes).
                details = (
                    f"{details}: no answer from the resource manager at {cfg.resource_manager} "
                    "(resource_manager / ROLLART_RESOURCE_MANAGER)"
                )
                if cfg.tls is not None:
                    details += (
                        "; with TLS: tls.ca_file (ROLLART_TLS__CA_FILE) must have signed its certificate, and under "
                        "mTLS its client CA our tls.client_cert_file (ROLLART_TLS__CLIENT_CERT_FILE)"
                    )
            log.error("startup failed: %s", details)
            await server.stop(0)
            await service.stop()
            raise SystemExit(1) from None
    log.info(
        "serving",
        extra=telemetry.log_fields(address=address, advertised=advertised, metrics_port=metrics_port, service=name),
    )
    if cfg.ready_file is not None:
        ready_info = getattr(service, "ready_info", None)  # optional extra fields, e.g. a data endpoint
        _write_ready(cfg.ready_file, service.name, address, metrics_port, ready_info() if ready_info else None)

    stop_event = stop_event or asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop_event.set)
    await stop_event.wait()

    log.info("draining", extra=telemetry.log_fields(grace_seconds=cfg.grace_seconds))
    await health_servicer.enter_graceful_shutdown()
    on_draining = getattr(service, "on_draining", None)  # optional: end endless streams (watches) promptly
    if on_draining is not None:
        await on_draining()
    await server.stop(cfg.grace_seconds)
    await service.stop()
    telemetry.shutdown_tracing()
    log.info("stopped")


def _write_ready(
    path: Path, service: str, address: str, metrics_port: int | None, extra: dict[str, Any] | None = None
) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(path.suffix + ".tmp")
    info = {"service": service, "address": address, "metrics_port": metrics_port, "pid": os.getpid()}
    info.update(extra or {})
    tmp.write_text(json.dumps(info))
    tmp.replace(path)  # atomic: a reader never sees half a file


def run_service(service: Service, cfg: ServiceConfig) -> None:
    """Blocking entry point for a service's console script."""
    import uvloop

    telemetry.setup_logging(cfg.instance_name or service.name, cfg.log_level, cfg.log_format)
    uvloop.run(serve(service, cfg))
