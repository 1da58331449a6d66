"""The ledger's Lua scripts, one typed Python method each: every ledger state change is one atomic step in Redis.

Each script is ``lua/<name>.lua`` (package data) run after ``lua/prelude.lua``, the helpers they share: the two
are concatenated at load time into one string for SCRIPT LOAD, with the policy defaults of :mod:`.policy`
written into the prelude. KEYS[1] is the key prefix, ARGV[1] the caller's clock in ms (logs only); the scripts
read time from Redis (TIME) so that timestamps follow their order of execution. Each ``.lua`` file opens with
its ARGV layout, what it returns and the invariants it keeps. docs/ledger.md describes the keys.

:class:`LedgerScripts` is the only place that knows a script's argument order and reply shape: its methods
take typed keyword arguments and return typed results. Scripts check everything that can fail before their
first write, so a rejected call (``redis.error_reply('CODE message')``, raised here as :class:`LedgerError`)
changes nothing. Scripts run with EVALSHA; after a Redis restart (NOSCRIPT) redis-py loads them again and
retries, and a pipeline loads missing scripts before its MULTI.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from importlib import resources
from typing import Any, Literal, cast

import redis.asyncio as aioredis
from redis.exceptions import ResponseError

from rollart.v1 import common_pb2
from rollart.v1 import ledger_pb2 as lp

from . import codec
from . import policy as pol
from .errors import LedgerError

#: Every script, by the name of its file in ``lua/`` (without ``.lua``).
SCRIPT_NAMES: tuple[str, ...] = (
    "set_policy",
    "ensure_policy",
    "register_version",
    "register_actor",
    "heartbeat",
    "leave_actor",
    "ack_command",
    "plan_commit",
    "add_prompts",
    "acquire",
    "acquire_batch",
    "renew",
    "release",
    "cancel",
    "submit",
    "submit_batch",
    "record_reward",
    "list_unscored",
    "get_batch",
    "ack_batch",
    "reap",
)
PRELUDE = "prelude"
_DEFAULTS_LINE = "local DEF = __DEFAULTS__"


def _lua_file(name: str) -> str:
    return (resources.files(__package__) / "lua" / f"{name}.lua").read_text(encoding="utf-8")


@functools.cache
def source(name: str) -> str:
    """The full text of script ``name``: the prelude (defaults filled in), then the script's own file."""
    if name not in SCRIPT_NAMES:
        raise KeyError(f"no ledger script {name!r}")
    prelude = _lua_file(PRELUDE)
    if prelude.count(_DEFAULTS_LINE) != 1:
        raise RuntimeError(f"lua/{PRELUDE}.lua must hold the line {_DEFAULTS_LINE!r} exactly once")
    defaults = "{" + ", ".join(f"{k} = {v!r}" for k, v in pol.DEFAULTS.items()) + "}"
    return prelude.replace(_DEFAULTS_LINE, f"local DEF = {defaults}") + "\n" + _lua_file(name)


def now_ms() -> int:
    return int(time.time() * 1000)


def _flag(x: bool) -> str:
    return "1" if x else "0"


def _text(b: Any) -> str:
    return codec.text(b) if b is not None else ""


def _policy_args(policy: lp.JobPolicy) -> list[Any]:
    """The policy's blob, then its flat (field, value) pairs as the scripts read them (hash ``pol``)."""
    args: list[Any] = [policy.SerializeToString()]
    for key, value in pol.fields(policy).items():
        args += [key, repr(value)]
    return args


# ----------------------------------------------------------------------------------------------- typed values


@dataclass(frozen=True)
class RegisteredVersion:
    created: bool
    #: the version as stored: the new one, or the one registered before (the caller compares contents)
    recorded: common_pb2.PolicyVersion


@dataclass(frozen=True)
class Heartbeat:
    #: 'ok'; 'unknown' (never registered, dead or departed); 'dead' (presumed dead by this heartbeat)
    status: Literal["ok", "unknown", "dead"]
    tau: float
    latest_command_sequence: int


@dataclass(frozen=True)
class ActorLeft:
    leases_returned: int
    leases_unassigned: int


@dataclass(frozen=True)
class Command:
    """One entry for the command log: to ``target``, or (target '') broadcast to ``kinds``."""

    target: str
    kinds: tuple[int, ...]
    ack_required: bool
    command: lp.LedgerCommand


@dataclass(frozen=True)
class TauUpdate:
    tau: float
    excluded_steps: int
    #: the tau the plan read (None: write ``tau`` as it is). The plan does not watch tau (settled work and
    #: heartbeats move it all the time), so when the stored tau moved since, the script scales the stored value
    #: by tau / seen (the plan's decay, or 1) instead of overwriting the newer observation.
    seen: float | None = None


@dataclass(frozen=True)
class NewGroup:
    """One prompt of AddPrompts: ``group_id`` '' lets the script name the group."""

    group_id: str
    prompt_id: str
    task: str
    prompt: bytes


@dataclass(frozen=True)
class PromptsAdded:
    group_ids: list[str]
    groups_created: int
    samples_added: int


@dataclass(frozen=True)
class Acquired:
    #: 'ok' (leases issued), 'noversion' (no version registered yet) or 'empty'
    status: Literal["ok", "noversion", "empty"]
    leases: list[lp.Lease]


@dataclass(frozen=True)
class Released:
    changed: bool
    lease: lp.Lease


@dataclass(frozen=True)
class WorkReport:
    """Settled work of one actor, fed into its tau."""

    actor_id: str
    tokens: int
    generation_ms: int


@dataclass(frozen=True)
class AcquireArgs:
    """One request of :meth:`LedgerScripts.acquire_batch` (the keyword arguments of :meth:`~LedgerScripts.acquire`)."""

    holder: str
    max_leases: int
    region: str = ""
    group_id: str = ""
    tasks: tuple[str, ...] = ()


@dataclass(frozen=True)
class Submission:
    """One result for :meth:`LedgerScripts.submit_batch` (the keyword arguments of :meth:`~LedgerScripts.submit`)."""

    lease_id: str
    trajectory_id: str
    holder: str
    lease_version: int
    ok: bool
    token_versions: tuple[int, int] | None
    scored: bool
    reward: float
    trajectory: bytes
    tau_window_ms: int
    version_hashes: Mapping[int, bytes]
    work: Sequence[WorkReport]
    generated_tokens: int = 0


@dataclass(frozen=True)
class Verdict:
    admitted: bool
    reason: lp.RejectionReason  # 0 when admitted
    detail: str
    duplicate: bool
    group_complete: bool
    group_admitted: int
    awaiting_reward: bool
    lease: lp.Lease | None  # None for an unknown lease


@dataclass(frozen=True)
class RewardRecorded:
    recorded: bool
    reward: float
    unknown_trajectory: bool
    group_ready: bool


@dataclass(frozen=True)
class Unscored:
    """An admitted sample awaiting its reward: its lease (prompt filled), the trajectory blob as submitted."""

    trajectory_id: str
    admitted_ms: int
    lease: lp.Lease
    trajectory: bytes


@dataclass(frozen=True)
class UnscoredPage:
    samples: list[Unscored]
    after: tuple[int, str] | None  # where the next page starts (None: this is the last one)


@dataclass(frozen=True)
class BatchRecord:
    batch_id: str
    samples: int
    min_version: int
    max_version: int
    evicted: int  # by every attempt of the call that formed it
    group_ids: list[str]
    created_ms: int
    partial: bool
    evicted_tokens: int = 0  # generated tokens of the evicted samples
    filtered_groups: int = 0  # zero-variance groups consumed for this batch (dynamic sampling)
    filtered_samples: int = 0
    filtered_tokens: int = 0


@dataclass(frozen=True)
class BatchAttempt:
    """One get_batch attempt: the step's batch, or (batch None) what this attempt evicted and what is ready."""

    batch: BatchRecord | None
    evicted_now: int = 0
    ready_samples: int = 0
    evicted_tokens_now: int = 0
    filtered_now: int = 0  # zero-variance groups this attempt consumed


@dataclass(frozen=True)
class Reaped:
    expired: int
    presumed_dead: int
    purged: int
    unscored_expired: int = 0  # admitted samples un-admitted as failed: no reward within the score deadline


# ------------------------------------------------------------------------------------------------- scripts


class LedgerScripts:
    """The ledger's scripts bound to one Redis client and one key prefix (one job)."""

    def __init__(self, redis: aioredis.Redis, prefix: str) -> None:
        self.redis = redis
        self.prefix = prefix
        self._scripts = {name: redis.register_script(source(name)) for name in SCRIPT_NAMES}

    async def load(self) -> None:
        """SCRIPT LOAD every script now (a syntax error shows at start, not at the first call)."""
        for script in self._scripts.values():
            script.sha = await self.redis.script_load(script.script)

    async def _run(self, name: str, args: Iterable[Any], client: Any = None) -> Any:
        try:
            return await self._scripts[name](keys=[self.prefix], args=[now_ms(), *args], client=client)
        except ResponseError as exc:
            raise _ledger_error(exc) from None

    async def _run_batch(self, name: str, arglists: Sequence[Sequence[Any]]) -> list[Any]:
        """Runs batch script ``name`` (``acquire_batch``, ``submit_batch``) over the argument lists: one script run,
        so one round trip and one AOF write and fsync for all items, each item running its single-item logic in
        turn. Returns the replies in order, a :class:`LedgerError` in place of an item the script refused."""
        args: list[Any] = [len(arglists)]
        for a in arglists:
            args.append(len(a))
            args.extend(a)
        out: list[Any] = []
        for ok, reply in await self._run(name, args):
            if int(ok):
                out.append(reply)
            else:
                out.append(_ledger_error(ResponseError(_text(reply))))
        return out

    # -------------------------------------------------------------------------------------------- policy

    async def ensure_policy(self, defaults: lp.JobPolicy) -> bool:
        """Writes ``defaults`` as the policy in force unless one is there; True when it wrote."""
        return bool(await self._run("ensure_policy", _policy_args(defaults)))

    async def set_policy(self, policy: lp.JobPolicy) -> Literal["pol", "pol:next"]:
        """Stores ``policy`` (defaults filled) for ``policy.job_id``; returns the hash it went to."""
        target = await self._run("set_policy", [policy.job_id, *_policy_args(policy)])
        return "pol" if _text(target) == "pol" else "pol:next"

    # ------------------------------------------------------------------------------------------ versions

    async def register_version(self, version: common_pb2.PolicyVersion) -> RegisteredVersion:
        """Appends ``version`` (base_version -1 for none) and broadcasts VersionPublished to relays and actors."""
        blob = version.SerializeToString()
        published = lp.LedgerCommand(version_published=lp.VersionPublishedCommand(version=version))
        created, recorded = await self._run(
            "register_version",
            [version.version, version.base_version, version.hash, blob, published.SerializeToString()],
        )
        return RegisteredVersion(bool(created), common_pb2.PolicyVersion.FromString(recorded))

    # -------------------------------------------------------------------------------------------- actors

    async def register_actor(self, actor: lp.LedgerActor) -> dict[str, bytes]:
        """Registers (or re-registers) ``actor``; returns its hash ``a:<actor>``."""
        flat = await self._run(
            "register_actor",
            [actor.actor_id, codec.actor_info(actor), actor.weights.SerializeToString(), actor.region, actor.relay_id],
        )
        return codec.hdict(flat)

    async def heartbeat(
        self,
        *,
        actor_id: str,
        weights: common_pb2.ActorWeightState | None,
        observed_tokens_per_s: float,
        in_flight_requests: int,
        draining: bool,
        relay_id: str,
    ) -> Heartbeat:
        """``weights`` None and ``relay_id`` '' keep what was reported before."""
        status, tau, seq = await self._run(
            "heartbeat",
            [
                actor_id,
                weights.SerializeToString() if weights is not None else "",
                repr(observed_tokens_per_s),
                in_flight_requests,
                _flag(draining),
                relay_id,
            ],
        )
        return Heartbeat(_text(status), float(tau), int(seq))  # type: ignore[arg-type]

    async def leave_actor(self, actor_id: str) -> ActorLeft:
        returned, unassigned = await self._run("leave_actor", [actor_id])
        return ActorLeft(int(returned), int(unassigned))

    # ------------------------------------------------------------------------------------------ commands

    async def ack_command(
        self,
        *,
        subscriber_id: str,
        sequence: int,
        ok: bool,
        error: str,
        commit_order_id: str,
        weights: common_pb2.ActorWeightState | None,
    ) -> bool:
        """Records the outcome once; True when recorded (False: acknowledged before)."""
        recorded = await self._run(
            "ack_command",
            [
                subscriber_id,
                sequence,
                _flag(ok),
                error,
                commit_order_id,
                weights.SerializeToString() if weights is not None else "",
            ],
        )
        return bool(recorded)

    # ------------------------------------------------------------------------------------------ planning

    @staticmethod
    def _plan_commit_args(
        step: int,
        version: int,
        batch_size: int,
        plan: lp.StepPlan,
        quotas: Sequence[tuple[str, int]],
        tau_updates: Mapping[str, TauUpdate],
        commands: Sequence[Command],
    ) -> list[Any]:
        args: list[Any] = [step, version, batch_size, plan.SerializeToString(), len(quotas)]
        for actor_id, requests in quotas:
            args += [actor_id, requests]
        args.append(len(tau_updates))
        for actor_id, update in tau_updates.items():
            seen = "" if update.seen is None else repr(update.seen)
            args += [actor_id, repr(update.tau), update.excluded_steps, seen]
        args.append(len(commands))
        for c in commands:
            args += [c.target, ",".join(str(k) for k in c.kinds), _flag(c.ack_required), c.command.SerializeToString()]
        return args

    async def plan_commit(
        self,
        *,
        step: int,
        version: int,
        batch_size: int,
        plan: lp.StepPlan,
        quotas: Sequence[tuple[str, int]],
        tau_updates: Mapping[str, TauUpdate],
        commands: Sequence[Command],
        pipe: Any = None,
    ) -> int | None:
        """Installs a plan; returns the leases cancelled as stale.

        With ``pipe`` (a transaction pipeline after ``multi()``) the script is queued instead and its result
        is in ``pipe.execute()``; this returns None.
        """
        args = self._plan_commit_args(step, version, batch_size, plan, quotas, tau_updates, commands)
        out = await self._run("plan_commit", args, client=pipe)
        return None if pipe is not None else int(out)

    # ---------------------------------------------------------------------------------------------- pool

    async def add_prompts(
        self, *, group_size: int, redundancy: int, step: int, priority: int, groups: Sequence[NewGroup]
    ) -> PromptsAdded:
        args: list[Any] = [group_size, redundancy, step, priority, len(groups)]
        for g in groups:
            args += [g.group_id, g.prompt_id, g.task, g.prompt]
        out = await self._run("add_prompts", args)
        n = len(groups)
        return PromptsAdded([_text(g) for g in out[:n]], int(out[n]), int(out[n + 1]))

    async def acquire(
        self, *, holder: str, max_leases: int, region: str, group_id: str, tasks: Sequence[str]
    ) -> Acquired:
        """Leases up to ``max_leases`` pending slots (``group_id`` '' and ``tasks`` () do not filter)."""
        out = await self._run("acquire", _acquire_args(AcquireArgs(holder, max_leases, region, group_id, tuple(tasks))))
        return _acquired(out)

    async def acquire_batch(self, requests: Sequence[AcquireArgs]) -> list[Acquired | LedgerError]:
        """:meth:`acquire` for each request, in order, in one script run (one round trip, one fsync): each request
        gets what :meth:`acquire` would have given it after the requests before it."""
        replies = await self._run_batch("acquire_batch", [_acquire_args(r) for r in requests])
        return [r if isinstance(r, LedgerError) else _acquired(r) for r in replies]

    async def renew(self, *, lease_id: str, holder: str) -> lp.Lease:
        return codec.lease_from_row(await self._run("renew", [lease_id, holder]))

    async def release(
        self, *, lease_id: str, holder: str, reason: int, generated_tokens: int | None = None
    ) -> Released:
        """``generated_tokens``: the holder's report of the work abandoned with the lease (None: no report)."""
        tokens = "" if generated_tokens is None else str(int(generated_tokens))
        changed, row = await self._run("release", [lease_id, holder, reason, tokens])
        return Released(bool(changed), codec.lease_from_row(row))

    async def cancel(self, *, reason: int, lease_ids: Sequence[str], group_ids: Sequence[str]) -> list[str]:
        """Cancels the active leases named and those of the groups named; returns the ids cancelled."""
        out = await self._run("cancel", [reason, len(lease_ids), *lease_ids, len(group_ids), *group_ids])
        return [_text(x) for x in out]

    # ---------------------------------------------------------------------------------------- settlement

    async def submit(self, **kw: Any) -> Verdict:
        """Settles one result (the fields of :class:`Submission`). ``token_versions`` is (oldest, newest) version
        of the action tokens, None when the trajectory has no tokens; ``version_hashes`` maps every reported
        version to its hash; ``generated_tokens`` (its action tokens) goes into the generation accounting with
        its fate."""
        return await self.settle(Submission(**kw))

    async def settle(self, submission: Submission) -> Verdict:
        """:meth:`submit` of one :class:`Submission`."""
        return _verdict(await self._run("submit", _submit_args(submission)))

    async def submit_batch(self, submissions: Sequence[Submission]) -> list[Verdict | LedgerError]:
        """:meth:`submit` for each result, in order, in one script run (one round trip, one fsync): each settled on
        its own, as :meth:`submit` settles it (idempotent per lease and trajectory, the first verdict stands); the
        replies are read once Redis has them on disk."""
        replies = await self._run_batch("submit_batch", [_submit_args(x) for x in submissions])
        return [r if isinstance(r, LedgerError) else _verdict(r) for r in replies]

    async def record_reward(self, *, trajectory_id: str, failed: bool, reward: float) -> RewardRecorded:
        recorded, value, unknown, ready = await self._run(
            "record_reward", [trajectory_id, _flag(failed), repr(reward)]
        )
        return RewardRecorded(bool(recorded), float(value), bool(unknown), bool(ready))

    async def list_unscored(
        self, *, holder_prefix: str, max_samples: int, max_bytes: int = 32 << 20, after: tuple[int, str] | None = None
    ) -> UnscoredPage:
        """A page of the samples awaiting their reward settled by holders under ``holder_prefix``, oldest admission
        first, after ``after`` (the admission ms and trajectory id a page before ended on); list_unscored.lua."""
        at, tid = after if after is not None else ("", "")
        more, at_ms, at_tid, rows = await self._run(
            "list_unscored", [holder_prefix, max_samples, max_bytes, at, tid]
        )
        samples = [
            Unscored(_text(t), int(float(a)), codec.lease_from_row(row), blob or b"") for t, a, row, blob in rows
        ]
        return UnscoredPage(samples, (int(float(at_ms)), _text(at_tid)) if int(more) else None)

    async def get_batch(
        self,
        *,
        step: int,
        batch_size: int,
        floor: int | None,
        partial: bool,
        evicted_before: int,
        evicted_tokens_before: int = 0,
        drop_zero_variance: bool = False,
        max_groups: int = 0,
    ) -> BatchAttempt:
        """One attempt: evict below ``floor`` (None: no eviction; none under AT_START either), then form the
        step's batch if ready (or, with ``partial``, whatever is ready). ``evicted_before`` (and their
        ``evicted_tokens_before``) are added to the batch's eviction counts. ``drop_zero_variance``: groups
        whose rewards are all equal are consumed as filtered and the batch filled from further groups, at most
        ``max_groups`` drawn for the step (0: no bound); get_batch.lua states the rules."""
        out = await self._run(
            "get_batch",
            [
                step,
                batch_size,
                "" if floor is None else str(floor),
                _flag(partial),
                evicted_before,
                evicted_tokens_before,
                _flag(drop_zero_variance),
                max_groups,
            ],
        )
        if int(out[0]) != 1:
            return BatchAttempt(
                None,
                evicted_now=int(out[1]),
                ready_samples=int(out[2]),
                evicted_tokens_now=int(out[3]),
                filtered_now=int(out[4]),
            )
        _, batch_id, n, minv, maxv, ev, groups, created, part, evk, fg, fs, ft = out
        return BatchAttempt(
            BatchRecord(
                batch_id=_text(batch_id),
                samples=int(n),
                min_version=int(minv),
                max_version=int(maxv),
                evicted=int(ev),
                group_ids=[g for g in _text(groups).split(",") if g],
                created_ms=int(created),
                partial=bool(int(part)),
                evicted_tokens=int(evk),
                filtered_groups=int(fg),
                filtered_samples=int(fs),
                filtered_tokens=int(ft),
            )
        )

    async def ack_batch(self, *, step: int, batch_id: str) -> int:
        """Removes the batch's samples; returns how many (0 when acknowledged before)."""
        return int(await self._run("ack_batch", [step, batch_id]))

    # -------------------------------------------------------------------------------------------- reaper

    async def reap(
        self, *, lease_retention_ms: int, actor_retention_ms: int, score_deadline_ms: int = 240_000
    ) -> Reaped:
        expired, dead, purged, unscored = await self._run(
            "reap", [lease_retention_ms, actor_retention_ms, score_deadline_ms]
        )
        return Reaped(int(expired), int(dead), int(purged), int(unscored))


# ------------------------------------------------------------------------------------------- argument layouts


def _ledger_error(exc: ResponseError) -> Exception:
    """The :class:`LedgerError` a script refused with (``CODE message``); any other error unchanged (a bug)."""
    code, _, message = str(exc).partition(" ")
    return LedgerError(code, message) if code in LedgerError.CODES else exc


def _acquire_args(r: AcquireArgs) -> list[Any]:
    return [r.holder, r.max_leases, r.region, r.group_id, len(r.tasks), *r.tasks]


def _acquired(out: Any) -> Acquired:
    return Acquired(_text(out[0]), [codec.lease_from_row(row) for row in out[1:]])  # type: ignore[arg-type]


def _submit_args(x: Submission) -> list[Any]:
    lo, hi = x.token_versions if x.token_versions is not None else (0, 0)
    args: list[Any] = [
        x.lease_id,
        x.trajectory_id,
        x.holder,
        x.lease_version,
        _flag(x.ok),
        _flag(x.token_versions is not None),
        lo,
        hi,
        _flag(x.scored),
        repr(x.reward),
        x.trajectory,
        x.tau_window_ms,
        len(x.version_hashes),
    ]
    for v, h in x.version_hashes.items():
        args += [v, h]
    args.append(len(x.work))
    for w in x.work:
        args += [w.actor_id, w.tokens, w.generation_ms]
    args.append(int(x.generated_tokens))
    return args


def _verdict(out: Any) -> Verdict:
    adm, reason, detail, dup, gc, gadm, awaiting, row = out
    return Verdict(
        admitted=bool(adm),
        reason=cast(lp.RejectionReason, int(reason)),
        detail=_text(detail),
        duplicate=bool(dup),
        group_complete=bool(gc),
        group_admitted=int(gadm),
        awaiting_reward=bool(awaiting),
        lease=codec.lease_from_row(row) if row else None,
    )
