"""Manager.score_orphans on its own (fake ledger and reward stubs): a restarted envmanager scores the samples its
killed predecessor admitted but never scored, once each, and tells the ledger of those it cannot score."""

from __future__ import annotations

import asyncio

import grpc
from grpc import aio

from rollart.v1 import common_pb2
from rollart.v1 import ledger_pb2 as lp
from rollart.v1 import reward_pb2 as rp
from rollart_envmanager.manager import Manager
from tests.unit.envmanager.conftest import builtin_group, fake_manager

MATH = common_pb2.RewardSpec(kind=common_pb2.SCORER_KIND_MATH)


class FakeLedger:
    def __init__(self, samples: list[lp.UnscoredSample], failures: list[grpc.StatusCode] = ()) -> None:
        self.samples = samples
        self.failures = list(failures)
        self.asked: list[lp.ListUnscoredRequest] = []
        self.recorded: list[lp.RecordRewardRequest] = []

    async def ListUnscored(self, request: lp.ListUnscoredRequest, timeout: float) -> lp.ListUnscoredResponse:
        asked = lp.ListUnscoredRequest()
        asked.CopyFrom(request)
        self.asked.append(asked)
        if self.failures:
            raise aio.AioRpcError(self.failures.pop(0), aio.Metadata(), aio.Metadata(), details="not now")
        # two samples a page; the token is the index of the next one
        at = int(request.page_token or 0)
        more = at + 2 < len(self.samples)
        return lp.ListUnscoredResponse(samples=self.samples[at : at + 2], next_page_token=str(at + 2) if more else "")

    async def RecordReward(self, request: lp.RecordRewardRequest, timeout: float) -> lp.RecordRewardResponse:
        self.recorded.append(request)
        return lp.RecordRewardResponse(recorded=True, reward=request.reward.reward)


class FakeReward:
    def __init__(self) -> None:
        self.requests: list[rp.ScoreRequest] = []

    async def Score(self, request: rp.ScoreRequest, timeout: float) -> rp.ScoreResult:
        self.requests.append(request)
        tid = request.trajectory.trajectory_id
        return rp.ScoreResult(
            trajectory_id=tid,
            status=rp.SCORE_STATUS_OK,
            outcome=common_pb2.RewardOutcome(trajectory_id=tid, reward=0.5),
        )


def sample(tid: str, holder: str = "em-1/g/0", environment: str = "") -> lp.UnscoredSample:
    prompt = lp.Prompt(prompt_id=f"p-{tid}", environment=environment, reward=MATH)
    lease = lp.Lease(lease_id=f"L-{tid}", holder=holder, trajectory_id=tid, prompt=prompt, state=lp.LEASE_STATE_SETTLED)
    traj = common_pb2.Trajectory(trajectory_id=tid, lease_id=lease.lease_id, status=common_pb2.TRAJECTORY_STATUS_OK)
    return lp.UnscoredSample(lease=lease, trajectory=traj)


async def orphans(ledger: FakeLedger, reward: FakeReward, own: tuple[str, ...] = ()) -> tuple[int, Manager]:
    m = fake_manager(ledger, reward, settle_retry_seconds=5)
    m.recording.update(own)
    group = builtin_group(m, ["code"])
    try:
        n = await m.score_orphans(group)
        while m._tasks:
            await asyncio.wait(list(m._tasks), timeout=5)
    finally:
        m.executor.shutdown(wait=False)
    return n, m


def test_scores_each_orphan_once_with_its_trajectory_and_prompt_spec_and_skips_its_own():
    ledger, reward = FakeLedger([sample("ta"), sample("tb"), sample("tc", holder="em-1/g/3")]), FakeReward()
    n, m = asyncio.run(orphans(ledger, reward, own=("tb",)))
    assert n == 2
    assert [(r.holder_prefix, r.page_token) for r in ledger.asked] == [("em-1/g/", ""), ("em-1/g/", "2")]
    assert [r.trajectory.trajectory_id for r in reward.requests] == ["ta", "tc"]
    assert all(r.spec == MATH for r in reward.requests)
    assert [(r.trajectory_id, r.failed, r.reward.reward) for r in ledger.recorded] == [
        ("ta", False, 0.5),
        ("tc", False, 0.5),
    ]
    assert m.recording == {"tb"} and m.rewards_pending == 0


def test_a_sample_it_cannot_score_is_reported_failed_so_the_ledger_repools_it():
    ledger, reward = FakeLedger([sample("ta", environment="no-such-env")]), FakeReward()
    n, m = asyncio.run(orphans(ledger, reward))
    assert n == 1 and reward.requests == []
    [rec] = ledger.recorded
    assert rec.trajectory_id == "ta" and rec.failed and "env-unavailable" in rec.failure_cause
    assert m.recording == set()


def test_asks_again_while_the_ledger_is_unreachable_and_gives_up_on_a_refusal():
    ledger, reward = FakeLedger([sample("ta")], failures=[grpc.StatusCode.UNAVAILABLE]), FakeReward()
    n, _ = asyncio.run(orphans(ledger, reward))
    assert n == 1 and len(ledger.asked) == 2 and [r.trajectory_id for r in ledger.recorded] == ["ta"]
    old = FakeLedger([sample("ta")], failures=[grpc.StatusCode.UNIMPLEMENTED])  # a ledger without ListUnscored
    n, _ = asyncio.run(orphans(old, reward))
    assert n == 0 and len(old.asked) == 1 and old.recorded == []
