"""Loop._settle when the Submit gets no answer: the ledger may have applied it (the reply was lost). The loop's
release of the lease makes the lease final and tells which: an admission is scored at once, exactly once, rather
than waiting for the ledger's score deadline; anything else records no reward.

The ledger here is its real scripts on a real redis-server (the fixtures of tests/unit/ledger) behind an
in-process stand-in for its gRPC stub, which can lose a Submit's reply or hold the request back."""

from __future__ import annotations

import asyncio
import time
from types import SimpleNamespace

import grpc
from grpc import aio

from rollart.v1 import common_pb2
from rollart.v1 import ledger_pb2 as lp
from rollart.v1 import reward_pb2 as rp
from rollart_envmanager.episode import Episode
from rollart_envmanager.ledger_batch import LedgerBatcher
from rollart_envmanager.loop import Loop
from rollart_envmanager.manager import Manager
from rollart_ledger import validators
from rollart_ledger.settlement import Settlement
from tests.integration.ledger.helpers import h, trajectory
from tests.unit.envmanager.conftest import builtin_group, fake_manager
from tests.unit.ledger import conftest as lua
from tests.unit.ledger.conftest import Store

lua_redis_url, store = lua.lua_redis_url, lua.store  # the fixtures of tests/unit/ledger

MATH = common_pb2.RewardSpec(kind=common_pb2.SCORER_KIND_MATH)
HOLDER = "em-1/g/0"


def rpc_error(code: grpc.StatusCode) -> aio.AioRpcError:
    return aio.AioRpcError(code, aio.Metadata(), aio.Metadata(), details="lost")


class Ledger:
    """The ledger's stub over its scripts. ``lose``: "reply" applies each Submit and loses its reply; "request"
    holds it back (``held``, to land later) and answers DEADLINE_EXCEEDED. ``down``: nothing answers."""

    def __init__(self, scripts_store: Store) -> None:
        self.store = scripts_store
        self.lose = ""
        self.down = False
        self.held: list[lp.SubmitRequest] = []
        self.releases: list[lp.ReleaseLeaseRequest] = []
        self.rewards: list[tuple[lp.RecordRewardRequest, lp.RecordRewardResponse]] = []

    async def SubmitBatch(self, request: lp.SubmitBatchRequest, timeout: float) -> lp.SubmitBatchResponse:
        if self.down:
            raise rpc_error(grpc.StatusCode.UNAVAILABLE)
        if self.lose == "request":
            self.held += request.submissions
            raise rpc_error(grpc.StatusCode.DEADLINE_EXCEEDED)
        verdicts = await self.land(list(request.submissions))
        if self.lose == "reply":
            raise rpc_error(grpc.StatusCode.DEADLINE_EXCEEDED)
        return lp.SubmitBatchResponse(results=[lp.SubmitBatchResult(response=v) for v in verdicts])

    async def land(self, submissions: list[lp.SubmitRequest]) -> list[lp.SubmitResponse]:
        verdicts = await self.store.scripts.submit_batch([validators.submission(s, 5000) for s in submissions])
        return [Settlement.submit_response(v) for v in verdicts]  # type: ignore[arg-type]

    async def ReleaseLease(self, request: lp.ReleaseLeaseRequest, timeout: float) -> lp.Lease:
        self.releases.append(request)
        if self.down:
            raise rpc_error(grpc.StatusCode.UNAVAILABLE)
        got = await self.store.scripts.release(
            lease_id=request.lease_id,
            holder=request.holder,
            reason=request.reason,
            generated_tokens=request.generated_tokens,
        )
        return got.lease

    async def RecordReward(self, request: lp.RecordRewardRequest, timeout: float) -> lp.RecordRewardResponse:
        out = await self.store.scripts.record_reward(
            trajectory_id=request.trajectory_id, failed=request.failed, reward=request.reward.reward
        )
        resp = lp.RecordRewardResponse(
            recorded=out.recorded,
            reward=out.reward,
            unknown_trajectory=out.unknown_trajectory,
            group_ready=out.group_ready,
        )
        self.rewards.append((request, resp))
        return resp


class Reward:
    def __init__(self) -> None:
        self.scored: list[str] = []

    async def Score(self, request: rp.ScoreRequest, timeout: float) -> rp.ScoreResult:
        tid = request.trajectory.trajectory_id
        self.scored.append(tid)
        outcome = common_pb2.RewardOutcome(trajectory_id=tid, reward=0.5)
        return rp.ScoreResult(trajectory_id=tid, status=rp.SCORE_STATUS_OK, outcome=outcome)


def make_loop(ledger: Ledger, reward: Reward, **cfg: float) -> Loop:
    cfg.setdefault("release_retry_seconds", 5.0)
    m = fake_manager(ledger, reward, settle_retry_seconds=0, **cfg)
    m.ledger_calls = LedgerBatcher(m._ledger)
    return Loop(m, builtin_group(m, ["math"]), 0)


async def one_lease(store: Store, lose: str = "", down: bool = False, **cfg: float) -> tuple[lp.Lease, Ledger, Loop]:
    """A ready job with one lease for HOLDER, the ledger's stand-in over ``store`` (``lose``, ``down``: see
    Ledger) and a loop on it."""
    await store.ready_job()
    [lease] = await store.acquire(holder=HOLDER)
    ledger = Ledger(store)
    ledger.lose, ledger.down = lose, down
    return lease, ledger, make_loop(ledger, Reward(), **cfg)


async def settle(loop: Loop, lease: lp.Lease, traj: common_pb2.Trajectory) -> str:
    """The loop settles ``traj``; returns its outcome once the background work (release, reward) is done."""
    lease.expires_at.FromSeconds(int(time.time()) - 5)  # one Submit attempt (settle_retry_seconds = 0)
    ep = Episode(traj.trajectory_id, loop.loop_id, "code:builtin", "math", lease=lease)
    out = await loop._settle(ep, SimpleNamespace(reward=MATH), traj)  # type: ignore[arg-type]
    await drain(loop.m)
    return out


async def drain(m: Manager) -> None:
    while m._tasks:
        await asyncio.wait(list(m._tasks), timeout=10)


async def done(outcome: common_pb2.RewardOutcome | None, cause: str = "") -> tuple[object, str]:
    return outcome, cause


async def test_a_lost_reply_of_an_applied_admission_is_scored_at_once_and_once(store: Store):
    lease, ledger, loop = await one_lease(store, lose="reply")
    traj = trajectory(lease, scored=False)
    tid = traj.trajectory_id
    t0 = time.monotonic()
    assert await settle(loop, lease, traj) == "ledger-unavailable"  # the loop saw no answer: as before
    assert time.monotonic() - t0 < 5  # not the score deadline (240 s)
    assert loop.counters.infra_failures == 1 and loop.m.failures["ledger-unavailable"] == 1
    [rel] = ledger.releases
    assert rel.reason == lp.RELEASE_REASON_INFRA_FAILURE
    assert (await store.lease(lease.lease_id))["st"] == str(lp.LEASE_STATE_SETTLED)  # the release left it
    [(req, resp)] = ledger.rewards
    assert (req.trajectory_id, req.reward.reward, resp.recorded) == (tid, 0.5, True)
    s = await store.hash("s:" + tid)
    assert (s["scd"], s["rw"]) == ("1", "0.5")
    assert await store.zmembers("unscored") == []  # nothing left for the reaper
    assert (await store.hash("stats"))["admitted"] == "1"
    assert loop.m.recording == set() and loop.m.rewards_pending == 0

    # Late duplicates change nothing: another reward, a failed scoring, the lost Submit again.
    loop.m.record_when_scored(tid, asyncio.ensure_future(done(common_pb2.RewardOutcome(trajectory_id=tid, reward=0.9))))
    loop.m.record_when_scored(tid, asyncio.ensure_future(done(None, "reward-internal: late")))
    await drain(loop.m)
    assert [(r.recorded, r.reward) for _, r in ledger.rewards[1:]] == [(False, 0.5), (False, 0.5)]
    [again] = await ledger.land([lp.SubmitRequest(trajectory=traj, holder=HOLDER)])
    assert again.admitted and again.duplicate
    s = await store.hash("s:" + tid)
    assert (s["scd"], s["rw"]) == ("1", "0.5") and await store.get("buf:scored") == "1"
    assert (await store.group(lease.group_id))["scd"] == "1"
    stats = await store.hash("stats")
    assert stats["admitted"] == "1" and "reward_failed" not in stats
    assert loop.m.recording == set()


async def test_a_submit_that_never_arrived_is_released_and_records_no_reward(store: Store):
    lease, ledger, loop = await one_lease(store, lose="request")
    traj = trajectory(lease, scored=False)
    assert await settle(loop, lease, traj) == "ledger-unavailable"
    got = await store.lease(lease.lease_id)
    assert got["st"] == str(lp.LEASE_STATE_RELEASED) and got["rel"] == str(lp.RELEASE_REASON_INFRA_FAILURE)
    assert ledger.rewards == [] and loop.m.recording == set() and loop.m.rewards_pending == 0
    assert "admitted" not in await store.hash("stats")
    # The request was only late: it lands after the release, on a final lease, and admits nothing.
    [late] = await ledger.land(ledger.held)
    assert not late.admitted and late.reason == lp.REJECTION_REASON_EXPIRED
    assert await store.zmembers("unscored") == [] and "admitted" not in await store.hash("stats")
    assert len(await store.acquire(holder="em-2/g/0", n=2)) == 2  # its sample is back in the pool


async def test_a_lost_reply_of_a_rejection_records_no_reward(store: Store):
    lease, ledger, loop = await one_lease(store, lose="reply")
    traj = trajectory(lease, scored=False, hashes={lease.version: h(99)})  # rejected: HASH_MISMATCH
    assert await settle(loop, lease, traj) == "ledger-unavailable"
    got = await store.lease(lease.lease_id)
    assert got["st"] == str(lp.LEASE_STATE_REJECTED) and got["traj"] == traj.trajectory_id
    assert ledger.rewards == [] and loop.m.recording == set() and loop.m.rewards_pending == 0
    assert (await store.hash("trj"))[traj.trajectory_id] == f"R:{lease.lease_id}"


async def test_a_ledger_that_never_answers_leaves_no_bookkeeping_behind(store: Store):
    lease, ledger, loop = await one_lease(store, down=True, release_retry_seconds=0)
    assert await settle(loop, lease, trajectory(lease, scored=False)) == "ledger-unavailable"
    assert len(ledger.releases) == 1 and ledger.rewards == []
    assert loop.m.recording == set() and loop.m.rewards_pending == 0
    assert (await store.lease(lease.lease_id))["st"] == str(lp.LEASE_STATE_ACTIVE)  # it expires by itself
