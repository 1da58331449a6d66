"""Trace context through the proxy: without an exporter the proxy builds no span and the caller's traceparent
and baggage reach the actor unchanged; with an exporter its server and client spans are recorded and the actor
sees the proxy's client span as its parent. On that span-less path bad input still gets its clear status, and a
SIGKILLed actor or proxy mid-stream ends the turn cleanly. The proxy runs as its own process (a tracer provider
is process-global), in front of an in-process fake actor."""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path

import grpc
import pytest
from grpc import aio

from rollart.v1 import common_pb2
from rollart.v1 import llmproxy_pb2 as pp
from rollart.v1 import llmproxy_pb2_grpc as lg

from .fake_actor import FakeActor
from .test_service_api import MD, TOKEN, req

BIN = Path(sys.executable).parent
TRACE_ID = "0af7651916cd43dd8448eb211c80319c"
CALLER_SPAN = "b7ad6b7169203331"
TRACEPARENT = f"00-{TRACE_ID}-{CALLER_SPAN}-01"


async def _start_proxy(services, actor: FakeActor, **env: str):
    """A proxy process in front of ``actor``; (process, ready info)."""
    actors = json.dumps([{"actor_id": "a0", "endpoint": actor.address, "pool": "p"}])
    return await asyncio.to_thread(
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


async def _turn_through_proxy(services, actor: FakeActor, **env: str) -> dict[str, str]:
    """One traced turn through a proxy process started with ``env``; the metadata the actor received."""
    _, info = await _start_proxy(services, actor, **env)
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


async def test_the_span_less_path_refuses_bad_input_and_survives_kills(services):
    actor = await FakeActor("a0", delay=0.05).start()
    proxy_proc, info = await _start_proxy(services, actor)
    ch = aio.insecure_channel(info["address"])
    stub = lg.LLMProxyStub(ch)
    traced = (*MD, ("traceparent", TRACEPARENT))
    try:
        raw = ch.unary_stream("/rollart.v1.LLMProxy/Generate", request_serializer=None, response_deserializer=None)
        with pytest.raises(aio.AioRpcError) as err:
            [r async for r in raw(b"\xff\xff\xff garbage", metadata=traced, timeout=10)]
        assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "malformed" in err.value.details()
        big = pp.TrajectoryGenerateRequest(
            trajectory_id="big",
            input=common_pb2.ModelInput(text="x" * (17 << 20)),
            sampling=common_pb2.SamplingParams(max_tokens=2),
        )
        with pytest.raises(aio.AioRpcError) as err:
            [r async for r in stub.Generate(big, metadata=traced, timeout=10)]
        assert err.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        with pytest.raises(aio.AioRpcError) as err:
            [r async for r in stub.Generate(req("anon"), metadata=[("traceparent", TRACEPARENT)], timeout=10)]
        assert err.value.code() == grpc.StatusCode.UNAUTHENTICATED
        assert not actor.requests  # none of them reached the actor
        # A malformed traceparent is ignored: the turn runs, the actor gets no trace context from it.
        bad_trace = (*MD, ("traceparent", "00-nothex-x-01"), ("baggage", "=;=,"))
        got = [r async for r in stub.Generate(req("bad-trace", n=2), metadata=bad_trace, timeout=10)]
        assert sum(len(r.chunk.token_ids) for r in got) == 2 and "traceparent" not in actor.metadata[-1]

        # The actor SIGKILLed (its server gone) mid-stream: UNAVAILABLE, retryable, with the tokens streamed.
        stream = stub.Generate(req("cut-actor", n=100), metadata=traced, timeout=30)
        seen = 0
        with pytest.raises(aio.AioRpcError) as err:
            async for r in stream:
                seen += len(r.chunk.token_ids)
                if seen == 3:
                    await actor.kill()
        trailing = dict(err.value.trailing_metadata() or ())
        assert err.value.code() == grpc.StatusCode.UNAVAILABLE and trailing.get("rollart-retryable") == "true"
        assert int(trailing["rollart-tokens-streamed"]) >= 3

        # The proxy SIGKILLed mid-stream: the caller's stream fails UNAVAILABLE and the actor's call is cancelled.
        actor = await FakeActor("a0", delay=0.05).start(port=int(actor.address.rpartition(":")[2]))
        for _ in range(100):  # the proxy's status poll finds the actor back
            st = await stub.GetStatus(pp.ProxyStatusRequest(), metadata=MD)
            if st.healthy_actors == 1:
                break
            await asyncio.sleep(0.1)
        stream = stub.Generate(req("cut-proxy", n=100), metadata=traced, timeout=30)
        with pytest.raises(aio.AioRpcError) as err:
            async for _ in stream:
                if actor.active:
                    proxy_proc.kill()
        assert err.value.code() == grpc.StatusCode.UNAVAILABLE
        for _ in range(100):
            if not actor.active:
                break
            await asyncio.sleep(0.05)
        assert not actor.active  # the actor's generation did not run on for a caller that is gone
    finally:
        await ch.close()
        await actor.kill()
