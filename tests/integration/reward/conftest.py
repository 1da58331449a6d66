"""Fixtures for the reward service: the service as a real process, a fake LLMProxy, metrics scraping."""

from __future__ import annotations

import json
import time
import urllib.request
from collections.abc import Iterator
from concurrent import futures
from dataclasses import dataclass, field

import grpc
import pytest

from rollart.v1 import common_pb2 as c
from rollart.v1 import llmproxy_pb2, llmproxy_pb2_grpc, reward_pb2, reward_pb2_grpc
from tests.conftest import BIN, TOKEN, Services

CUSTOM = json.dumps(
    {
        "sleepy": "tests.integration.reward.scorers:sleepy",
        "crashy": "tests.integration.reward.scorers:crashy",
        "whoami": "tests.integration.reward.scorers:whoami",
    }
)


@dataclass
class Reward:
    proc: object
    address: str
    metrics_port: int
    pid: int
    stub: reward_pb2_grpc.RewardStub
    md: list

    def status(self) -> reward_pb2.RewardPoolStatus:
        return self.stub.GetPoolStatus(reward_pb2.RewardPoolStatusRequest(), metadata=self.md, timeout=5)

    def metrics(self) -> dict[str, float]:
        """Samples of the rollart_reward_* metrics, keyed like 'rollart_reward_workers{state="idle"}'."""
        text = urllib.request.urlopen(f"http://127.0.0.1:{self.metrics_port}/metrics", timeout=5).read().decode()
        out = {}
        for line in text.splitlines():
            if line.startswith("rollart_reward_"):
                key, _, value = line.rpartition(" ")
                out[key] = float(value)
        return out

    def wait_for(self, predicate, timeout: float = 15.0, what: str = "condition"):
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            st = self.status()
            if predicate(st):
                return st
            time.sleep(0.05)
        raise AssertionError(f"{what} not reached in {timeout}s; pool: {self.status()}")


def start_reward(services: Services, channel, **env: str) -> Reward:
    env.setdefault("ROLLART_CUSTOM_SCORERS", CUSTOM)
    env.setdefault("ROLLART_GRACE_SECONDS", "2")
    proc, info = services.start("reward", [str(BIN / "rollart-reward")], timeout=60, **env)
    stub = reward_pb2_grpc.RewardStub(channel(info["address"]))
    return Reward(
        proc, info["address"], info["metrics_port"], info["pid"], stub, [("authorization", f"Bearer {TOKEN}")]
    )


def traj(tid: str, action: str, task: str = "math", **metadata: str) -> c.Trajectory:
    return c.Trajectory(
        trajectory_id=tid,
        task=task,
        turns=[c.Turn(observation="question", action=action)],
        metadata=metadata,
        status=c.TRAJECTORY_STATUS_OK,
    )


def custom(tid: str, scorer: str, **options: str) -> reward_pb2.ScoreRequest:
    return reward_pb2.ScoreRequest(
        trajectory=traj(tid, "x", task="custom"),
        spec=c.RewardSpec(kind=c.SCORER_KIND_CUSTOM, scorer=scorer, options=options),
    )


@dataclass
class FakeProxy:
    """A stand-in LLMProxy: answers Generate with a fixed reply, records the requests and their metadata."""

    reply: str = "The response agrees with the reference.\nVERDICT: CORRECT"
    requests: list = field(default_factory=list)
    metadata: list = field(default_factory=list)
    address: str = ""


class _Servicer(llmproxy_pb2_grpc.LLMProxyServicer):
    def __init__(self, fake: FakeProxy) -> None:
        self.fake = fake

    def Generate(self, request, context):
        self.fake.requests.append(request)
        self.fake.metadata.append(dict(context.invocation_metadata()))
        yield llmproxy_pb2.TrajectoryGenerateResponse(route=llmproxy_pb2.RouteInfo(actor_id="judge-actor"))
        text = self.fake.reply
        half = len(text) // 2
        yield llmproxy_pb2.TrajectoryGenerateResponse(chunk=c.GenerationChunk(text=text[:half], token_ids=[1]))
        yield llmproxy_pb2.TrajectoryGenerateResponse(
            chunk=c.GenerationChunk(text=text[half:], token_ids=[2], finish_reason=c.FINISH_REASON_STOP)
        )


@pytest.fixture(scope="module")
def fake_proxy() -> Iterator[FakeProxy]:
    fake = FakeProxy()
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
    llmproxy_pb2_grpc.add_LLMProxyServicer_to_server(_Servicer(fake), server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    fake.address = f"127.0.0.1:{port}"
    yield fake
    server.stop(0)


@pytest.fixture(scope="module")
def module_services(tmp_path_factory) -> Iterator[Services]:
    s = Services(tmp_path_factory.mktemp("reward"))
    yield s
    s.stop_all()


@pytest.fixture(scope="module")
def module_channel() -> Iterator:
    opened = []

    def make(address: str) -> grpc.Channel:
        ch = grpc.insecure_channel(address)
        opened.append(ch)
        return ch

    yield make
    for ch in opened:
        ch.close()
