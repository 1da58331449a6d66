"""Real processes for the envmanager loop tests: redis, rollart-ledger, rollart-reward and rollart-envmanager
(one or more), plus a generation server (the scripted test double, or the real proxy + actor)."""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from pathlib import Path

import grpc

from rollart.local.processes import start_redis
from rollart.v1 import common_pb2 as c
from rollart.v1 import envmanager_pb2 as em
from rollart.v1 import envmanager_pb2_grpc as emg
from rollart.v1 import ledger_pb2 as lp
from rollart.v1 import ledger_pb2_grpc as lg
from rollart.v1 import reward_pb2_grpc as rg
from tests.conftest import BIN, TOKEN, Services
from tests.integration.ledger.helpers import dur, h

MD = [("authorization", f"Bearer {TOKEN}")]
# User environments registered in every envmanager of these tests (importable by module path for the
# process backend): the misbehaving echo environment.
CUSTOM_ENVS = [
    {"id": "custom:echo", "factory": "tests.integration.envmanager.helper_envs:EchoEnv",
     "supported_backends": ["in_process", "process"], "default_backend": "process", "default_max_turns": 10,
     "options": {"sleep_s": "seconds the 'sleep' action sleeps"}},
]


@dataclass
class EnvManager:
    proc: object
    address: str
    stub: emg.EnvManagerStub
    channel: grpc.Channel
    metrics_port: int

    def status(self) -> em.EnvManagerStatus:
        return self.stub.GetStatus(em.EnvManagerStatusRequest(), metadata=MD, timeout=5)

    def start(self, group_id: str, environment: str, count: int = 1, **kw) -> em.LoopGroup:
        env = kw.pop("env", None) or env_spec(environment, **{k: kw.pop(k) for k in list(kw) if k in SPEC_KEYS})
        return self.stub.StartLoops(em.StartLoopsRequest(group_id=group_id, env=env, count=count, **kw),
                                    metadata=MD, timeout=10)

    def loops(self, group_id: str = "") -> list[em.LoopStatus]:
        return list(self.stub.ListLoops(em.ListLoopsRequest(group_id=group_id), metadata=MD, timeout=5).loops)

    def in_flight(self, group_id: str = "") -> list[em.TrajectoryInFlight]:
        return list(self.stub.ListTrajectories(em.ListTrajectoriesRequest(group_id=group_id), metadata=MD,
                                               timeout=5).trajectories)

    def stop(self, *group_ids: str, abort: bool = False, wait: bool = True) -> em.StopLoopsResponse:
        mode = em.LOOP_STOP_MODE_ABORT if abort else em.LOOP_STOP_MODE_GRACEFUL
        return self.stub.StopLoops(em.StopLoopsRequest(group_ids=list(group_ids), mode=mode, wait=wait), metadata=MD,
                                   timeout=30)


SPEC_KEYS = ("task", "max_turns", "latency", "sandbox", "options", "max_tokens", "reward", "max_context_tokens",
             "generation_timeout", "system_prompt", "interaction")


def env_spec(environment: str, *, task: str = "", max_turns: int = 0, latency: em.LatencyDistribution | None = None,
             sandbox: em.SandboxSpec | None = None, options: dict | None = None, max_tokens: int = 4096,
             reward: c.RewardSpec | None = None, max_context_tokens: int = 0, generation_timeout: float = 0,
             system_prompt: str = "", interaction: int = 0) -> em.EnvironmentSpec:
    spec = em.EnvironmentSpec(environment=environment, task=task, max_turns=max_turns, options=options or {},
                              sampling=c.SamplingParams(temperature=1.0, max_tokens=max_tokens),
                              max_context_tokens=max_context_tokens, system_prompt=system_prompt,
                              interaction=interaction)
    if latency is not None:
        spec.latency.CopyFrom(latency)
    if sandbox is not None:
        spec.sandbox.CopyFrom(sandbox)
    if reward is not None:
        spec.reward.CopyFrom(reward)
    if generation_timeout:
        spec.generation_timeout.CopyFrom(dur(generation_timeout))
    return spec


def constant_latency(seconds: float) -> em.LatencyDistribution:
    return em.LatencyDistribution(kind=em.DISTRIBUTION_KIND_CONSTANT, mean=dur(seconds))


@dataclass
class LoopCluster:
    """Redis + ledger + reward (+ envmanagers started on demand); the generation server is given."""

    tmp: Path
    proxy_address: str
    services: Services = field(init=False)
    ledger: lg.LedgerStub = field(init=False)
    reward: rg.RewardStub = field(init=False)
    managers: list[EnvManager] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.services = Services(self.tmp)
        self.redis_proc, self.redis_url = start_redis(self.tmp / "redis")
        self.channels: list[grpc.Channel] = []
        _, info = self.services.start("ledger", [str(BIN / "rollart-ledger")], ROLLART_REDIS_URL=self.redis_url,
                                      ROLLART_REAP_INTERVAL_SECONDS="0.05", ROLLART_POLL_INTERVAL_SECONDS="0.05")
        self.ledger_address = info["address"]
        self.ledger = lg.LedgerStub(self._channel(self.ledger_address))
        _, info = self.services.start(
            "reward", [str(BIN / "rollart-reward")], timeout=60, ROLLART_POOL__MAX_WORKERS="2",
            ROLLART_POOL__PRELOAD="[]", ROLLART_POOL__IDLE_TIMEOUT_SECONDS="60", ROLLART_GRACE_SECONDS="1")
        self.reward_address = info["address"]
        self.reward = rg.RewardStub(self._channel(self.reward_address))

    def _channel(self, address: str) -> grpc.Channel:
        ch = grpc.insecure_channel(address)
        self.channels.append(ch)
        return ch

    def policy(self, job: str = "job-env", **kw) -> lp.JobPolicy:
        kw.setdefault("buffer_capacity", 100_000)
        kw.setdefault("group_size", 2)
        durations = {k: dur(kw.pop(k)) for k in list(kw) if k.endswith("_ttl")}
        return self.ledger.SetJobPolicy(lp.SetJobPolicyRequest(policy=lp.JobPolicy(job_id=job, **kw, **durations)),
                                        metadata=MD, timeout=10)

    def version(self, v: int) -> None:
        pv = c.PolicyVersion(version=v, base_version=v - 1, hash=h(v))
        self.ledger.RegisterVersion(lp.RegisterVersionRequest(version=pv), metadata=MD, timeout=10)

    def prompts(self, task: str, n: int, *, prefix: str, group_size: int = 2, redundancy: int = 0,
                seeds: list[int] | None = None, **prompt_kw) -> list[str]:
        ps = [lp.Prompt(prompt_id=f"{prefix}{i}", task=task, seed=(seeds[i] if seeds else i), **prompt_kw)
              for i in range(n)]
        resp = self.ledger.AddPrompts(lp.AddPromptsRequest(prompts=ps, group_size=group_size, redundancy=redundancy),
                                      metadata=MD, timeout=10)
        return list(resp.group_ids)

    def envmanager(self, name: str = "envmanager", manager_id: str = "", **env: str) -> EnvManager:
        env.setdefault("ROLLART_LEDGER", self.ledger_address)
        env.setdefault("ROLLART_REWARD", self.reward_address)
        env.setdefault("ROLLART_LLMPROXY", self.proxy_address)
        env.setdefault("ROLLART_LEASE_WAIT_SECONDS", "0.5")
        env.setdefault("ROLLART_GRACE_SECONDS", "2")
        env.setdefault("ROLLART_ENVIRONMENTS", json.dumps(CUSTOM_ENVS))
        if manager_id:
            env["ROLLART_MANAGER_ID"] = manager_id
        proc, info = self.services.start(name, [str(BIN / "rollart-envmanager")], timeout=60, **env)
        ch = self._channel(info["address"])
        mgr = EnvManager(proc, info["address"], emg.EnvManagerStub(ch), ch, info["metrics_port"])
        self.managers.append(mgr)
        return mgr

    def leases(self, **kw) -> list[lp.Lease]:
        out, token = [], ""
        while True:
            resp = self.ledger.ListLeases(lp.ListLeasesRequest(page_size=1000, page_token=token, **kw), metadata=MD,
                                          timeout=10)
            out += resp.leases
            token = resp.next_page_token
            if not token:
                return out

    def status(self) -> lp.LedgerStatus:
        return self.ledger.GetStatus(lp.LedgerStatusRequest(), metadata=MD, timeout=10)

    def batch(self, step: int, size: int, wait: float = 60.0) -> lp.Batch:
        return self.ledger.GetBatch(lp.GetBatchRequest(step=step, batch_size=size, wait=dur(wait)), metadata=MD,
                                    timeout=wait + 10)

    def close(self) -> None:
        for ch in self.channels:
            ch.close()
        self.services.stop_all()
        self.redis_proc.stop()


def wait_until(pred, timeout: float = 30.0, interval: float = 0.05, what: str = "condition"):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = pred()
        if value:
            return value
        time.sleep(interval)
    value = pred()
    assert value, f"{what} not reached within {timeout}s"
    return value
