"""Tracing without an exporter: no tracer provider is installed, so no span is built, and what a service
"starts" is its caller's span context (so the caller's traceparent travels on unchanged)."""

from __future__ import annotations

import pytest

from rollart.runtime import telemetry
from rollart.runtime.config import TracingConfig

pytestmark = pytest.mark.usefixtures("no_tracer_provider")

TRACEPARENT = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"


def test_no_exporter_installs_no_provider_and_passes_the_parent_context_through():
    assert telemetry.setup_tracing("unit", TracingConfig()) is None
    assert not telemetry.tracing_enabled()
    parent = telemetry.extract_context([("traceparent", TRACEPARENT), ("baggage", "trajectory_id=t-1")])
    span = telemetry.tracer().start_span("/x.Y/Z", context=parent)
    assert not span.is_recording()
    ctx = span.get_span_context()
    assert (f"{ctx.trace_id:032x}", f"{ctx.span_id:016x}") == ("0af7651916cd43dd8448eb211c80319c", "b7ad6b7169203331")
    token = telemetry.context.attach(parent)
    try:
        md: list[tuple[str, str | bytes]] = []
        telemetry.inject_metadata(md)
    finally:
        telemetry.context.detach(token)
    assert dict(md)["traceparent"] == TRACEPARENT and dict(md)["baggage"] == "trajectory_id=t-1"


def test_malformed_trace_headers_are_ignored():
    parent = telemetry.extract_context([("traceparent", "00-zz-not-a-trace"), ("baggage", "\x00" * 10)])
    span = telemetry.tracer().start_span("/x.Y/Z", context=parent)
    assert not span.get_span_context().is_valid
    assert telemetry.current_trajectory_id(parent) is None
