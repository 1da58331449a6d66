"""The proxy's turn logic against fake actors (real gRPC servers in this process): stickiness, failover,
suspend/resume, abort, PD, removal, versions and validation."""

from __future__ import annotations

import asyncio
import json
import time

import grpc
import pytest

from rollart.v1 import actor_pb2, common_pb2
from rollart.v1 import llmproxy_pb2 as pp
from rollart_llmproxy.config import LLMProxyConfig
from rollart_llmproxy.core import Proxy, TurnError

from .fake_actor import FakeActor

FR = common_pb2.FinishReason


def cfg(**kw) -> LLMProxyConfig:
    base = dict(
        insecure_disable_auth=True,
        http_listen=None,
        status_interval_seconds=0.1,
        route_wait_seconds=0.5,
        abort_grace_seconds=0.3,
    )
    base.update(kw)
    return LLMProxyConfig(**base)


@pytest.fixture
async def env():
    actors: list[FakeActor] = []
    proxies: list[Proxy] = []

    async def make(n: int = 2, *, config: LLMProxyConfig | None = None, **actor_kw):
        p = Proxy(config or cfg())
        await p.start()
        proxies.append(p)
        out = []
        for i in range(n):
            a = await FakeActor(f"a{i}", **actor_kw).start()
            actors.append(a)
            out.append(a)
            p.add_actor(a.actor_id, a.address, pool="p")
            await p.poll_once(p.router.actors[a.actor_id], p.clients[a.actor_id])
        return p, out

    yield make
    for p in proxies:
        await p.stop()
    for a in actors:
        await a.kill()


def turn(tid: str, n: int = 5, **kw) -> pp.TrajectoryGenerateRequest:
    inp = kw.pop("input", None) or common_pb2.ModelInput(token_ids=[1, 2, 3])
    return pp.TrajectoryGenerateRequest(
        trajectory_id=tid, input=inp, sampling=common_pb2.SamplingParams(max_tokens=n, logprobs=True), **kw
    )


async def run(p: Proxy, req) -> tuple[list[pp.TrajectoryGenerateResponse], TurnError | None]:
    out = []
    try:
        async for r in p.generate(req):
            out.append(r)
    except TurnError as exc:
        return out, exc
    return out, None


def tokens(out) -> list[int]:
    return [t for r in out for t in r.chunk.token_ids]


async def test_turns_of_a_trajectory_stay_on_one_actor(env):
    p, (a0, a1) = await env(2)
    routes = []
    for i in range(4):
        out, err = await run(p, turn("traj-1", turn=i))
        assert err is None and len(tokens(out)) == 5 and out[-1].chunk.finish_reason == FR.FINISH_REASON_LENGTH
        routes.append(out[0].route)
        assert not any(r.HasField("route") for r in out[1:])  # routing info on the first response only
    assert len({r.actor_id for r in routes}) == 1
    assert routes[0].reason == pp.ROUTE_REASON_LEAST_LOADED
    assert all(r.reason == pp.ROUTE_REASON_STICKY for r in routes[1:])
    # Load went back to zero, and the sticky trajectory is counted.
    actors = {a.actor_id: a for a in p.list_actors()}
    assert all(a.outstanding_tokens == 0 and a.outstanding_requests == 0 for a in actors.values())
    assert actors[routes[0].actor_id].sticky_trajectories == 1
    assert p.status().requests_total == 4


async def test_concurrent_trajectories_spread_by_outstanding_tokens(env):
    p, actors = await env(2, delay=0.01)
    outs = await asyncio.gather(*(run(p, turn(f"t{i}", n=20)) for i in range(6)))
    used = [o[0][0].route.actor_id for o in outs]
    assert used.count("a0") == 3 and used.count("a1") == 3


async def test_dead_actor_before_any_token_is_retried_elsewhere(env):
    # Slow status polls: the turn, not a poll, is what finds a0 dead.
    p, (a0, a1) = await env(2, config=cfg(status_interval_seconds=30))
    p.router.stick("t", "a0")
    await a0.kill()
    out, err = await run(p, turn("t"))
    assert err is None
    assert out[0].route.actor_id == "a1" and out[0].route.reason == pp.ROUTE_REASON_RETRY
    assert p.router.actors["a0"].state == pp.PROXY_ACTOR_STATE_UNHEALTHY
    # The next turn sticks to the new actor.
    out, _ = await run(p, turn("t"))
    assert out[0].route.actor_id == "a1" and out[0].route.reason == pp.ROUTE_REASON_STICKY


async def test_dead_actor_mid_stream_ends_in_flight_turns_retryable(env):
    p, (a0, a1) = await env(2, delay=0.02)
    p.router.stick("t", "a0")
    task = asyncio.create_task(run(p, turn("t", n=500)))
    while len(a0.active) == 0:
        await asyncio.sleep(0.01)
    await asyncio.sleep(0.1)
    await a0.kill()
    out, err = await asyncio.wait_for(task, 5)
    assert err is not None and err.code == grpc.StatusCode.UNAVAILABLE and err.retryable
    md = dict(err.trailing)
    assert md["rollart-retryable"] == "true" and md["rollart-failed-actor"] == "a0"
    assert int(md["rollart-tokens-streamed"]) == len(tokens(out)) > 0
    assert p.status().actor_failures == 1
    # New turns of that trajectory go to the live actor and say RETRY.
    out, err = await run(p, turn("t"))
    assert err is None and out[0].route.actor_id == "a1" and out[0].route.reason == pp.ROUTE_REASON_RETRY


async def test_suspend_holds_new_turns_while_in_flight_ones_continue(env):
    p, (a0,) = await env(1, delay=0.01)
    inflight = asyncio.create_task(run(p, turn("busy", n=60)))
    while not a0.active:
        await asyncio.sleep(0.005)
    state = p.suspend("update", 7)
    assert state.suspended and state.reason == "update" and state.in_flight_requests == 1
    waiting = asyncio.create_task(run(p, turn("late", n=3)))
    await asyncio.sleep(0.3)
    assert not waiting.done() and p.admission_state().waiting_requests == 1
    before = len(a0.requests)
    done_out, err = await asyncio.wait_for(inflight, 5)  # in flight: finishes while suspended
    assert err is None and len(tokens(done_out)) == 60
    assert len(a0.requests) == before  # the waiting turn never reached the actor
    resumed = p.resume()
    assert resumed.released == 1 and resumed.suspended_for.ToNanoseconds() > 0.25e9
    out, err = await asyncio.wait_for(waiting, 5)
    assert err is None and out[0].route.admission_wait.ToNanoseconds() > 0.25e9


async def test_suspended_turn_times_out_at_its_deadline(env):
    p, _ = await env(1)
    p.suspend("update", 1)
    req = turn("t")
    req.deadline.FromNanoseconds(int((time.time() + 0.2) * 1e9))
    start = time.monotonic()
    out, err = await run(p, req)
    assert err is not None and err.code == grpc.StatusCode.DEADLINE_EXCEEDED
    assert 0.15 < time.monotonic() - start < 2
    assert p.admission_state().waiting_requests == 0


async def test_abort_ends_waiting_and_in_flight_turns_and_reaches_the_actor(env):
    p, (a0,) = await env(1, delay=0.01)
    inflight = asyncio.create_task(run(p, turn("victim", n=1000, request_id="r-1")))
    other = asyncio.create_task(run(p, turn("bystander", n=30)))
    while len(a0.active) < 2:
        await asyncio.sleep(0.005)
    p.suspend("x", 0)
    queued = asyncio.create_task(run(p, turn("victim", n=5, request_id="r-2")))
    await asyncio.sleep(0.05)
    resp = p.abort(["victim", "nobody"], "lease cancelled")
    assert resp.aborted_requests == 2 and list(resp.aborted_trajectory_ids) == ["victim"]
    for task in (inflight, queued):
        out, err = await asyncio.wait_for(task, 3)
        assert err is None and out[-1].chunk.finish_reason == FR.FINISH_REASON_ABORTED
    assert len(tokens((await asyncio.wait_for(inflight, 1))[0])) < 1000
    await asyncio.sleep(0.05)
    assert any("r-1" in a.request_ids and "victim" in a.trajectory_ids for a in a0.aborts)
    p.resume()
    out, err = await asyncio.wait_for(other, 5)
    assert err is None and out[-1].chunk.finish_reason == FR.FINISH_REASON_LENGTH  # untouched
    assert p.abort(["victim"]).aborted_requests == 0  # idempotent
    assert p.status().aborted_total == 2


async def test_abort_cuts_a_stream_the_actor_does_not_end(env):
    p, (a0,) = await env(1, delay=0.01, honour_abort=False)
    task = asyncio.create_task(run(p, turn("t", n=2000)))
    while not a0.active:
        await asyncio.sleep(0.005)
    a0.gate = asyncio.Event()  # a stalled engine: no chunk comes that the proxy could end the turn at
    await asyncio.sleep(0.05)
    start = time.monotonic()
    p.abort(["t"])
    out, err = await asyncio.wait_for(task, 3)
    assert err is None and out[-1].chunk.finish_reason == FR.FINISH_REASON_ABORTED
    assert 0.25 < time.monotonic() - start < 2  # after the abort grace
    await asyncio.sleep(0.1)
    assert not a0.active  # the cut cancelled the actor's call


async def test_after_an_abort_nothing_the_actor_ran_ahead_with_reaches_the_caller(env):
    # A fast engine finishes the turn while its caller has read one chunk: the rest waits in the buffers.
    p, (a0,) = await env(1, honour_abort=False)
    stream = p.generate(turn("fast", n=400, request_id="r-fast"))
    first = await stream.__anext__()
    while a0.active:  # the actor has sent every token (and the last chunk)
        await asyncio.sleep(0.005)
    assert p.abort(["fast"]).aborted_requests == 1
    rest = [r async for r in stream]
    assert rest[-1].chunk.finish_reason == FR.FINISH_REASON_ABORTED
    assert len(tokens([first] + rest)) < 400
    assert p.abort(["fast"]).aborted_requests == 0


async def test_an_abort_after_the_last_chunk_is_not_counted(env):
    p, _ = await env(1)
    stream = p.generate(turn("done", n=3))
    out = [r async for r in _until_finish(stream)]
    assert out[-1].chunk.finish_reason == FR.FINISH_REASON_LENGTH
    assert p.abort(["done"]).aborted_requests == 0  # handed on already: the turn ends as it ended
    assert [r async for r in stream] == []


async def _until_finish(stream):
    async for r in stream:
        yield r
        if r.chunk.finish_reason:
            return


async def test_pd_turn_prefills_on_one_actor_and_decodes_on_another(env):
    p, (a0, a1) = await env(2)
    # The actors report their PD roles; let any status poll already in flight land, then poll once more.
    a0.pd_role, a1.pd_role = common_pb2.PD_ROLE_PREFILL, common_pb2.PD_ROLE_DECODE
    await asyncio.sleep(0.3)
    for aid in ("a0", "a1"):
        await p.poll_once(p.router.actors[aid], p.clients[aid])
    assert p.router.actors["a0"].pd_role == common_pb2.PD_ROLE_PREFILL
    p.set_pd(
        [pp.PdPoolConfig(pool="p", enabled=True, kv_connector="ExampleConnector", min_prompt_tokens=4)], merge=False
    )
    msgs = common_pb2.ModelInput(messages=[common_pb2.ChatMessage(role="user", content="hello there")])
    out, err = await run(p, turn("t", n=4, input=msgs))
    assert err is None
    route = out[0].route
    assert route.actor_id == "a1" and route.prefill_actor_id == "a0"
    (prefill_req,) = a0.requests
    decode_req = a1.requests[-1]
    assert prefill_req.pd_phase == actor_pb2.PD_PHASE_PREFILL and prefill_req.sampling.max_tokens == 1
    assert decode_req.pd_phase == actor_pb2.PD_PHASE_DECODE and decode_req.sampling.max_tokens == 4
    # Both phases saw the same token ids (messages tokenized once, by the decode actor's Tokenize).
    assert list(prefill_req.input.token_ids) == list(decode_req.input.token_ids) == FakeActor.tokens_of(msgs)
    assert json.loads(decode_req.kv_transfer_params_json) == {
        "prefilled_by": "a0",
        "tokens": len(FakeActor.tokens_of(msgs)),
    }
    assert len(tokens(out)) == 4 and 7 not in tokens(out)[:1]  # the prefill's own token is not forwarded
    # The task's profile counts the prefill actor's work, not the decode actor's (all KV received).
    profile = p.router.profiles[""]
    assert profile.prefill_avg == len(FakeActor.tokens_of(msgs)) and profile.decode_avg == 4
    # Short prompts run unified on the decode actor.
    out, err = await run(p, turn("u", n=2, input=common_pb2.ModelInput(token_ids=[5, 6])))
    assert err is None and out[0].route.actor_id == "a1" and out[0].route.prefill_actor_id == ""
    assert a1.requests[-1].pd_phase == actor_pb2.PD_PHASE_FULL and len(a0.requests) == 1
    # A dead prefill actor: the decode actor does the whole turn.
    await a0.kill()
    out, err = await run(p, turn("v", n=3, input=common_pb2.ModelInput(token_ids=list(range(10)))))
    assert err is None and out[0].route.actor_id == "a1" and out[0].route.prefill_actor_id == ""
    assert a1.requests[-1].pd_phase == actor_pb2.PD_PHASE_FULL


async def test_remove_actor_drains_or_aborts(env):
    p, (a0, a1) = await env(2, delay=0.01)
    p.router.stick("d", "a0")
    draining = asyncio.create_task(run(p, turn("d", n=30)))
    while not a0.active:
        await asyncio.sleep(0.005)
    p.remove_actor("a0", abort_in_flight=False)
    assert p.router.actors["a0"].state == pp.PROXY_ACTOR_STATE_DRAINING
    out, err = await run(p, turn("d2"))  # new turns avoid it
    assert out[0].route.actor_id == "a1"
    out, err = await asyncio.wait_for(draining, 5)
    assert err is None and len(tokens(out)) == 30
    assert "a0" not in p.router.actors  # gone once drained
    # Remove with abort: in-flight turns end UNAVAILABLE (retryable).
    p.add_actor("a0", a0.address, pool="p", static=True)
    p.removed_by_hand.discard("a0")
    await p.poll_once(p.router.actors["a0"], p.clients["a0"])
    p.router.stick("x", "a0")
    task = asyncio.create_task(run(p, turn("x", n=500)))
    while not a0.active:
        await asyncio.sleep(0.005)
    await asyncio.sleep(0.05)
    p.remove_actor("a0", abort_in_flight=True)
    out, err = await asyncio.wait_for(task, 3)
    assert err is not None and err.code == grpc.StatusCode.UNAVAILABLE
    assert dict(err.trailing)["rollart-failed-actor"] == "a0"
    assert p.remove_actor("a0", abort_in_flight=True) is False  # idempotent


async def test_version_window_waits_for_an_admissible_actor(env):
    p, (a0,) = await env(1, version=3)
    p.set_window(pp.VersionWindow(min_version=4))
    out, err = await run(p, turn("t"))
    assert err is not None and err.code == grpc.StatusCode.UNAVAILABLE and "outside" in err.message
    # The actor reaches v4 while a turn waits: the status poll wakes it.
    task = asyncio.create_task(run(p, turn("t")))
    await asyncio.sleep(0.05)
    a0.version = 4
    out, err = await asyncio.wait_for(task, 3)
    assert err is None and out[0].route.actor_version == 4
    assert a0.requests[-1].min_version == 4  # the actor re-checks it
    with pytest.raises(TurnError):
        p.set_window(pp.VersionWindow(min_version=5, max_version=2))


async def test_actor_refusing_the_version_is_skipped(env):
    p, (a0, a1) = await env(2, version=2)
    p.router.stick("t", "a0")
    a0.version = 1  # the proxy has not polled yet: it still believes a0 is on 2
    out, err = await run(p, turn("t", min_version=2))
    assert err is None and out[0].route.actor_id == "a1" and out[0].route.reason == pp.ROUTE_REASON_RETRY


@pytest.mark.parametrize(
    "mutate, code",
    [
        (lambda r: r.ClearField("trajectory_id"), grpc.StatusCode.INVALID_ARGUMENT),
        (lambda r: r.input.ClearField("token_ids"), grpc.StatusCode.INVALID_ARGUMENT),
        (lambda r: setattr(r.input, "text", "both"), grpc.StatusCode.INVALID_ARGUMENT),
        (lambda r: setattr(r.sampling, "max_tokens", 0), grpc.StatusCode.INVALID_ARGUMENT),
        (lambda r: setattr(r.sampling, "top_p", 2.0), grpc.StatusCode.INVALID_ARGUMENT),
        (lambda r: r.input.token_ids.append(-4), grpc.StatusCode.INVALID_ARGUMENT),
        (lambda r: setattr(r, "trajectory_id", "x" * 300), grpc.StatusCode.INVALID_ARGUMENT),
        (lambda r: r.deadline.FromSeconds(1), grpc.StatusCode.DEADLINE_EXCEEDED),
    ],
)
async def test_bad_turns_are_refused_before_routing(env, mutate, code):
    p, (a0,) = await env(1)
    req = turn("t")
    mutate(req)
    out, err = await run(p, req)
    assert err is not None and err.code == code and not out
    assert not a0.requests


async def test_duplicate_request_id_and_no_actor_at_all(env):
    p, (a0,) = await env(1, delay=0.01)
    task = asyncio.create_task(run(p, turn("t", n=50, request_id="same")))
    while not a0.active:
        await asyncio.sleep(0.005)
    out, err = await run(p, turn("t", request_id="same"))
    assert err.code == grpc.StatusCode.ALREADY_EXISTS
    await task
    empty = Proxy(cfg())
    await empty.start()
    try:
        out, err = await run(empty, turn("t", task="math"))
        assert err.code == grpc.StatusCode.FAILED_PRECONDITION and "ever been registered" in err.message
    finally:
        await empty.stop()


async def test_affinity_settings_are_validated_and_merged(env):
    p, _ = await env(1)
    p.set_affinity([pp.AffinityRule(task="math", pool="p"), pp.AffinityRule(task="gem:*", pool="q")], merge=False)
    p.set_affinity([pp.AffinityRule(task="math", pool="z")], merge=True)
    table = {r.task: r.pool for r in p.affinity_table().rules}
    assert table == {"math": "z", "gem:*": "q"}
    for bad in (
        [pp.AffinityRule(task="")],
        [pp.AffinityRule(task="a*b")],
        [pp.AffinityRule(task="x"), pp.AffinityRule(task="x")],
    ):
        with pytest.raises(TurnError) as exc:
            p.set_affinity(bad, merge=True)
        assert exc.value.code == grpc.StatusCode.INVALID_ARGUMENT
    with pytest.raises(TurnError):
        p.set_pd([pp.PdPoolConfig(pool="p", prefill_actor_ids=["a"], decode_actor_ids=["a"])], merge=False)
    with pytest.raises(TurnError):
        p.set_pd([pp.PdPoolConfig(pool="p", kv_connector_config_json="{nope")], merge=False)


async def test_actor_that_stops_answering_is_marked_unhealthy_and_recovers(env):
    p, (a0, a1) = await env(2)
    await a0.kill()
    for _ in range(50):
        if p.router.actors["a0"].state == pp.PROXY_ACTOR_STATE_UNHEALTHY:
            break
        await asyncio.sleep(0.05)
    assert p.router.actors["a0"].state == pp.PROXY_ACTOR_STATE_UNHEALTHY
    assert p.status().healthy_actors == 1
    port = int(a0.address.rsplit(":", 1)[1])
    revived = await FakeActor("a0").start(port)
    try:
        for _ in range(100):
            if p.router.actors["a0"].state == pp.PROXY_ACTOR_STATE_HEALTHY:
                break
            await asyncio.sleep(0.05)
        assert p.router.actors["a0"].state == pp.PROXY_ACTOR_STATE_HEALTHY
    finally:
        await revived.kill()


async def test_hung_actor_turns_go_elsewhere_within_the_bound(env):
    # Polls never fail "enough" on their own: only the hang bound can act.
    conf = cfg(status_timeout_seconds=0.2, hung_after_seconds=1.0, unhealthy_after_failures=1000)
    p, (a0, a1) = await env(2, config=conf, delay=0.01)
    a0.hung = asyncio.Event()  # stopped: accepts, never answers
    p.router.stick("t", "a0")
    t0 = time.monotonic()
    out, err = await asyncio.wait_for(run(p, turn("t", n=5)), 10)
    took = time.monotonic() - t0
    assert err is None and len(tokens(out)) == 5
    assert out[0].route.actor_id == "a1" and out[0].route.reason == pp.ROUTE_REASON_RETRY
    bound = conf.hung_after_seconds + conf.status_timeout_seconds + conf.status_interval_seconds
    assert took < bound + 1.0, took
    assert p.router.actors["a0"].state == pp.PROXY_ACTOR_STATE_UNHEALTHY
    # It answers again: routable again.
    a0.hung.set()
    for _ in range(100):
        if p.router.actors["a0"].state == pp.PROXY_ACTOR_STATE_HEALTHY:
            break
        await asyncio.sleep(0.05)
    assert p.router.actors["a0"].state == pp.PROXY_ACTOR_STATE_HEALTHY


async def test_hung_actor_mid_stream_ends_the_turn_retryable_within_the_bound(env):
    conf = cfg(status_timeout_seconds=0.2, hung_after_seconds=1.0, unhealthy_after_failures=1000)
    p, (a0, a1) = await env(2, config=conf, delay=0.02)
    p.router.stick("t", "a0")
    task = asyncio.create_task(run(p, turn("t", n=500)))
    while len(a0.active) == 0:
        await asyncio.sleep(0.01)
    await asyncio.sleep(0.1)
    a0.hung = asyncio.Event()
    t0 = time.monotonic()
    out, err = await asyncio.wait_for(task, 10)
    assert time.monotonic() - t0 < conf.hung_after_seconds + conf.status_timeout_seconds + 1.5
    assert err is not None and err.code == grpc.StatusCode.UNAVAILABLE and err.retryable
    assert dict(err.trailing)["rollart-failed-actor"] == "a0" and tokens(out)
    a0.hung.set()


async def test_tokenize_on_a_hung_actor_moves_on_after_the_hang_bound(env):
    conf = cfg(status_timeout_seconds=0.2, hung_after_seconds=1.0, unhealthy_after_failures=1000)
    p, (a0, a1) = await env(2, config=conf)
    a0.hung = asyncio.Event()
    p.router.actors["a1"].outstanding_tokens = 10**6  # a0 looks least loaded: it is tried first
    t0 = time.monotonic()
    resp = await asyncio.wait_for(
        p.tokenize("", common_pb2.TokenizeRequest(input=common_pb2.ModelInput(text="hi")), timeout=10.0), 10
    )
    assert resp.token_ids and a1.tokenize_calls == 1
    assert time.monotonic() - t0 < conf.hung_after_seconds + 1.0
    a0.hung.set()


# ------------------------------------------------------------------------------- several jobs on one fleet


async def test_a_jobs_turns_go_to_the_actors_serving_it_and_carry_its_id(env):
    p, (a0, a1) = await env(2)
    a1.job_versions["job-b"] = 4
    await p.poll_once(p.router.actors["a1"], p.clients["a1"])
    assert p.router.actors["a1"].job_versions == {"job-b": 4} and p.router.actors["a1"].job_id == "own"
    for i in range(3):
        out, err = await run(p, turn(f"b{i}", job_id="job-b"))
        assert err is None and out[0].route.actor_id == "a1" and out[0].route.actor_version == 4
        assert {v for r in out for v in r.chunk.versions} == {4}
    assert all(r.job_id == "job-b" for r in a1.requests) and not a0.requests
    listed = {a.actor_id: a for a in p.list_actors()}
    assert dict(listed["a1"].job_versions) == {"job-b": 4}
    # A job no actor serves: no route (after the short route wait).
    out, err = await run(p, turn("c", job_id="job-c"))
    assert err is not None and "job-c" in err.details()


async def test_suspending_one_job_holds_its_turns_only(env):
    p, (a0,) = await env(1)
    a0.job_versions["job-b"] = 1
    await p.poll_once(p.router.actors["a0"], p.clients["a0"])
    state = p.suspend("update", 3, job="job-b")
    assert state.suspended and not p.admission_state().suspended
    held = asyncio.create_task(run(p, turn("b", job_id="job-b")))
    out, err = await run(p, turn("own"))  # the other job goes on
    assert err is None and tokens(out)
    await asyncio.sleep(0.1)
    assert not held.done()
    assert p.resume(job="job-b").released == 1
    out, err = await asyncio.wait_for(held, 5)
    assert err is None and out[0].route.admission_wait.ToNanoseconds() > 0
    # The fleet owner's Suspend (no job) holds the turns naming no job, not job-b's.
    p.suspend("update", 4)
    out, err = await asyncio.wait_for(run(p, turn("b2", job_id="job-b")), 5)
    assert err is None and tokens(out)
    p.resume()


async def test_a_bad_job_id_is_refused_naming_the_field(env):
    p, _ = await env(1)
    out, err = await run(p, turn("t", job_id="no spaces allowed"))
    assert err is not None and err.code == grpc.StatusCode.INVALID_ARGUMENT
    assert ("rollart-field", "job_id") in list(err.trailing)


async def test_a_full_fleet_holds_a_job_at_its_share_and_the_wait_is_measured(env):
    from prometheus_client import REGISTRY

    def waits() -> float:
        return REGISTRY.get_sample_value("rollart_llmproxy_share_wait_seconds_count", {"job": ""}) or 0.0

    p, (a0,) = await env(1, config=cfg(fleet_turn_slots=1), delay=0.01)
    before = waits()
    first = asyncio.create_task(run(p, turn("t1", n=20)))
    while not a0.active:
        await asyncio.sleep(0.005)
    second = asyncio.create_task(run(p, turn("t2", n=2)))
    await asyncio.sleep(0.05)
    assert not second.done() and not a0.requests[1:]  # the one slot is taken: the owner's turn waits
    (out1, err1), (out2, err2) = await asyncio.wait_for(asyncio.gather(first, second), 5)
    assert err1 is None and err2 is None and len(tokens(out2)) == 2
    assert out2[0].route.admission_wait.ToNanoseconds() > 0.05e9  # waited for the first turn to end
    assert waits() == before + 2
