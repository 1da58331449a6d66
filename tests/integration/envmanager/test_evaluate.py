"""EnvManager.Evaluate (issue 25: validation during training) with real processes: redis, rollart-ledger,
rollart-reward and rollart-envmanager; generation by the scripted generation server (scripted_proxy.py).

Held-out FrozenLake maps, n samples each, scored by the reward service: mean@n and pass@n, tokens and versions
reported apart; the ledger never sees a lease or a sample of it; bad requests are INVALID_ARGUMENT naming the
field; and an envmanager SIGKILLed mid-evaluation: the job's Validator retries on the replacement (or reports
the evaluation failed with its cause when none comes back) and returns, so the job goes on.
"""

from __future__ import annotations

import asyncio
import os
import signal
import threading

import grpc
import pytest

from rollart.job.evaluation import EvalPrompt, EvalTask, Validator, eval_rows
from rollart.v1 import common_pb2 as c
from rollart.v1 import envmanager_pb2 as em
from tests.conftest import TOKEN

from . import players
from .loop_cluster import MD, LoopCluster, env_spec, wait_until
from .scripted_proxy import ScriptedProxy

LAKE = "gymnasium:FrozenLake-v1"
SOLVED = "SFFF,FHFF,FFFH,FFFG"  # the scripted player walks the shortest path to G
STUCK = "SFFH,FHFF,FFFH,HFFG"  # on this map the test's player only ever answers "left" (never reaches G)


def lake_player(chat) -> str:
    first = next((text for role, text in chat if role == "user"), "")
    if "P F F H" in first:
        return "left"
    return players.frozen_lake(chat)


@pytest.fixture(scope="module")
def proxy():
    p = ScriptedProxy({"val-lake": lake_player, "slow-lake": lake_player, "*": players.echo}, token=TOKEN).start()
    p.version = 3
    yield p
    p.stop()


@pytest.fixture(scope="module")
def cluster(tmp_path_factory, proxy):
    cl = LoopCluster(tmp_path_factory.mktemp("envmanager-evaluate"), proxy.address)
    try:
        cl.policy(job="job-eval", alpha=1)
        cl.main = cl.envmanager(manager_id="em-eval")
        yield cl
    finally:
        cl.close()


def lake(task: str, temperature: float = 1.0) -> em.EnvironmentSpec:
    spec = env_spec(LAKE, task=task, max_turns=8, max_tokens=32)
    spec.sampling.temperature = temperature
    return spec


def evaluate(stub, **kw) -> em.EvaluateResponse:
    return stub.Evaluate(em.EvaluateRequest(**kw), metadata=MD, timeout=120)


def test_held_out_prompts_are_scored_outside_the_ledger(cluster, proxy):
    before = cluster.status()
    leases_before = len(cluster.leases())
    prompts = [em.EvalPrompt(seed=0, options={"desc": SOLVED}), em.EvalPrompt(seed=1, options={"desc": STUCK})]
    resp = evaluate(cluster.main.stub, evaluation_id="v-1", env=lake("val-lake"), prompts=prompts,
                    samples_per_prompt=3, concurrency=4)
    assert (resp.evaluation_id, resp.task, resp.prompts, resp.samples_per_prompt) == ("v-1", "val-lake", 2, 3)
    assert (resp.episodes_scored, resp.episodes_failed) == (6, 0), resp.failures_by_cause
    assert resp.mean_at_n == pytest.approx(0.5) and resp.pass_at_n == pytest.approx(0.5)
    assert (resp.min_version, resp.max_version) == (3, 3)  # whatever version the actors serve now
    assert resp.tokens_generated > 0 and resp.prompt_tokens > 0 and resp.elapsed.ToNanoseconds() > 0
    eps = sorted(resp.episodes, key=lambda e: (e.prompt_index, e.sample))
    assert [(e.prompt_index, e.sample) for e in eps] == [(0, 0), (0, 1), (0, 2), (1, 0), (1, 1), (1, 2)]
    assert [e.reward for e in eps] == [1.0, 1.0, 1.0, 0.0, 0.0, 0.0]
    assert [e.passed for e in eps] == [True] * 3 + [False] * 3
    assert all(e.trajectory_id.startswith("eval-v-1-p") and e.status == c.TRAJECTORY_STATUS_OK for e in eps)
    assert sum(e.tokens_generated for e in eps) == resp.tokens_generated
    assert eps[3].turns == 8  # the stuck player used every turn
    # no lease, no sample, no settlement: the ledger saw nothing of it
    after = cluster.status()
    assert len(cluster.leases()) == leases_before
    assert after.buffer.samples == before.buffer.samples and after.settlement.admitted == before.settlement.admitted
    # the proxy saw greedy sampling when asked
    resp = evaluate(cluster.main.stub, env=lake("val-lake", temperature=0.0), prompts=prompts[:1],
                    samples_per_prompt=1, pass_threshold=0.5)
    assert resp.pass_at_n == 1.0 and resp.evaluation_id.startswith("e")


@pytest.mark.parametrize("kw, field", [
    (dict(prompts=[]), "prompts"),
    (dict(samples_per_prompt=0), "samples_per_prompt"),
    (dict(samples_per_prompt=65), "samples_per_prompt"),
    (dict(prompts=[em.EvalPrompt(seed=i) for i in range(1025)]), "prompts"),
    (dict(prompts=[em.EvalPrompt(seed=i) for i in range(1000)], samples_per_prompt=8), "samples_per_prompt"),
    (dict(env=env_spec("nope:nothing")), "env"),
    (dict(env=em.EnvironmentSpec()), "env.environment"),
    (dict(prompts=[em.EvalPrompt(options={"bogus": "1"})]), "prompts[0].options"),
    (dict(prompts=[em.EvalPrompt(options={"desc\x1b": "x"})]), "prompts[0].options"),
    (dict(concurrency=1000), "concurrency"),
    (dict(evaluation_id="has space"), "evaluation_id"),
])  # fmt: skip
def test_bad_requests_name_the_field(cluster, kw, field):
    req = dict(env=lake("val-lake"), prompts=[em.EvalPrompt(seed=0, options={"desc": SOLVED})], samples_per_prompt=1)
    req.update(kw)
    with pytest.raises(grpc.RpcError) as err:
        evaluate(cluster.main.stub, **req)
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert err.value.details().startswith(field), err.value.details()


def _validate_in_thread(v: Validator, et: EvalTask) -> tuple[threading.Thread, list]:
    out: list = []
    t = threading.Thread(target=lambda: out.append(asyncio.run(v.evaluate(et, 5, 1234.0))), daemon=True)
    t.start()
    return t, out


def test_envmanager_killed_mid_evaluation_is_retried_on_its_replacement(cluster, proxy, tmp_path):
    proxy.task_delay["slow-lake"] = 0.03  # ~0.3 s a turn: the kill lands mid-evaluation
    victim = cluster.envmanager("victim", manager_id="em-victim")
    where = {"envmanager": victim.address}
    et = EvalTask("slow-lake", lake("slow-lake"), [EvalPrompt(0, {"desc": SOLVED})], samples=4, retries=2,
                  timeout=60)
    v = Validator([et], "job-eval", tmp_path / "metrics.jsonl", lambda name: where.get(name), TOKEN,
                  retry_pause=1.0)
    thread, out = _validate_in_thread(v, et)
    wait_until(lambda: any(x.trajectory_id.startswith("eval-job-eval-slow-lake-s5-a0") and x.turns >= 1
                           for x in victim.in_flight()), timeout=30, what="the evaluation mid-episode")
    os.kill(victim.proc.pid, signal.SIGKILL)
    victim.proc.proc.wait(5)
    where["envmanager"] = cluster.envmanager("replacement", manager_id="em-replacement").address
    thread.join(120)
    (row,) = out
    assert not row["failed"] and row["attempts"] >= 2, row
    assert row["score"] == 1.0 and row["episodes_scored"] == 4 and row["eval_step"] == 5
    assert "UNAVAILABLE" in row["retried"][0] or "CANCELLED" in row["retried"][0], row["retried"]
    assert eval_rows(tmp_path / "metrics.jsonl") == [row]
    proxy.task_delay.pop("slow-lake")


def test_envmanager_gone_for_good_reports_the_evaluation_failed(cluster, proxy, tmp_path):
    proxy.task_delay["slow-lake"] = 0.03
    victim = cluster.envmanager("victim-2", manager_id="em-victim-2")
    et = EvalTask("slow-lake", lake("slow-lake"), [EvalPrompt(0, {"desc": SOLVED})], samples=2, retries=1,
                  timeout=30)
    said: list[str] = []
    v = Validator([et], "job-eval", tmp_path / "metrics.jsonl", lambda _n: victim.address, TOKEN, say=said.append,
                  retry_pause=0.5)
    thread, out = _validate_in_thread(v, et)
    wait_until(lambda: any(x.turns >= 1 for x in victim.in_flight()), timeout=30, what="the evaluation mid-episode")
    os.kill(victim.proc.pid, signal.SIGKILL)
    victim.proc.proc.wait(5)
    thread.join(120)
    (row,) = out
    assert row["failed"] and row["attempts"] == 2 and row["score"] is None
    assert "attempt 1" in row["error"] and "attempt 2: UNAVAILABLE" in row["error"], row["error"]
    assert "FAILED after 2 attempt(s)" in said[0]
    proxy.task_delay.pop("slow-lake")
