"""The LLMProxy service as served (gRPC with auth, the OpenAI HTTP API with the `openai` client) over fake actors."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import aiohttp
import grpc
import openai
import pytest
from grpc import aio

from rollart.runtime.auth import bearer
from rollart.runtime.server import serve
from rollart.v1 import common_pb2
from rollart.v1 import llmproxy_pb2 as pp
from rollart.v1 import llmproxy_pb2_grpc as lg
from rollart_llmproxy.config import LLMProxyConfig
from rollart_llmproxy.service import LLMProxyService

from .fake_actor import FakeActor

TOKEN = "unit-test-token-0123456789"
MD = (bearer(TOKEN),)


@pytest.fixture
async def served(tmp_path: Path):
    a0 = await FakeActor("a0", model="tiny-qwen3").start()
    a1 = await FakeActor("a1", model="tiny-qwen3", delay=0.002).start()
    ready = tmp_path / "proxy.ready"
    cfg = LLMProxyConfig(
        listen="127.0.0.1:0",
        metrics_listen=None,
        job_token=TOKEN,
        ready_file=ready,
        http_listen="127.0.0.1:0",
        status_interval_seconds=0.1,
        route_wait_seconds=0.5,
        grace_seconds=0.5,
        actors=[
            {"actor_id": "a0", "endpoint": a0.address, "pool": "p"},
            {"actor_id": "a1", "endpoint": a1.address, "pool": "q"},
        ],
        affinity=[{"task": "math", "pool": "q", "allow_fallback": False}],
    )
    stop = asyncio.Event()
    task = asyncio.create_task(serve(LLMProxyService(cfg), cfg, stop))
    for _ in range(200):
        if ready.exists():
            break
        await asyncio.sleep(0.02)
    info = json.loads(ready.read_text())
    ch = aio.insecure_channel(info["address"])
    stub = lg.LLMProxyStub(ch)
    # Both actors polled once: routable.
    for _ in range(100):
        st = await stub.GetStatus(pp.ProxyStatusRequest(), metadata=MD)
        if st.healthy_actors == 2:
            break
        await asyncio.sleep(0.05)
    yield stub, info, (a0, a1)
    await ch.close()
    stop.set()
    await asyncio.wait_for(task, 10)
    await a0.kill()
    await a1.kill()


def req(tid: str, n: int = 4, **kw) -> pp.TrajectoryGenerateRequest:
    return pp.TrajectoryGenerateRequest(
        trajectory_id=tid,
        input=common_pb2.ModelInput(token_ids=[3, 4, 5]),
        sampling=common_pb2.SamplingParams(max_tokens=n),
        return_text=True,
        **kw,
    )


async def test_ready_file_carries_the_openai_endpoint(served):
    stub, info, _ = served
    assert info["service"] == "llmproxy"
    assert info["openai_base_url"] == f"http://{info['http_address']}/v1"
    st = await stub.GetStatus(pp.ProxyStatusRequest(), metadata=MD)
    assert st.openai_base_url == info["openai_base_url"] and st.actors == 2
    assert [r.task for r in st.affinity.rules] == ["math"]


async def test_grpc_generate_routes_by_affinity_and_needs_the_token(served):
    stub, _, (a0, a1) = served
    out = [r async for r in stub.Generate(req("t1", task="math"), metadata=MD)]
    assert out[0].route.actor_id == "a1" and out[0].route.pool == "q"
    assert "".join(r.chunk.text for r in out).strip() and sum(len(r.chunk.token_ids) for r in out) == 4
    with pytest.raises(aio.AioRpcError) as err:
        [r async for r in stub.Generate(req("t2"))]
    assert err.value.code() == grpc.StatusCode.UNAUTHENTICATED
    with pytest.raises(aio.AioRpcError) as err:
        await stub.Suspend(pp.SuspendRequest(), metadata=(("authorization", "Bearer wrong"),))
    assert err.value.code() == grpc.StatusCode.UNAUTHENTICATED


async def test_grpc_malformed_and_invalid_requests(served, tmp_path):
    stub, info, _ = served
    ch = aio.insecure_channel(info["address"])
    try:
        raw = ch.unary_stream(
            "/rollart.v1.LLMProxy/Generate", request_serializer=lambda b: b, response_deserializer=lambda b: b
        )
        with pytest.raises(aio.AioRpcError) as err:
            [r async for r in raw(b"\xff\xff\xff garbage", metadata=MD)]
        assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    finally:
        await ch.close()
    with pytest.raises(aio.AioRpcError) as err:
        [r async for r in stub.Generate(pp.TrajectoryGenerateRequest(trajectory_id="x"), metadata=MD)]
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    for call in (
        stub.Abort(pp.ProxyAbortRequest(), metadata=MD),
        stub.AddActor(pp.AddProxyActorRequest(actor_id="z", endpoint="nope"), metadata=MD),
        stub.SetVersionWindow(pp.SetVersionWindowRequest(window=pp.VersionWindow(min_version=-1)), metadata=MD),
        stub.SetAffinity(pp.SetAffinityRequest(rules=[pp.AffinityRule(task="a*b")]), metadata=MD),
    ):
        with pytest.raises(aio.AioRpcError) as err:
            await call
        assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    # Affinity: an auto rule that also names a place, a malformed or oversized tag; each names its field.
    for rule, field in (
        (pp.AffinityRule(task="*", auto=True, pool="q"), "rules[0]: auto"),
        (pp.AffinityRule(task="*", hardware_tags=["two words"]), "rules[0]: hardware_tags[0]"),
        (pp.AffinityRule(task="*", hardware_tags=["t" * 129]), "rules[0]: hardware_tags[0]"),
        (pp.AffinityRule(task="t" * 300), "rules[0]: task"),
    ):
        with pytest.raises(aio.AioRpcError) as err:
            await stub.SetAffinity(pp.SetAffinityRequest(rules=[rule], merge=True), metadata=MD)
        assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT and field in err.value.details()
    with pytest.raises(aio.AioRpcError) as err:  # unauthorised
        await stub.SetAffinity(pp.SetAffinityRequest(rules=[pp.AffinityRule(task="*", auto=True)]))
    assert err.value.code() == grpc.StatusCode.UNAUTHENTICATED
    table = await stub.GetAffinity(pp.GetAffinityRequest(), metadata=MD)
    assert not any(r.auto for r in table.rules)  # nothing refused was stored


async def test_grpc_unavailable_carries_the_retry_metadata(served):
    stub, _, (a0, a1) = served
    a1.delay = 0.02
    call = stub.Generate(req("t", n=400, task="math"), metadata=MD)
    got = 0
    with pytest.raises(aio.AioRpcError) as err:
        async for r in call:
            got += len(r.chunk.token_ids)
            if got >= 3:
                await a1.kill()
    assert err.value.code() == grpc.StatusCode.UNAVAILABLE
    md = dict(err.value.trailing_metadata())
    assert md["rollart-retryable"] == "true" and md["rollart-failed-actor"] == "a1"
    assert int(md["rollart-tokens-streamed"]) >= 3
    # "math" has no fallback: with its only actor dead, new turns are retryable UNAVAILABLE too.
    with pytest.raises(aio.AioRpcError) as err:
        [r async for r in stub.Generate(req("t", task="math"), metadata=MD)]
    assert err.value.code() == grpc.StatusCode.UNAVAILABLE
    # Other tasks still route (to a0).
    out = [r async for r in stub.Generate(req("u"), metadata=MD)]
    assert out[0].route.actor_id == "a0"


async def test_grpc_admin_calls(served):
    stub, _, (a0, a1) = served
    s = await stub.Suspend(pp.SuspendRequest(reason="update", step=3), metadata=MD)
    assert s.suspended and s.reason == "update"
    r = await stub.Resume(pp.ResumeRequest(step=3), metadata=MD)
    assert not r.suspended
    w = await stub.SetVersionWindow(pp.SetVersionWindowRequest(window=pp.VersionWindow(min_version=0)), metadata=MD)
    assert w.min_version == 0
    listed = await stub.ListActors(pp.ListProxyActorsRequest(pool="q"), metadata=MD)
    assert [a.actor_id for a in listed.actors] == ["a1"] and listed.actors[0].model == "tiny-qwen3"
    added = await stub.AddActor(pp.AddProxyActorRequest(actor_id="a0b", endpoint=a0.address, pool="p"), metadata=MD)
    assert added.ready and added.source == pp.ACTOR_SOURCE_STATIC and added.version_known
    await stub.RemoveActor(pp.RemoveProxyActorRequest(actor_id="a0b"), metadata=MD)
    await stub.RemoveActor(pp.RemoveProxyActorRequest(actor_id="a0b"), metadata=MD)  # idempotent
    pd = await stub.SetPdConfig(pp.SetPdConfigRequest(pools=[pp.PdPoolConfig(pool="p", enabled=False)]), metadata=MD)
    assert pd.pools[0].pool == "p"
    assert (await stub.GetPdConfig(pp.GetPdConfigRequest(), metadata=MD)) == pd
    tok = await stub.Tokenize(
        pp.ProxyTokenizeRequest(request=common_pb2.TokenizeRequest(input=common_pb2.ModelInput(text="abc"))),
        metadata=MD,
    )
    assert list(tok.token_ids) == [ord(c) for c in "abc"]


# ------------------------------------------------------------------------------------------------ OpenAI


def client(info, **kw) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=info["openai_base_url"], api_key=TOKEN, max_retries=0, **kw)


async def test_openai_models_chat_and_completions(served):
    _, info, (a0, a1) = served
    c = client(info)
    models = await c.models.list()
    assert [m.id for m in models.data] == ["tiny-qwen3"]
    chat = await c.chat.completions.create(
        model="tiny-qwen3",
        messages=[{"role": "user", "content": "2+2?"}],
        max_tokens=5,
        temperature=0,
        logprobs=True,
        extra_headers={"X-Rollart-Trajectory-Id": "oa-1"},
    )
    assert chat.choices[0].finish_reason == "length" and chat.choices[0].message.content
    assert len(chat.choices[0].logprobs.content) == 5 and chat.usage.completion_tokens == 5
    extra = chat.model_extra["rollart"]
    assert extra["trajectory_id"] == "oa-1" and len(extra["token_ids"]) == 5 and len(extra["versions"]) == 5
    sent = (a0.requests + a1.requests)[-1]
    assert sent.trajectory_id == "oa-1" and sent.input.messages[0].content == "2+2?"
    # The same trajectory id sticks to the same actor.
    again = await c.chat.completions.create(
        model="tiny-qwen3",
        messages=[{"role": "user", "content": "more"}],
        max_tokens=2,
        extra_headers={"X-Rollart-Trajectory-Id": "oa-1"},
    )
    assert again.model_extra["rollart"]["actor_id"] == extra["actor_id"]
    assert again.model_extra["rollart"]["route_reason"] == "sticky"
    comp = await c.completions.create(model="tiny-qwen3", prompt="Once upon", max_tokens=3, logprobs=0)
    assert comp.choices[0].text and comp.choices[0].logprobs.token_logprobs == [-0.25] * 3
    comp = await c.completions.create(model="tiny-qwen3", prompt=[1, 2, 3], max_tokens=2)
    assert comp.usage.prompt_tokens == 3


async def test_openai_streaming(served):
    _, info, _ = served
    c = client(info)
    stream = await c.chat.completions.create(
        model="tiny-qwen3",
        messages=[{"role": "user", "content": "count"}],
        max_tokens=6,
        stream=True,
        stream_options={"include_usage": True},
        extra_headers={"X-Rollart-Task": "math"},
    )
    deltas, finish, usage, actors = [], None, None, set()
    async for chunk in stream:
        if chunk.usage is not None:
            usage = chunk.usage
        for ch in chunk.choices:
            if ch.delta.content:
                deltas.append(ch.delta.content)
            finish = ch.finish_reason or finish
        if chunk.model_extra.get("rollart"):
            actors.add(chunk.model_extra["rollart"].get("actor_id"))
    assert len(deltas) == 6 and finish == "length" and usage.completion_tokens == 6
    assert actors - {None} == {"a1"}  # affinity "math" -> pool q
    comp = await c.completions.create(model="m", prompt="x", max_tokens=4, stream=True)
    texts = [ch.choices[0].text async for ch in comp if ch.choices]
    assert len([t for t in texts if t]) == 4


async def test_openai_errors(served):
    _, info, (a0, a1) = served
    with pytest.raises(openai.AuthenticationError):
        await openai.AsyncOpenAI(base_url=info["openai_base_url"], api_key="wrong", max_retries=0).models.list()
    c = client(info)
    with pytest.raises(openai.BadRequestError):
        await c.chat.completions.create(model="m", messages=[{"role": "user", "content": "x"}], n=2)
    with pytest.raises(openai.BadRequestError):
        await c.chat.completions.create(model="m", messages=[], max_tokens=2)
    with pytest.raises(openai.BadRequestError):
        await c.chat.completions.create(model="m", messages=[{"role": "user", "content": "x"}], max_tokens=-1)
    base = info["openai_base_url"]
    async with aiohttp.ClientSession() as s:
        async with s.post(
            f"{base}/chat/completions", data=b"{not json", headers={"Authorization": f"Bearer {TOKEN}"}
        ) as r:
            assert r.status == 400 and "JSON" in (await r.json())["error"]["message"]
        async with s.post(f"{base}/completions", json={"prompt": "x"}) as r:
            assert r.status == 401
        async with s.get(f"http://{info['http_address']}/health") as r:
            assert r.status == 200
        # Retryable failure: 503 with Retry-After (the "math" pool's only actor is gone).
        await a1.kill()
        for _ in range(50):
            async with s.post(
                f"{base}/completions",
                json={"prompt": "x", "max_tokens": 2},
                headers={"Authorization": f"Bearer {TOKEN}", "X-Rollart-Task": "math"},
            ) as r:
                if r.status == 503:
                    break
        assert r.status == 503 and r.headers["Retry-After"] == "1" and r.headers["X-Rollart-Retryable"] == "true"


async def test_openai_hostile_requests_are_400_and_metrics_labels_stay_bounded(served):
    from rollart_llmproxy import metrics
    from rollart_llmproxy.openai_http import ROUTES

    _, info, _ = served
    base = info["openai_base_url"]
    auth = {"Authorization": f"Bearer {TOKEN}"}
    chat = {"model": "m", "messages": [{"role": "user", "content": "x"}]}
    deep = b'{"model": "m", "messages": [{"role": "user", "content": "x"}], "tools": ' + b"[" * 50_000
    deep += b"]" * 50_000 + b"}"
    async with aiohttp.ClientSession() as s:
        cases = [
            ("/completions", {"prompt": "x", "max_tokens": 2**63}, {}),
            ("/chat/completions", {**chat, "max_tokens": 2**63}, {}),
            ("/chat/completions", {**chat, "max_completion_tokens": 2**31}, {}),
            ("/completions", {"prompt": [1, 2**40]}, {}),
            ("/completions", {"prompt": "x", "seed": 2**70}, {}),
            ("/completions", {"prompt": "x", "stop_token_ids": [2**33]}, {}),
            ("/completions", {"prompt": "x", "top_k": 2**40}, {}),
            ("/completions", {"prompt": "x"}, {"X-Rollart-Turn": str(2**40)}),
            ("/completions", {"prompt": "x"}, {"X-Rollart-Min-Version": str(2**70)}),
            ("/completions", {"prompt": "x"}, {"X-Rollart-Timeout": "nan"}),
            ("/completions", {"prompt": "x"}, {"X-Rollart-Timeout": "1e300"}),
        ]
        for path, body, headers in cases:
            async with s.post(base + path, json=body, headers={**auth, **headers}) as r:
                assert r.status == 400, (path, body, headers, r.status, await r.text())
        for raw in (deep, b'{"prompt": "x", "temperature": Infinity}', b'{"prompt": "x", "temperature": NaN}'):
            async with s.post(base + "/completions", data=raw, headers={**auth, "Content-Type": "application/json"}) as r:
                assert r.status == 400, (raw[:60], r.status)
        # Any path, with or without a token, counts under one of a fixed set of labels.
        for i in range(200):
            async with s.get(f"{base}/unknown-{i}", headers=auth if i % 2 else {}) as r:
                assert r.status in (401, 404, 405)
    paths = {sample.labels["path"] for m in metrics.HTTP_REQUESTS.collect() for sample in m.samples}
    assert paths <= set(ROUTES) | {"other"}, paths


async def _until(cond, timeout: float = 3.0) -> bool:
    for _ in range(int(timeout / 0.02)):
        if cond():
            return True
        await asyncio.sleep(0.02)
    return cond()


async def test_caller_going_away_cancels_the_actor_call(served):
    stub, info, (a0, a1) = served
    a1.delay = 0.01
    call = stub.Generate(req("gone-grpc", n=2000, task="math"), metadata=MD)
    got = 0
    async for r in call:
        got += len(r.chunk.token_ids)
        if got >= 3:
            break
    assert a1.active
    call.cancel()
    assert await _until(lambda: not a1.active), "the actor kept generating for a cancelled gRPC caller"
    # The same over HTTP: a streaming client that disconnects.
    async with aiohttp.ClientSession() as s:
        resp = await s.post(
            f"{info['openai_base_url']}/completions",
            json={"prompt": "hello", "max_tokens": 2000, "stream": True},
            headers={"Authorization": f"Bearer {TOKEN}", "X-Rollart-Task": "math"},
        )
        assert resp.status == 200 and resp.headers["Content-Type"].startswith("text/event-stream")
        lines = 0
        async for line in resp.content:
            lines += line.startswith(b"data: ")
            if lines >= 3:
                break
        assert a1.active
        resp.close()
    assert await _until(lambda: not a1.active), "the actor kept generating for a disconnected HTTP caller"
