"""Batch-level ("lockstep") interaction against trajectory-level, with real processes (redis, rollart-ledger,
rollart-reward, rollart-envmanager), the scripted generation server and a reward recorder in front of the real
reward service.

The environment (helper_envs.StepLogEnv) logs the wall-clock end of every step; steps of odd seeds are slow,
episodes have 2 to 4 turns, and the loops inject a constant latency after every step. In BATCH mode no
generation of turn k+1 may reach the proxy before every episode of its wave finished step k, and no reward
request before the wave's last episode ended; in TRAJECTORY mode fast loops run ahead (the same checks fail).
"""

from __future__ import annotations

import json
import re
import threading
import time
from collections import defaultdict
from concurrent import futures
from dataclasses import dataclass, field
from pathlib import Path

import grpc
import pytest

from rollart.v1 import envmanager_pb2 as em
from rollart.v1 import ledger_pb2 as lp
from rollart.v1 import reward_pb2_grpc as rg
from tests.conftest import TOKEN

from . import players
from .loop_cluster import CUSTOM_ENVS, MD, LoopCluster, constant_latency, wait_until
from .scripted_proxy import ScriptedProxy

# The environment that logs its steps, registered in this module's envmanager only.
STEPLOG = {"id": "custom:steplog", "factory": "tests.integration.envmanager.helper_envs:StepLogEnv",
           "supported_backends": ["in_process"], "default_backend": "in_process", "default_max_turns": 100,
           "options": {"log": "file the resets and steps are logged to",
                       "slow_s": "seconds a step of an odd seed takes"}}
ID = re.compile(r"id=([0-9a-f]{12})")
LOOPS = 4
SLOW_S = 0.3


class RewardRecorder(rg.RewardServicer):
    """Records when each trajectory's Score call arrives, then forwards it to the real reward service."""

    def __init__(self, target: str) -> None:
        self.channel = grpc.insecure_channel(target)
        self.real = rg.RewardStub(self.channel)
        self.lock = threading.Lock()
        self.calls: list[tuple[float, str]] = []  # (wall clock, first observation)
        self.server = grpc.server(futures.ThreadPoolExecutor(16))
        rg.add_RewardServicer_to_server(self, self.server)
        self.address = f"127.0.0.1:{self.server.add_insecure_port('127.0.0.1:0')}"
        self.server.start()

    def Score(self, request, context):
        with self.lock:
            self.calls.append((time.time(), request.trajectory.turns[0].observation if request.trajectory.turns
                               else ""))
        return self.real.Score(request, metadata=MD, timeout=context.time_remaining())

    def stop(self) -> None:
        self.server.stop(0)
        self.channel.close()


@pytest.fixture(scope="module")
def proxy():
    p = ScriptedProxy({"*": players.echo}, token=TOKEN).start()
    p.version = 1
    yield p
    p.stop()


@pytest.fixture(scope="module")
def cluster(tmp_path_factory, proxy):
    cl = LoopCluster(tmp_path_factory.mktemp("envmanager-interaction"), proxy.address)
    recorder = RewardRecorder(cl.reward_address)
    try:
        cl.policy(alpha=1, initial_lease_ttl=5, min_lease_ttl=3, max_lease_ttl=5, max_lease_attempts=10)
        cl.version(0)
        cl.version(1)
        cl.recorder = recorder
        cl.main = cl.envmanager(manager_id="em-interaction", ROLLART_REWARD=recorder.address,
                                ROLLART_LEASE_WAIT_SECONDS="0.3", ROLLART_ENVIRONMENTS=json.dumps(CUSTOM_ENVS + [STEPLOG]))
        yield cl
    finally:
        cl.close()
        recorder.stop()


@dataclass
class Timeline:
    """What happened to every episode (by the id its environment gave it), in wall-clock seconds."""

    reset: dict[str, float] = field(default_factory=dict)
    steps: dict[str, list[float]] = field(default_factory=lambda: defaultdict(list))  # end of step 1, 2, ...
    generations: list[tuple[float, str, int]] = field(default_factory=list)  # (arrival, episode, turn)
    rewards: list[tuple[float, str]] = field(default_factory=list)

    def end(self, uid: str) -> float:
        return self.steps[uid][-1]

    def waves(self) -> list[set[str]]:
        """Episodes whose lifetimes (reset to last step) overlap, transitively: the waves of a batch group."""
        out: list[set[str]] = []
        last_end = -1.0
        for uid in sorted(self.reset, key=self.reset.get):
            if out and self.reset[uid] < last_end:
                out[-1].add(uid)
            else:
                out.append({uid})
            last_end = max(last_end, self.end(uid))
        return out

    def violations(self) -> tuple[list[str], list[str]]:
        """(generations of turn k that came before a step k of an episode of their wave ended,
        reward requests that came before an episode of their wave ended)."""
        wave_of = {uid: i for i, w in enumerate(self.waves()) for uid in w}
        waves = self.waves()
        turns, rewards = [], []
        for t, uid, turn in self.generations:
            for other in waves[wave_of[uid]]:
                if turn and len(self.steps[other]) >= turn and self.steps[other][turn - 1] > t:
                    turns.append(f"{uid} turn {turn} at {t:.3f} before {other} step {turn} "
                                 f"ended at {self.steps[other][turn - 1]:.3f}")
        for t, uid in self.rewards:
            late = [o for o in waves[wave_of[uid]] if self.end(o) > t]
            if late:
                rewards.append(f"reward of {uid} at {t:.3f} before {late} ended")
        return turns, rewards


def timeline(log: Path, proxy: ScriptedProxy, recorder: RewardRecorder) -> Timeline:
    tl = Timeline()
    for line in log.read_text().splitlines():
        what, uid, _turn, _done, t = line.split()
        if what == "reset":
            tl.reset[uid] = float(t)
        else:
            tl.steps[uid].append(float(t))
    for t, _tid, turn, first in list(proxy.arrivals):
        m = ID.search(first)
        if m and m.group(1) in tl.reset:
            tl.generations.append((t, m.group(1), turn))
    for t, obs in list(recorder.calls):
        m = ID.search(obs)
        if m and m.group(1) in tl.reset:
            tl.rewards.append((t, m.group(1)))
    return tl


def run_group(cluster: LoopCluster, proxy: ScriptedProxy, tmp_path: Path, name: str, interaction: int
              ) -> tuple[Timeline, list[em.LoopStatus]]:
    """LOOPS loops, two trajectories each (two waves in BATCH mode), until all settled and scored."""
    log = tmp_path / f"{name}.log"
    log.touch()
    # seeds 0..3: each prompt's two samples share a seed; slow and fast, short and long episodes in every wave
    cluster.prompts(name, LOOPS, prefix=f"{name}-", group_size=2)
    cluster.main.start(name, "custom:steplog", count=LOOPS, task=name, interaction=interaction,
                       options={"log": str(log), "slow_s": str(SLOW_S)}, latency=constant_latency(0.05),
                       sandbox=em.SandboxSpec(backend=em.SANDBOX_BACKEND_IN_PROCESS), max_trajectories_per_loop=2)
    loops = wait_until(lambda: (lambda ls: ls if all(lo.state == em.LOOP_STATE_STOPPED for lo in ls) else None)(
        cluster.main.loops(name)), timeout=40, what=f"{name}: every loop done")
    wait_until(lambda: cluster.main.status().rewards_pending == 0, timeout=10, what="rewards recorded")
    return timeline(log, proxy, cluster.recorder), loops


def test_batch_mode_runs_turns_and_reward_in_lockstep(cluster, proxy, tmp_path):
    tl, loops = run_group(cluster, proxy, tmp_path, "lockstep", em.INTERACTION_MODE_BATCH)
    assert sum(lo.counters.admitted for lo in loops) == 2 * LOOPS, [lo.last_error for lo in loops]
    waves = tl.waves()
    assert [len(w) for w in waves] == [LOOPS, LOOPS], waves  # two waves of every loop, one after the other
    assert len(tl.rewards) == 2 * LOOPS and len(tl.generations) >= 2 * LOOPS * 2
    turns, rewards = tl.violations()
    assert not turns, turns[:5]
    assert not rewards, rewards[:5]
    # not vacuous: fast episodes did wait for the slow ones' steps before their next turn
    waited = [t - tl.steps[uid][turn - 1] for t, uid, turn in tl.generations if turn]
    assert max(waited) > SLOW_S * 0.8, waited
    # the next wave started only after the last trajectory of the first one was scored
    assert min(tl.reset[u] for u in waves[1]) > max(t for t, u in tl.rewards if u in waves[0])


def test_trajectory_mode_does_not_wait(cluster, proxy, tmp_path):
    tl, loops = run_group(cluster, proxy, tmp_path, "free", em.INTERACTION_MODE_TRAJECTORY)
    assert sum(lo.counters.admitted for lo in loops) == 2 * LOOPS, [lo.last_error for lo in loops]
    turns, rewards = tl.violations()
    # fast loops generate their next turn and ask for reward while slow ones still step: the checks above fail
    assert turns and rewards


def test_abort_in_the_middle_of_a_batch_wave_ends_every_loop(cluster, proxy, tmp_path):
    name = "lockstep-abort"
    log = tmp_path / f"{name}.log"
    log.touch()
    cluster.prompts(name, 3, prefix=f"{name}-", group_size=2, seeds=[1, 2, 3])
    cluster.main.start(name, "custom:steplog", count=3, task=name, interaction=em.INTERACTION_MODE_BATCH,
                       options={"log": str(log), "slow_s": "5"},
                       sandbox=em.SandboxSpec(backend=em.SANDBOX_BACKEND_IN_PROCESS))
    # the fast episodes are through their first step and wait at the barrier for the slow ones' 5 s steps
    wait_until(lambda: sum(1 for line in log.read_text().splitlines() if line.startswith("step")) >= 1,
               timeout=15, what="a step done")
    flight = [x for x in cluster.main.in_flight(name)]
    assert len(flight) == 3 and all(x.state in (em.LOOP_STATE_STEPPING, em.LOOP_STATE_GENERATING) for x in flight)
    t0 = time.monotonic()
    resp = cluster.main.stop(name, abort=True)
    assert resp.stopped and time.monotonic() - t0 < 5, resp
    loops = cluster.main.loops(name)
    assert all(lo.state == em.LOOP_STATE_STOPPED and lo.counters.cancelled == 1 for lo in loops), loops
    leases = [le for le in cluster.leases() if le.prompt.task == name]
    assert leases and all(le.state != lp.LEASE_STATE_ACTIVE for le in leases)
