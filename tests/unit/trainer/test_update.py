"""The UPDATE phase's decisions for full-weight modes (rollart_trainer.update): lag 1, SYNC and ONE_OFF load
every step; ASYNC with alpha > 1 loads in the background and waits only for actors below v + 1 - alpha. The
ledger and the actors are in-process fakes of their stubs (the eligibility rule of scheduling.classify)."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from types import SimpleNamespace

import grpc
import pytest
from grpc import aio

from rollart.v1 import actor_pb2, common_pb2, ledger_pb2, trainer_pb2
from rollart_trainer.config import TrainerConfig
from rollart_trainer.jobspec import AREAL, ASYNC, BUCKETS, DELTA, FULL, ONE_OFF, SYNC, Settings
from rollart_trainer.update import Updater, lags_full_weights, oldest_allowed

L = ledger_pb2


def rpc_error(code: grpc.StatusCode, details: str) -> aio.AioRpcError:
    return aio.AioRpcError(code, aio.Metadata(), aio.Metadata(), details)


class FakeLedger:
    """Actors' reported weights, registered versions and step plans, with PlanStep's eligibility rule."""

    def __init__(self, versions: dict[str, int]) -> None:
        self.actors = {
            aid: L.LedgerActor(
                actor_id=aid,
                endpoint=f"{aid}:1",
                liveness=L.ACTOR_LIVENESS_ALIVE,
                weights=common_pb2.ActorWeightState(loaded=True, active_version=v),
            )
            for aid, v in versions.items()
        }
        for a in self.actors.values():
            a.registered_at.FromSeconds(100)
        self.plans: dict[int, L.StepPlan] = {}
        self.current: L.StepPlan | None = None

    def set_version(self, aid: str, v: int) -> None:
        self.actors[aid].weights.active_version = v

    async def ListActors(self, req: L.ListActorsRequest) -> L.ListActorsResponse:
        resp = L.ListActorsResponse()
        for a in self.actors.values():
            resp.actors.add().CopyFrom(a)
        return resp

    async def GetVersion(self, req: L.GetVersionRequest) -> common_pb2.PolicyVersion:
        return common_pb2.PolicyVersion(version=req.version, hash=b"h%d" % req.version)

    async def GetStepPlan(self, req: L.GetStepPlanRequest) -> L.StepPlan:
        plan = self.current if req.step == 0 else self.plans.get(req.step)
        if plan is None:
            raise rpc_error(grpc.StatusCode.NOT_FOUND, "no step has been planned yet")
        return plan

    async def PlanStep(self, req: L.PlanStepRequest) -> L.StepPlan:
        if req.step in self.plans:
            if self.plans[req.step].version != req.version:
                raise rpc_error(grpc.StatusCode.FAILED_PRECONDITION, "already planned with another version")
            return self.plans[req.step]
        if self.current is not None and req.version < self.current.version:
            raise rpc_error(grpc.StatusCode.FAILED_PRECONDITION, f"version {req.version} is older than the current")
        plan = L.StepPlan(step=req.step, version=req.version, all_committed=True)
        for a in self.actors.values():
            on = a.liveness == L.ACTOR_LIVENESS_ALIVE and a.weights.active_version == req.version
            if on:
                plan.allocations.add(actor_id=a.actor_id, requests=1, committed=True)
            else:
                plan.excluded.add(actor_id=a.actor_id, reason=L.EXCLUSION_REASON_WRONG_VERSION)
        if not plan.allocations:
            raise rpc_error(grpc.StatusCode.FAILED_PRECONDITION, f"no actor is eligible for version {req.version}")
        self.plans[req.step] = plan
        self.current = plan
        return plan


class FakeActor:
    """An actor's LoadCheckpoint/PullBuckets: each load waits on its gate (opened by the test, or at once when
    ``instant``), then reports the version to the ledger; ``fail`` makes the next loads raise."""

    def __init__(self, ledger: FakeLedger, aid: str, instant: bool) -> None:
        self.ledger, self.aid, self.instant = ledger, aid, instant
        self.calls: list[int] = []
        self.gates: dict[int, asyncio.Event] = {}
        self.fail = 0

    def gate(self, v: int) -> asyncio.Event:
        return self.gates.setdefault(v, asyncio.Event())

    async def _load(self, v: int) -> None:
        self.calls.append(v)
        if not self.instant:
            await self.gate(v).wait()
        if self.fail:
            self.fail -= 1
            raise rpc_error(grpc.StatusCode.UNAVAILABLE, f"{self.aid}: download of v{v} broke")
        self.ledger.set_version(self.aid, max(v, self.ledger.actors[self.aid].weights.active_version))

    async def LoadCheckpoint(self, req: actor_pb2.LoadCheckpointRequest, timeout: float) -> object:
        await self._load(req.version)
        return actor_pb2.WeightUpdateResult(to_version=req.version)

    async def PullBuckets(self, req: actor_pb2.PullBucketsRequest, timeout: float) -> object:
        assert req.apply  # applied by the actor at its safe point: the same request as a lag-1 step
        await self._load(req.version)
        return actor_pb2.PullBucketsResponse()


def settings(mode: int = ASYNC, alpha: int = 1, weight_sync: int = FULL, max_steps: int = 0) -> Settings:
    return Settings(
        job_id="j",
        mode=mode,
        alpha=alpha,
        admission=common_pb2.ADMISSION_POLICY_BOUNDED,
        batch_size=4,
        group_size=2,
        redundancy=0,
        max_steps=max_steps,
        weight_sync=weight_sync,
        checkpoint_every_steps=1,
        batch_timeout=30.0,
        groups_per_step=2,
    )


def make(
    st: Settings, versions: dict[str, int], *, instant: bool = False, wait: float = 5.0
) -> tuple[Updater, FakeLedger, dict[str, FakeActor], SimpleNamespace]:
    ledger = FakeLedger(versions)
    actors = {aid: FakeActor(ledger, aid, instant) for aid in versions}
    peers = SimpleNamespace(ledger=ledger, proxy=None, actor=lambda ep: actors[ep.split(":")[0]])
    published: list[int] = []
    publication = SimpleNamespace(on_published=published.append, relay_commit=None)
    cfg = TrainerConfig.model_construct(
        commit_wait_seconds=wait, commit_grace_seconds=0.5, stage_wait_seconds=0.0, mooncake_master=None
    )
    spec = trainer_pb2.TrainerJobSpec(job_id="j")
    spec.publish.checkpoint_store = "file:///ckpt"
    u = Updater(spec, cfg, st, peers, publication)  # type: ignore[arg-type]
    MADE.append(u)
    publication.published = published  # what the driver's own hook received
    return u, ledger, actors, publication


MADE: list[Updater] = []


@pytest.fixture(autouse=True)
async def no_loads_left() -> AsyncIterator[None]:
    """Loads a test left hanging on a closed gate are cancelled with it."""
    yield
    tasks = [ld.task for u in MADE for ld in u._loads.values() if ld.task is not None and not ld.task.done()]
    for t in tasks:
        t.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
    MADE.clear()


async def settle() -> None:
    for _ in range(5):
        await asyncio.sleep(0)


# ------------------------------------------------------------------------------------------ the rule


def test_lag_applies_to_async_full_weights_with_alpha_above_one():
    assert lags_full_weights(settings(ASYNC, 2, FULL)) and lags_full_weights(settings(ASYNC, 4, BUCKETS))
    assert not lags_full_weights(settings(ASYNC, 1, FULL))  # lag 1: every step loads, as before
    assert not lags_full_weights(settings(ASYNC, 4, DELTA))  # deltas commit at the plan
    assert not lags_full_weights(settings(SYNC, 0, FULL))
    assert not lags_full_weights(settings(ONE_OFF, 1, FULL))
    assert not lags_full_weights(settings(AREAL, 4, FULL))  # at-start admission: no floor to bound a lag


def test_oldest_allowed_keeps_the_next_batch_within_alpha():
    # After UPDATE(v) the samples go to the batch that trains v + 1, whose floor is v + 1 - alpha.
    assert oldest_allowed(5, 1) == 5
    assert oldest_allowed(5, 2) == 4
    assert oldest_allowed(5, 4) == 2
    for v in range(1, 8):
        for alpha in range(1, 6):
            assert (v + 1) - oldest_allowed(v, alpha) == alpha


# ------------------------------------------------------------------------------- lag 1: as before


@pytest.mark.parametrize("mode, alpha", [(ASYNC, 1), (SYNC, 0), (ONE_OFF, 1), (AREAL, 4)])
async def test_not_lagged_every_step_waits_for_the_full_load(mode: int, alpha: int):
    u, ledger, actors, _ = make(settings(mode, alpha), {"a": 0, "b": 0})
    task = asyncio.ensure_future(u.update(2, 1))
    await settle()
    assert not task.done()  # blocked on the loads
    assert actors["a"].calls == [1] and actors["b"].calls == [1]
    actors["a"].gate(1).set()
    await settle()
    assert not task.done()
    actors["b"].gate(1).set()
    await asyncio.wait_for(task, 2)
    assert ledger.plans[2].version == 1 and not u._loads  # nothing in the background


async def test_not_lagged_load_refused_while_the_link_is_down_is_asked_again():
    # Lag 1 across a link: b is unreachable for its first two attempts (UNAVAILABLE), then loads; the step is
    # planned on both instead of leaving b behind.
    u, ledger, actors, _ = make(settings(ASYNC, 1), {"a": 0, "b": 0}, instant=True, wait=10.0)
    actors["b"].fail = 2
    await asyncio.wait_for(u.update(2, 1), 8)
    assert actors["b"].calls == [1, 1, 1] and actors["a"].calls == [1]
    assert [a.actor_id for a in ledger.plans[2].allocations] == ["a", "b"]


async def test_not_lagged_load_still_refused_at_the_commit_wait_leaves_the_actor_behind():
    u, ledger, actors, _ = make(settings(ASYNC, 1), {"a": 0, "b": 0}, instant=True, wait=1.5)
    actors["b"].fail = 100
    await asyncio.wait_for(u.update(2, 1), 6)
    assert 2 <= len(actors["b"].calls) <= 3
    assert [a.actor_id for a in ledger.plans[2].allocations] == ["a"]


async def test_delta_mode_plans_v_and_loads_nothing():
    u, ledger, actors, pub = make(settings(ASYNC, 4, DELTA), {"a": 3, "b": 3})
    pub.on_published(3)
    await asyncio.wait_for(u.update(4, 3), 1)
    assert ledger.plans[4].version == 3 and not actors["a"].calls and not u._loads


async def test_not_lagged_publication_hook_is_left_alone():
    u, _, actors, pub = make(settings(ASYNC, 1), {"a": 0})
    pub.on_published(3)
    await settle()
    assert pub.published == [3] and actors["a"].calls == []


# -------------------------------------------------------------------------------------- lagged


async def test_lagged_goes_on_while_actors_are_within_the_bound():
    u, ledger, actors, pub = make(settings(ASYNC, 2), {"a": 1, "b": 1})
    pub.on_published(2)  # the download starts when v is registered
    await settle()
    assert pub.published == [2] and actors["a"].calls == [2] and actors["b"].calls == [2]
    # UPDATE(v=2): the actors on 1 = 2 + 1 - 2 may stay there; the step is planned on 1, no wait.
    pause = await asyncio.wait_for(u.update(3, 2), 1)
    assert pause == 0.0 and ledger.plans[3].version == 1
    assert actors["a"].calls == [2]  # no second download
    actors["a"].gate(2).set()
    actors["b"].gate(2).set()
    await settle()
    assert {a.weights.active_version for a in ledger.actors.values()} == {2}


async def test_close_cancels_the_background_loads_in_flight():
    u, _, actors, _ = make(settings(ASYNC, 2), {"a": 1, "b": 1})
    u.published(2)
    await settle()
    running = [ld.task for ld in u._loads.values() if ld.running]
    assert len(running) == 2  # both downloads hang on their gates
    await asyncio.wait_for(u.close(), 1)
    assert all(t.cancelled() or t.done() for t in running) and not any(ld.running for ld in u._loads.values())


async def test_lagged_blocks_until_an_actor_reaches_the_bound():
    u, ledger, actors, _ = make(settings(ASYNC, 2), {"a": 2, "b": 1})
    u.published(3)
    await settle()
    task = asyncio.ensure_future(u.update(4, 3))  # need = 3 + 1 - 2 = 2: b (on 1) is below it
    await settle()
    assert not task.done()
    actors["a"].gate(3).set()  # a reaching 3 does not release the step: b is still below the bound
    await settle()
    assert not task.done()
    actors["b"].gate(3).set()
    await asyncio.wait_for(task, 1)
    assert ledger.plans[4].version == 3
    assert all(a.weights.active_version >= oldest_allowed(3, 2) for a in ledger.actors.values())


async def test_lagged_failed_background_load_is_logged_and_retried_when_it_must_be_awaited(
    caplog: pytest.LogCaptureFixture,
):
    caplog.set_level(logging.INFO, logger="rollart_trainer.update")
    u, ledger, actors, _ = make(settings(ASYNC, 2), {"a": 2, "b": 2}, instant=True)
    actors["b"].fail = 1
    u.published(3)
    await settle()
    assert "background full-weight load of b to v3 failed" in caplog.text
    assert ledger.actors["a"].weights.active_version == 3 and ledger.actors["b"].weights.active_version == 2
    # UPDATE(3): b on 2 = the bound, no wait; its failed load is started again in the background.
    await asyncio.wait_for(u.update(4, 3), 1)
    await settle()
    assert actors["b"].calls == [3, 3] and ledger.actors["b"].weights.active_version == 3
    assert "retrying the full-weight load of b" in caplog.text


async def test_lagged_failed_load_below_the_bound_is_awaited_again_then_left_behind(
    caplog: pytest.LogCaptureFixture,
):
    u, ledger, actors, _ = make(settings(ASYNC, 2), {"a": 1, "b": 1}, instant=True)
    actors["b"].fail = 10  # b's downloads keep breaking
    await asyncio.wait_for(u.update(4, 3), 2)  # need 2: both below it, both awaited
    assert ledger.actors["a"].weights.active_version == 3
    assert len(actors["b"].calls) == 2  # its load, then one retry awaited; then it stays behind
    assert "stays below v2" in caplog.text
    assert ledger.plans[4].version == 3 and [a.actor_id for a in ledger.plans[4].allocations] == ["a"]


async def test_lagged_load_that_hangs_is_awaited_until_the_deadline():
    u, ledger, actors, _ = make(settings(ASYNC, 2), {"a": 1, "b": 3}, wait=0.3)
    actors["b"].instant = True
    # a on 1 below the bound 3 of UPDATE(4); its load hangs: the update goes on without it at the deadline.
    await asyncio.wait_for(u.update(5, 4), 2)
    assert ledger.actors["a"].weights.active_version == 1
    assert ledger.plans[5].version == 4 and [a.actor_id for a in ledger.plans[5].allocations] == ["b"]


async def test_lagged_lag_never_exceeds_alpha_over_steps():
    """A slow link: each load takes three steps. Over many steps every actor runs a version >= v + 1 - alpha
    once UPDATE(v) returns, i.e. its samples are at most alpha versions old when trained."""
    for alpha in (2, 3, 4):
        u, ledger, actors, _ = make(settings(ASYNC, alpha), {"a": 0, "b": 0})
        ticks: dict[tuple[str, int], int] = {}

        async def slow_link(actors: dict[str, FakeActor] = actors, ticks: dict = ticks) -> None:
            # One tick of the link: the oldest pending load of each actor moves on; three ticks finish it.
            for aid, actor in actors.items():
                pending = [v for v in actor.calls if not actor.gate(v).is_set()]
                if pending:
                    key = (aid, pending[0])
                    ticks[key] = ticks.get(key, 0) + 1
                    if ticks[key] >= 3:
                        actor.gate(pending[0]).set()

        waits = went_on = max_lag = 0
        for v in range(1, 16):
            u.published(v)
            await settle()
            task = asyncio.ensure_future(u.update(v + 1, v))
            await settle()
            went_on += task.done()
            while not task.done():
                waits += 1
                await slow_link()
                await settle()
            await task
            plan = ledger.plans[v + 1]
            assert plan.version >= oldest_allowed(v, alpha)
            for a in ledger.actors.values():
                assert a.weights.active_version >= oldest_allowed(v, alpha), (alpha, v, a.actor_id)
                max_lag = max(max_lag, v - a.weights.active_version)
            await slow_link()  # the rollout of the step: the link moves on
            await settle()
        assert waits > 0 and went_on > 0  # some steps waited for the slow link, others went on
        assert max_lag == alpha - 1  # the whole allowance is used, no more


async def test_lagged_chains_to_the_newest_version_after_a_load():
    u, ledger, actors, _ = make(settings(ASYNC, 4), {"a": 0})
    u.published(1)
    await settle()
    u.published(2)  # a is still loading 1: no second download in parallel
    await settle()
    assert actors["a"].calls == [1]
    actors["a"].gate(1).set()
    await settle()
    assert actors["a"].calls == [1, 2]  # the newest version follows at once
    actors["a"].gate(2).set()
    await settle()
    assert ledger.actors["a"].weights.active_version == 2


async def test_lagged_plans_the_version_most_actors_are_on():
    u, ledger, actors, _ = make(settings(ASYNC, 4), {"a": 5, "b": 4, "c": 4})
    await asyncio.wait_for(u.update(7, 6), 1)  # need = 3: no wait; b and c on 4, a on 5
    assert ledger.plans[7].version == 4
    ledger.set_version("a", 6)
    ledger.set_version("b", 6)
    await asyncio.wait_for(u.update(8, 7), 1)
    assert ledger.plans[8].version == 6  # now most of them are on 6


async def test_lagged_never_plans_below_the_current_plan():
    u, ledger, actors, _ = make(settings(ASYNC, 4), {"a": 5, "b": 4, "c": 4})
    ledger.current = L.StepPlan(step=6, version=5)
    await asyncio.wait_for(u.update(7, 6), 1)
    assert ledger.plans[7].version == 5


async def test_lagged_replans_a_step_planned_before_a_restart_with_its_version():
    u, ledger, actors, _ = make(settings(ASYNC, 4), {"a": 5, "b": 6})
    ledger.plans[7] = ledger.current = L.StepPlan(step=7, version=5, all_committed=True)
    await asyncio.wait_for(u.update(7, 6), 1)
    assert ledger.plans[7].version == 5


async def test_lagged_last_update_loads_the_last_version_everywhere():
    u, ledger, actors, _ = make(settings(ASYNC, 4, max_steps=5), {"a": 3, "b": 5})
    u.published(5)
    await settle()
    assert actors["a"].calls == [5]
    task = asyncio.ensure_future(u.update(6, 5))  # after the last step (driver._finish)
    await settle()
    assert not task.done()  # waits although a on 3 is within alpha
    actors["a"].gate(5).set()
    await asyncio.wait_for(task, 1)
    assert actors["a"].calls == [5]  # the background load counted: no second download
    assert ledger.plans[6].version == 5


async def test_lagged_buckets_use_the_same_applied_pull():
    u, ledger, actors, _ = make(settings(ASYNC, 2, BUCKETS), {"a": 1}, instant=True)
    u.published(2)
    await settle()
    assert actors["a"].calls == [2] and ledger.actors["a"].weights.active_version == 2


def test_plan_version_mirrors_the_ledgers_eligibility():
    u, ledger, _, _ = make(settings(ASYNC, 4), {"a": 3, "b": 3, "c": 5})
    actors = list(ledger.actors.values())
    assert u.plan_version(actors, 6, 0) == 3
    assert u.plan_version(actors, 6, 4) == 5  # not below lo
    ledger.actors["c"].weights.staged.add(version=3, complete=True)
    ledger.actors["c"].weights.active_version = 2
    assert u.plan_version(list(ledger.actors.values()), 6, 0) == 3  # one below with v staged counts
    ledger.actors["a"].liveness = L.ACTOR_LIVENESS_DRAINING
    ledger.actors["b"].weights.loaded = False
    assert u.plan_version(list(ledger.actors.values()), 6, 0) == 3
    assert u.plan_version([], 6, 0) == 6
