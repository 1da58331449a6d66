"""Forwarding without re-encoding: the proxy's Generate responses are built around the actor's chunk bytes
(``core.Forward.wire``) and must be exactly what serializing the response message gives; the actor call goes
over a channel without client interceptors and must still carry the job token, the trace context and the
trajectory baggage."""

from __future__ import annotations

import grpc
import pytest
from grpc import aio

from rollart.v1 import common_pb2
from rollart.v1 import llmproxy_pb2 as pp
from rollart_llmproxy.core import Forward, _varint

from .test_service_api import MD, TOKEN, req, served  # noqa: F401 - the fixture

TRACEPARENT = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
ROUTE = pp.RouteInfo(actor_id="a0", actor_endpoint="127.0.0.1:1", pool="p", reason=pp.ROUTE_REASON_STICKY)


def _chunk(n: int, **kw) -> common_pb2.GenerationChunk:
    return common_pb2.GenerationChunk(
        request_id="r" * 40,
        trajectory_id="t",
        actor_id="a0",
        offset=3,
        token_ids=list(range(n)),
        logprobs=[-0.5] * n,
        versions=[7] * n,
        **kw,
    )


@pytest.mark.parametrize("n", [0, 1, 5, 300, 70_000])  # empty chunk, 1- to 3-byte length prefixes
@pytest.mark.parametrize("route", [None, ROUTE])
def test_wire_is_the_serialized_response_byte_for_byte(n, route):
    chunk = _chunk(n, text="héllo" if n else "")
    if n == 0:
        chunk = common_pb2.GenerationChunk()  # an all-default chunk still marks the field present
    item = Forward(chunk.SerializeToString(), chunk, route)
    assert item.wire() == item.message().SerializeToString()
    back = pp.TrajectoryGenerateResponse.FromString(item.wire())
    assert back.HasField("chunk") and back.chunk == chunk
    assert back.HasField("route") == (route is not None)


def test_varint_matches_protobuf():
    for v in (0, 1, 127, 128, 300, 16_383, 16_384, 2**21, 2**28 + 5):
        msg = common_pb2.GenerationChunk(kv_transfer_params_json="x" * 0)
        msg.prompt_token_ids.append(v)  # packed repeated int32 of one value: tag, length, varint
        assert msg.SerializeToString().endswith(_varint(v))


@pytest.mark.usefixtures("no_tracer_provider")
async def test_grpc_responses_equal_the_proxy_messages_and_the_actor_sees_token_and_baggage(served):  # noqa: F811
    stub, info, (a0, a1) = served
    ch = aio.insecure_channel(info["address"])
    try:
        raw = ch.unary_stream(
            "/rollart.v1.LLMProxy/Generate",
            request_serializer=pp.TrajectoryGenerateRequest.SerializeToString,
            response_deserializer=None,
        )
        got = [r async for r in raw(req("wire-1", n=6, task="math"), metadata=(*MD, ("traceparent", TRACEPARENT)))]
    finally:
        await ch.close()
    msgs = [pp.TrajectoryGenerateResponse.FromString(b) for b in got]
    assert msgs[0].route.actor_id == "a1" and not any(m.HasField("route") for m in msgs[1:])
    assert sum(len(m.chunk.token_ids) for m in msgs) == 6 and msgs[-1].chunk.usage.completion_tokens == 6
    # What the actor sent, chunk by chunk, is what the caller got (no field lost, none re-encoded differently).
    assert [m.chunk.offset for m in msgs] == list(range(6))
    assert all(m.chunk.actor_id == "a1" and m.chunk.trajectory_id == "wire-1" for m in msgs)
    md = a1.metadata[-1]
    assert md.get("authorization") == f"Bearer {TOKEN}"
    assert "trajectory_id=wire-1" in md.get("baggage", "")
    # No exporter here: the proxy builds no span, so the caller's trace context reaches the actor unchanged.
    assert md.get("traceparent") == TRACEPARENT


async def test_grpc_generate_refuses_oversized_and_unauthorised_requests_before_any_actor_call(served):  # noqa: F811
    stub, _, (a0, a1) = served
    before = len(a0.requests) + len(a1.requests)
    big = pp.TrajectoryGenerateRequest(
        trajectory_id="big",
        input=common_pb2.ModelInput(text="x" * (17 << 20)),  # over the proxy's 16 MiB receive limit
        sampling=common_pb2.SamplingParams(max_tokens=2),
    )
    with pytest.raises(aio.AioRpcError) as err:
        [r async for r in stub.Generate(big, metadata=MD)]
    assert err.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    many = req("many", n=2)
    many.input.token_ids.extend([5] * 2_000_000)  # within the byte limit, over the per-field bound
    with pytest.raises(aio.AioRpcError) as err:
        [r async for r in stub.Generate(many, metadata=MD)]
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    for md in ((("authorization", "Bearer not-the-token"),), ()):
        with pytest.raises(aio.AioRpcError) as err:
            [r async for r in stub.Generate(req("unauth", n=2), metadata=md)]
        assert err.value.code() == grpc.StatusCode.UNAUTHENTICATED
    assert len(a0.requests) + len(a1.requests) == before
