"""Telemetry: structured logs, Prometheus metrics and OpenTelemetry traces, propagated across gRPC calls.

A trajectory id travels as OpenTelemetry baggage (``trajectory_id``): set it with ``trajectory_scope(tid)`` and
every gRPC call made inside carries it; servers put it on their spans and log lines.
"""

from __future__ import annotations

import contextlib
import json
import logging
import sys
import threading
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from opentelemetry import baggage, context, propagate, trace
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import (
    BatchSpanProcessor,
    ConsoleSpanExporter,
    SimpleSpanProcessor,
    SpanExporter,
    SpanExportResult,
)
from opentelemetry.sdk.trace.sampling import ParentBasedTraceIdRatio
from prometheus_client import REGISTRY, CollectorRegistry, Counter, Gauge, Histogram, start_http_server

from .config import TracingConfig

TRAJECTORY_BAGGAGE_KEY = "trajectory_id"

# ---------------------------------------------------------------------------------------------------- logs


class JsonFormatter(logging.Formatter):
    """One JSON object per line, with the active trace, span and trajectory ids."""

    def __init__(self, service: str) -> None:
        super().__init__()
        self.service = service

    def format(self, record: logging.LogRecord) -> str:
        out: dict[str, Any] = {
            "ts": round(record.created, 6),
            "level": record.levelname,
            "service": self.service,
            "logger": record.name,
            "msg": record.getMessage(),
        }
        span = trace.get_current_span().get_span_context()
        if span.is_valid:
            out["trace_id"] = f"{span.trace_id:032x}"
            out["span_id"] = f"{span.span_id:016x}"
        tid = current_trajectory_id()
        if tid:
            out["trajectory_id"] = tid
        extra = getattr(record, "fields", None)
        if isinstance(extra, dict):
            out.update(extra)
        if record.exc_info:
            out["exc"] = self.formatException(record.exc_info)
        return json.dumps(out, default=str)


def setup_logging(service: str, level: str = "INFO", fmt: str = "json") -> None:
    handler = logging.StreamHandler(sys.stderr)
    if fmt == "json":
        handler.setFormatter(JsonFormatter(service))
    else:
        handler.setFormatter(logging.Formatter(f"%(asctime)s {service} %(levelname)s %(name)s: %(message)s"))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level)


def log_fields(**fields: Any) -> dict[str, Any]:
    """``logger.info("msg", extra=log_fields(worker=w))`` adds structured fields to a JSON log line."""
    return {"fields": fields}


# ------------------------------------------------------------------------------------------------- metrics

RPC_TOTAL = Counter("rollart_rpc_total", "RPCs handled, by method and status code", ["service", "method", "code"])
RPC_SECONDS = Histogram(
    "rollart_rpc_seconds",
    "RPC handling time in seconds (streams: until the stream ends)",
    ["service", "method"],
    buckets=(0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60),
)
RPC_IN_FLIGHT = Gauge("rollart_rpc_in_flight", "RPCs being handled", ["service"])


def start_metrics_server(address: str, registry: CollectorRegistry = REGISTRY) -> tuple[Any, int]:
    """Serve /metrics on ``host:port`` (port 0 picks one); returns (server, bound port)."""
    host, _, port = address.rpartition(":")
    server, _thread = start_http_server(int(port), addr=host, registry=registry)
    return server, server.server_port


# -------------------------------------------------------------------------------------------------- traces


class JsonLinesSpanExporter(SpanExporter):
    """Appends finished spans to a file as JSON lines (local runs and tests; no collector needed)."""

    def __init__(self, path: Path) -> None:
        self._path = Path(path)
        self._path.parent.mkdir(parents=True, exist_ok=True)
        self._lock = threading.Lock()

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        lines = []
        for span in spans:
            ctx = span.get_span_context()
            if ctx is None:  # every SDK span has one; without it there are no ids to write
                raise ValueError(f"span {span.name!r} has no span context")
            lines.append(
                json.dumps(
                    {
                        "name": span.name,
                        "service": span.resource.attributes.get("service.name"),
                        "trace_id": f"{ctx.trace_id:032x}",
                        "span_id": f"{ctx.span_id:016x}",
                        "parent_span_id": f"{span.parent.span_id:016x}" if span.parent else None,
                        "kind": span.kind.name,
                        "start_ns": span.start_time,
                        "end_ns": span.end_time,
                        "status": span.status.status_code.name,
                        "attributes": dict(span.attributes or {}),
                    },
                    default=str,
                )
            )
        with self._lock, self._path.open("a") as fh:
            fh.write("".join(line + "\n" for line in lines))
        return SpanExportResult.SUCCESS

    def shutdown(self) -> None:
        return None


_provider: TracerProvider | None = None


def setup_tracing(service: str, cfg: TracingConfig) -> TracerProvider | None:
    """Install the global tracer provider for this process (idempotent: the first exporter wins).

    Without an exporter (``exporter: none``) no provider is installed: the OpenTelemetry API's no-op tracer
    then builds no spans at all (an SDK provider would build and discard every one: ~5% of the proxy's CPU),
    and a "span" it starts is the parent's span context, so the caller's traceparent and baggage still reach
    every downstream call unchanged. Returns the provider, or None without an exporter."""
    global _provider
    if _provider is not None or cfg.exporter == "none":
        return _provider
    provider = TracerProvider(
        resource=Resource.create({"service.name": service}),
        sampler=ParentBasedTraceIdRatio(cfg.sample_ratio),
    )
    if cfg.exporter == "file":
        provider.add_span_processor(SimpleSpanProcessor(JsonLinesSpanExporter(cfg.file)))  # type: ignore[arg-type]
    elif cfg.exporter == "console":
        provider.add_span_processor(SimpleSpanProcessor(ConsoleSpanExporter(out=sys.stderr)))
    elif cfg.exporter == "otlp":
        try:
            from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter
        except ImportError as exc:  # pragma: no cover - depends on the optional extra
            raise RuntimeError("tracing.exporter 'otlp' needs `pip install rollart[otlp]`") from exc
        provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter(endpoint=cfg.endpoint, insecure=True)))
    trace.set_tracer_provider(provider)
    _provider = provider
    return provider


def tracing_enabled() -> bool:
    """True when this process has a real tracer provider (spans are built); False under the API's no-op
    default, where a started span is only its parent's context."""
    return not isinstance(trace.get_tracer_provider(), (trace.ProxyTracerProvider, trace.NoOpTracerProvider))


def shutdown_tracing() -> None:
    if _provider is not None:
        _provider.force_flush(2000)
        _provider.shutdown()


def tracer(name: str = "rollart") -> trace.Tracer:
    return trace.get_tracer(name)


def current_trajectory_id(ctx: context.Context | None = None) -> str | None:
    """The trajectory id in ``ctx``'s baggage (default: the current context)."""
    value = baggage.get_baggage(TRAJECTORY_BAGGAGE_KEY, ctx)
    return str(value) if value else None


@contextlib.contextmanager
def trajectory_scope(trajectory_id: str) -> Iterator[None]:
    """Every gRPC call made inside carries ``trajectory_id`` as baggage."""
    token = context.attach(baggage.set_baggage(TRAJECTORY_BAGGAGE_KEY, trajectory_id))
    try:
        yield
    finally:
        context.detach(token)


def inject_metadata(metadata: list[tuple[str, str | bytes]]) -> None:
    """Add W3C traceparent/tracestate and baggage of the current context to outgoing gRPC metadata."""
    carrier: dict[str, str] = {}
    propagate.inject(carrier)
    metadata.extend((k.lower(), v) for k, v in carrier.items())


_PROPAGATED_KEYS: frozenset[str] | None = None


def extract_context(metadata: Sequence[tuple[str, Any]] | None) -> context.Context:
    """The trace context and baggage in incoming gRPC metadata; an empty context when it has none (most calls:
    the propagators are not run then)."""
    global _PROPAGATED_KEYS
    if _PROPAGATED_KEYS is None:
        _PROPAGATED_KEYS = frozenset(propagate.get_global_textmap().fields)
    carrier = {k: v for k, v in (metadata or ()) if k in _PROPAGATED_KEYS and isinstance(v, str)}
    return propagate.extract(carrier) if carrier else context.Context()


class Stopwatch:
    def __init__(self) -> None:
        self.start = time.perf_counter()

    def elapsed(self) -> float:
        return time.perf_counter() - self.start
