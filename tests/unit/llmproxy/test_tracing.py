"""Trace context through the proxy: without an exporter the proxy builds no span and the caller's traceparent
and baggage reach the actor unchanged; with an exporter its server and client spans are recorded and the actor
sees the proxy's client span as its parent. The proxy runs as its own process (a tracer provider is
process-global), in front of an in-process fake actor."""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path

from grpc import aio

from rollart.v1 import llmproxy_pb2_grpc as lg

from .fake_actor import FakeActor
from .test_service_api import MD, TOKEN, req

BIN = Path(sys.executable).parent
TRACE_ID = "0af7651916cd43dd8448eb211c80319c"
CALLER_SPAN = "b7ad6b7169203331"
TRACEPARENT = f"00-{TRACE_ID}-{CALLER_SPAN}-01"


async def _turn_through_proxy(services, actor: FakeActor, **env: str) -> dict[str, str]:
    """One traced turn through a proxy process started with ``env``; the metadata the actor received."""
    actors = json.dumps([{"actor_id": "a0", "endpoint": actor.address, "pool": "p"}])
    _, info = await asyncio.to_thread(
        services.start,
        "llmproxy",
        [str(BIN / "rollart-llmproxy")],
        60.0,
        ROLLART_ACTORS=actors,
        ROLLART_JOB_TOKEN=TOKEN,
        ROLLART_HTTP_LISTEN="none",
        ROLLART_ROUTE_WAIT_SECONDS="5",
        **env,
    )
    ch = aio.insecure_channel(info["address"])
    try:
        md = (*MD, ("traceparent", TRACEPARENT), ("baggage", "caller=yes"))
        got = [r async for r in lg.LLMProxyStub(ch).Generate(req("traced-1", n=3), metadata=md, timeout=30)]
    finally:
        await ch.close()
    assert sum(len(r.chunk.token_ids) for r in got) == 3
    return actor.metadata[-1]


async def test_without_an_exporter_the_callers_trace_context_reaches_the_actor_unchanged(services):
    actor = await FakeActor("a0").start()
    try:
        md = await _turn_through_proxy(services, actor)
    finally:
        await actor.kill()
    assert md["traceparent"] == TRACEPARENT  # no span of the proxy's in between
    assert "caller=yes" in md["baggage"] and "trajectory_id=traced-1" in md["baggage"]


async def test_with_an_exporter_the_proxys_spans_are_recorded_and_parent_the_actor_call(services, tmp_path: Path):
    spans_file = tmp_path / "proxy-spans.jsonl"
    actor = await FakeActor("a0").start()
    try:
        md = await _turn_through_proxy(
            services, actor, ROLLART_TRACING__EXPORTER="file", ROLLART_TRACING__FILE=str(spans_file)
        )
    finally:
        await actor.kill()
    version, trace_id, parent_span, flags = md["traceparent"].split("-")
    assert (version, trace_id, flags) == ("00", TRACE_ID, "01")
    for _ in range(100):  # the client span is written when the actor's stream has ended
        spans = [json.loads(line) for line in spans_file.read_text().splitlines()] if spans_file.exists() else []
        if any(s["kind"] == "CLIENT" for s in spans):
            break
        await asyncio.sleep(0.05)
    server = [s for s in spans if s["kind"] == "SERVER" and s["name"].endswith("/Generate")]
    client = [s for s in spans if s["kind"] == "CLIENT" and s["name"].endswith("/Generate")]
    assert server and client, spans
    assert server[0]["trace_id"] == TRACE_ID and server[0]["parent_span_id"] == CALLER_SPAN
    assert client[0]["trace_id"] == TRACE_ID and client[0]["parent_span_id"] == server[0]["span_id"]
    assert client[0]["attributes"]["rollart.trajectory_id"] == "traced-1"
    assert client[0]["span_id"] == parent_span  # the actor's parent is the proxy's client span
