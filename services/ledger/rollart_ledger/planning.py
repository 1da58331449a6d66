"""Step planning (PlanStep): the plan of step s for version v and batch B, and its commit state.

Three layers, so that the decisions can be tested without a store:

* :func:`make_plan` is pure: from the version, the actors (as the ledger reports them) and the policy, it
  returns the :class:`~rollart.v1.ledger_pb2.StepPlan`, the tau updates and the commands the plan sends
  (Commit(v) to actors on v-1 and their relays, StageVersion(v) to lagging actors, StepPlanned to routers and
  the trainer, in that order). The arithmetic (eligibility, the proportional split) is in :mod:`.scheduling`.
* :func:`apply_commit_states` is pure: marks each allocation committed from the acknowledged orders and the
  actors' reported weights.
* :class:`StepPlanner` reads the inputs under WATCH and installs the plan with the ``plan_commit`` script in
  one MULTI/EXEC, so a plan is installed only if nothing it was computed from changed (it plans again
  otherwise). Planning the same (step, v) again returns the stored plan.

Every refusal is a :class:`~.errors.LedgerError` (FAILED_PRECONDITION, NOT_FOUND, ABORTED); a refused plan
changes nothing.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import cast

import redis.asyncio as aioredis
from google.protobuf.timestamp_pb2 import Timestamp
from redis.exceptions import WatchError

from rollart.v1 import common_pb2
from rollart.v1 import ledger_pb2 as lp

from . import codec, scheduling
from . import policy as pol
from .errors import LedgerError
from .scripts import Command, LedgerScripts, TauUpdate, now_ms

K = lp.SubscriberKind
#: Commit deadline of a plan whose request names none.
DEFAULT_COMMIT_DEADLINE_MS = 60_000
#: Plan attempts before PlanStep gives up with ABORTED (each retry follows a concurrent change).
MAX_ATTEMPTS = 50


def precondition(message: str) -> LedgerError:
    return LedgerError("FAILED_PRECONDITION", message)


@dataclass(frozen=True)
class PlanDraft:
    """What installing a plan writes: the plan, tau/excluded-steps updates per actor, commands in order."""

    plan: lp.StepPlan
    tau_updates: dict[str, TauUpdate]
    commands: list[Command]


def commit_order_id(step: int, version: int, actor_id: str) -> str:
    return f"commit-s{step}-v{version}-{actor_id}"


def make_plan(
    *,
    step: int,
    version: common_pb2.PolicyVersion,
    batch_size: int,
    commit_deadline: Timestamp | None,
    actors: Mapping[str, lp.LedgerActor],
    policy: Mapping[str, float],
    now: int,
) -> PlanDraft:
    """The plan of ``step`` for ``version`` (pure).

    ``actors`` are the registered actors with their liveness judged at ``now`` (departed ones are ignored);
    ``policy`` the numbers of the policy the step will run under (``decay``, ``unif`` are read). Eligible actors
    split B in proportion to tau (evenly with ``unif``), fastest first; an eligible actor with a zero share is
    listed as ZERO_SHARE without decay; excluded actors get tau * decay and, when alive, not draining and behind,
    StageVersion(v).
    Raises FAILED_PRECONDITION when no actor is eligible.
    """
    v = version.version
    views: dict[str, scheduling.ActorView] = {}
    present: dict[str, lp.LedgerActor] = {}
    for aid, a in actors.items():
        if a.liveness == lp.ACTOR_LIVENESS_LEFT:
            continue
        present[aid] = a
        views[aid] = scheduling.ActorView(
            actor_id=aid,
            tau=a.tau,
            alive=a.liveness in (lp.ACTOR_LIVENESS_ALIVE, lp.ACTOR_LIVENESS_DRAINING),
            draining=a.liveness == lp.ACTOR_LIVENESS_DRAINING,
            weights=a.weights,
        )
    eligible: dict[str, bool] = {}  # actor -> needs Commit(v) first
    excluded: dict[str, lp.ExclusionReason] = {}
    for aid, view in views.items():
        reason, needs_commit = scheduling.classify(view, v, version.hash)
        if reason is None:
            eligible[aid] = needs_commit
        else:
            excluded[aid] = reason
    if not eligible:
        reasons = ", ".join(f"{a}: {lp.ExclusionReason.Name(r)}" for a, r in sorted(excluded.items())) or "none"
        raise precondition(f"no actor is eligible for version {v} (actors: {reasons})")
    taus = {aid: views[aid].tau for aid in eligible}
    # uniform_allocation: an even split (the baseline that tau-proportional allocation is measured against)
    shares = scheduling.allocate(batch_size, dict.fromkeys(taus, 1.0) if policy.get("unif") else taus)
    deadline = commit_deadline if commit_deadline is not None else codec.ts_ms(now + DEFAULT_COMMIT_DEADLINE_MS)
    plan = lp.StepPlan(
        step=step,
        version=v,
        version_hash=version.hash,
        batch_size=batch_size,
        total_tau=sum(taus.values()),
        planned_at=codec.ts_ms(now),
        commit_deadline=deadline,
    )
    updates: dict[str, TauUpdate] = {}
    commands: list[Command] = []

    def commit(aid: str) -> str:
        order_id = commit_order_id(step, v, aid)
        order = common_pb2.CommitOrder(
            order_id=order_id,
            version=v,
            hash=version.hash,
            base_version=v - 1,
            step=step,
            actor_ids=[aid],
            issued_at=codec.ts_ms(now),
            deadline=deadline,
        )
        commands.append(Command(aid, (K.SUBSCRIBER_KIND_ACTOR,), True, lp.LedgerCommand(commit=order)))
        relay = present[aid].relay_id
        if relay:  # the relay propagates it too; the same order_id makes the second delivery a no-op
            commands.append(Command(relay, (K.SUBSCRIBER_KIND_RELAY,), False, lp.LedgerCommand(commit=order)))
        return order_id

    for aid in scheduling.order(shares, taus):
        a = present[aid]
        needs_commit = eligible[aid]
        order_id = commit(aid) if needs_commit else ""
        if shares[aid] > 0:
            plan.allocations.append(
                lp.ActorAllocation(
                    actor_id=aid,
                    requests=shares[aid],
                    tau=a.tau,
                    active_version=a.weights.active_version,
                    needs_commit=needs_commit,
                    commit_order_id=order_id,
                    committed=not needs_commit,
                )
            )
            updates[aid] = TauUpdate(a.tau, 0, seen=a.tau)
        else:
            # Eligible but its share rounded to zero: no decay (it was not left out for its state).
            plan.excluded.append(
                lp.ExcludedActor(
                    actor_id=aid,
                    reason=lp.EXCLUSION_REASON_ZERO_SHARE,
                    active_version=a.weights.active_version,
                    tau_after=a.tau,
                )
            )
            updates[aid] = TauUpdate(a.tau, a.excluded_steps + 1, seen=a.tau)
    for aid in sorted(excluded):
        a = present[aid]
        tau_after = a.tau * policy["decay"]
        updates[aid] = TauUpdate(tau_after, a.excluded_steps + 1, seen=a.tau)
        plan.excluded.append(
            lp.ExcludedActor(
                actor_id=aid,
                reason=excluded[aid],
                active_version=a.weights.active_version,
                tau_after=tau_after,
            )
        )
        behind = a.weights.loaded and a.weights.active_version < v
        if views[aid].alive and not views[aid].draining and behind:
            # A lagging actor is asked to stage v now, so that it is eligible for a later step.
            commands.append(
                Command(
                    aid,
                    (K.SUBSCRIBER_KIND_ACTOR,),
                    False,
                    lp.LedgerCommand(stage_version=lp.StageVersionCommand(version=version)),
                )
            )
    plan.all_committed = all(al.committed for al in plan.allocations)
    broadcast = (K.SUBSCRIBER_KIND_ROUTER, K.SUBSCRIBER_KIND_TRAINER)
    commands.append(Command("", broadcast, False, lp.LedgerCommand(step_planned=plan)))
    return PlanDraft(plan, updates, commands)


def apply_commit_states(
    plan: lp.StepPlan,
    order_states: Mapping[str, bytes | None],
    weights: Mapping[str, common_pb2.ActorWeightState],
) -> lp.StepPlan:
    """Marks each allocation that needs a commit committed (in place; returns ``plan``).

    Committed: its order was acknowledged ok (``order_states[order id]`` ``b"ok"``), or its actor reports an
    active version >= v. Otherwise a failed acknowledgement (``b"err:<message>"``) is the commit error.
    """
    for al in plan.allocations:
        if not al.needs_commit:
            continue
        state = order_states.get(al.commit_order_id)
        ws = weights.get(al.actor_id, common_pb2.ActorWeightState())
        al.committed = state == b"ok" or (ws.loaded and ws.active_version >= plan.version)
        al.commit_error = "" if al.committed or state is None else state.decode().removeprefix("err:")
    plan.all_committed = all(al.committed for al in plan.allocations)
    return plan


@dataclass(frozen=True)
class Planned:
    plan: lp.StepPlan
    created: bool  # False: the step was planned before (with the same version)


class StepPlanner:
    """Plans steps against the store under one key prefix (one job)."""

    def __init__(self, redis: aioredis.Redis, scripts: LedgerScripts, prefix: str) -> None:
        self.redis = redis
        self.scripts = scripts
        self.p = prefix

    def k(self, name: str) -> str:
        return self.p + name

    async def plan(self, *, step: int, version: int, batch_size: int, commit_deadline: Timestamp | None) -> Planned:
        """Plans ``step`` (or returns its plan), with the commit state filled in."""
        for _ in range(MAX_ATTEMPTS):
            try:
                planned = await self._plan_once(step, version, batch_size, commit_deadline)
            except WatchError:
                continue  # an actor or the step moved while we read: plan again on fresh state
            await self.fill_commits(planned.plan)
            return planned
        raise LedgerError("ABORTED", "the ledger state kept changing while planning; retry")

    async def _plan_once(self, step: int, v: int, batch_size: int, commit_deadline: Timestamp | None) -> Planned:
        k_plan = self.k(f"plan:{step}")
        async with self.redis.pipeline(transaction=True) as pipe:
            # P aepoch moves with everything of an actor a plan is made of (registration, liveness, draining,
            # weights, relay), not with heartbeat times or tau: heartbeats and settlements never force a retry.
            await pipe.watch(
                self.k("cur"), self.k("actors"), k_plan, self.k("pol"), self.k("pol:next"), self.k("aepoch")
            )
            # redis-py types replies as bytes | str; this client never decodes them (bytes).
            existing = cast(bytes | None, await pipe.get(k_plan))
            if existing is not None:
                plan = lp.StepPlan.FromString(existing)
                if plan.version != v:
                    raise precondition(f"step {step} was already planned with version {plan.version}, not {v}")
                return Planned(plan, created=False)
            cur = codec.hdict(await pipe.hgetall(self.k("cur")))
            if cur and step < int(cur["step"]):
                raise precondition(f"step {step} is older than the current step {int(cur['step'])}")
            if cur and v < int(cur["v"]):
                raise precondition(f"version {v} is older than the current version {int(cur['v'])}")
            vblob = cast(bytes | None, await pipe.hget(self.k("versions"), str(v)))
            if vblob is None:
                raise precondition(f"version {v} is not registered")
            version = common_pb2.PolicyVersion.FromString(vblob)
            ids = sorted(m.decode() for m in cast(set[bytes], await pipe.smembers(self.k("actors"))))
            # read after the WATCH, in one round trip on another connection (the watch covers any connection)
            reads = self.redis.pipeline(transaction=False)
            for aid in ids:
                reads.hgetall(self.k("a:" + aid))
            raw = {aid: codec.hdict(h) for aid, h in zip(ids, await reads.execute())}
            # the policy the step will run under: the pending one, installed by plan_commit, else the one in force
            policy = pol.numbers(await pipe.hgetall(self.k("pol:next")) or await pipe.hgetall(self.k("pol")))

            now = now_ms()
            actors = {aid: codec.actor_from(h, now, policy["tout"]) for aid, h in raw.items() if h.get("info")}
            draft = make_plan(
                step=step,
                version=version,
                batch_size=batch_size,
                commit_deadline=commit_deadline,
                actors=actors,
                policy=policy,
                now=now,
            )
            pipe.multi()
            await self.scripts.plan_commit(
                step=step,
                version=v,
                batch_size=batch_size,
                plan=draft.plan,
                quotas=[(al.actor_id, al.requests) for al in draft.plan.allocations],
                tau_updates=draft.tau_updates,
                commands=draft.commands,
                pipe=pipe,
            )
            await pipe.execute()
        return Planned(draft.plan, created=True)

    async def fill_commits(self, plan: lp.StepPlan) -> lp.StepPlan:
        """Commit state of each allocation: acknowledged, or seen in the actor's reported active version."""
        needing = [al for al in plan.allocations if al.needs_commit]
        if needing:
            order_ids = [al.commit_order_id for al in needing]
            replies = cast(list[bytes | None], await self.redis.hmget(self.k("commit"), order_ids))
            states = dict(zip(order_ids, replies))
            pipe = self.redis.pipeline(transaction=False)
            for al in needing:
                pipe.hget(self.k("a:" + al.actor_id), "w")
            weights = {
                al.actor_id: common_pb2.ActorWeightState.FromString(w)
                for al, w in zip(needing, await pipe.execute())
                if w
            }
            apply_commit_states(plan, states, weights)
        plan.all_committed = all(al.committed for al in plan.allocations)
        return plan

    async def get(self, step: int) -> lp.StepPlan:
        """The plan of ``step`` (0: the current step) with its commit state; NOT_FOUND when never planned."""
        if step == 0:
            cur = await self.redis.hget(self.k("cur"), "step")
            if cur is None:
                raise LedgerError("NOT_FOUND", "no step has been planned yet")
            step = int(cur)
        blob = cast(bytes | None, await self.redis.get(self.k(f"plan:{step}")))
        if blob is None:
            raise LedgerError("NOT_FOUND", f"step {step} was never planned")
        return await self.fill_commits(lp.StepPlan.FromString(blob))
