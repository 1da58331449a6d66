"""Every request check of the Ledger service, on top of ``rollart.runtime.validation``.

Invariant: each function checks one request (or one item of a batch, its field names prefixed with ``at``)
without touching the store, and raises ``errors.InvalidArgument`` naming the field; the servicer calls it before
the core runs, so a refused request changed nothing. What needs the store (a version far ahead, an unknown
lease) is the core's to refuse. See docs/ledger.md.
"""

from __future__ import annotations

import math

from google.protobuf.duration_pb2 import Duration

from rollart.runtime import errors, ids, timeutil
from rollart.v1 import common_pb2
from rollart.v1 import ledger_pb2 as lp

from . import codec
from . import policy as pol
from .scripts import AcquireArgs, NewGroup, Submission, WorkReport

MAX_BATCH = 1_000_000
MAX_PROMPTS = 10_000
MAX_PRIORITY = 1_000_000
# Items of one AcquireLeasesBatch or SubmitBatch; leases of one AcquireLeases(Batch) call.
MAX_BATCH_ITEMS = 256
MAX_LEASES_PER_CALL = 1000
MAX_LEASE_ID_CHARS = 256
K = lp.SubscriberKind


# INVALID_ARGUMENT for a field; each message here starts with the field, so the details read as written.
_bad = errors.InvalidArgument


def _id(field: str, value: str, required: bool = True) -> None:
    ids.check_id(field, value, required=required)


def duration(field: str, d: Duration) -> float:
    return timeutil.checked_duration(field, d)


# ------------------------------------------------------------------------------------------ policy, versions


def set_policy(request: lp.SetJobPolicyRequest) -> None:
    if not request.HasField("policy"):
        raise _bad("policy", "policy is required")
    if not request.policy.job_id:
        raise _bad("policy.job_id", "policy.job_id is required")


def register_version(request: lp.RegisterVersionRequest) -> common_pb2.PolicyVersion:
    """The version to register (a copy: version 0 without a base gets base -1)."""
    v = common_pb2.PolicyVersion()
    v.CopyFrom(request.version)
    if not request.HasField("version"):
        raise _bad("version", "version is required")
    if v.version < 0:
        raise _bad("version.version", f"version.version must be >= 0, got {v.version}")
    if v.version == 0 and v.base_version == 0:
        v.base_version = -1  # version 0 is the initial policy: it has no base
    if v.base_version < -1 or v.base_version >= v.version:
        raise _bad(
            "version.base_version", f"version.base_version must be within [-1, {v.version - 1}], got {v.base_version}"
        )
    if len(v.hash) != 32:
        raise _bad("version.hash", f"version.hash must be the 32-byte SHA-256 h(v), got {len(v.hash)} bytes")
    for name in ("checkpoint_bytes", "delta_bytes", "delta_entries"):
        if getattr(v, name) < 0:
            raise _bad(f"version.{name}", f"version.{name} must be >= 0")
    return v


def get_version(request: lp.GetVersionRequest) -> None:
    if not request.latest and request.version < 0:
        raise _bad("version", "version must be >= 0")


def list_versions(request: lp.ListVersionsRequest) -> None:
    if request.limit < 0 or request.limit > 10_000:
        raise _bad("limit", "limit must be within [0, 10000]")
    if request.from_version < 0:
        raise _bad("from_version", "from_version must be >= 0")


# ------------------------------------------------------------------------------------------------ actors


def register_actor(request: lp.RegisterActorRequest) -> None:
    a = request.actor
    _id("actor.actor_id", a.actor_id)
    if not a.endpoint or len(a.endpoint) > 512:
        raise _bad("actor.endpoint", "actor.endpoint is required (host:port)")
    if len(a.region) > 128 or len(a.relay_id) > 200:
        raise _bad("actor.region", "actor.region or actor.relay_id is too long")
    if a.pd_role not in common_pb2.PdRole.values():
        raise _bad("actor.pd_role", f"actor.pd_role {a.pd_role} is not a PdRole")


def heartbeat(request: lp.ActorHeartbeatRequest) -> None:
    _id("actor_id", request.actor_id)
    obs = request.observed_tokens_per_s
    if not math.isfinite(obs) or obs < 0:
        raise _bad("observed_tokens_per_s", f"observed_tokens_per_s must be a finite number >= 0, got {obs}")
    if request.in_flight_requests < 0:
        raise _bad("in_flight_requests", "in_flight_requests must be >= 0")
    _id("relay_id", request.relay_id, required=False)


def actor_id(value: str) -> None:
    _id("actor_id", value)


# -------------------------------------------------------------------------------------- steps, commands


def plan_step(request: lp.PlanStepRequest) -> None:
    if request.step < 1:
        raise _bad("step", f"step must be >= 1, got {request.step}")
    if request.version < 0:
        raise _bad("version", f"version must be >= 0, got {request.version}")
    if not 1 <= request.batch_size <= MAX_BATCH:
        raise _bad("batch_size", f"batch_size must be within [1, {MAX_BATCH}], got {request.batch_size}")


def step(value: int) -> None:
    if value < 0:
        raise _bad("step", "step must be >= 0")


def await_step_committed(request: lp.AwaitStepCommittedRequest) -> float:
    """The wait asked for (seconds)."""
    if request.step < 1:
        raise _bad("step", "step must be >= 1")
    return duration("wait", request.wait)


def watch_commands(request: lp.WatchCommandsRequest) -> None:
    _id("subscriber_id", request.subscriber_id)
    if request.kind not in K.values() or request.kind == K.SUBSCRIBER_KIND_UNSPECIFIED:
        raise _bad("kind", "kind is required (ACTOR, RELAY, HOLDER, ROUTER or TRAINER)")
    if request.from_sequence < 0:
        raise _bad("from_sequence", "from_sequence must be >= 0")


def ack_command(request: lp.AckCommandRequest) -> None:
    _id("subscriber_id", request.subscriber_id)
    if request.sequence < 1:
        raise _bad("sequence", "sequence must be >= 1")


# ------------------------------------------------------------------------------------------- prompt pool


def add_prompts(request: lp.AddPromptsRequest) -> list[NewGroup]:
    """The groups to add, one per prompt."""
    n = len(request.prompts)
    if not 1 <= n <= MAX_PROMPTS:
        raise _bad("prompts", f"prompts must hold 1 to {MAX_PROMPTS} prompts, got {n}")
    if request.group_ids and len(request.group_ids) != n:
        raise _bad("group_ids", f"group_ids must be empty or parallel to prompts ({n}), got {len(request.group_ids)}")
    if not 0 <= request.group_size <= pol.MAX_GROUP:
        raise _bad("group_size", f"group_size must be within [1, {pol.MAX_GROUP}] (0: the policy's)")
    if request.HasField("redundancy") and not 0 <= request.redundancy <= pol.MAX_GROUP:
        raise _bad("redundancy", f"redundancy must be within [0, {pol.MAX_GROUP}]")
    if abs(request.priority) > MAX_PRIORITY:
        raise _bad("priority", f"priority must be within [-{MAX_PRIORITY}, {MAX_PRIORITY}]")
    if request.step < 0:
        raise _bad("step", "step must be >= 0")
    groups: list[NewGroup] = []
    for i, prompt in enumerate(request.prompts):
        _id(f"prompts[{i}].prompt_id", prompt.prompt_id)
        if len(prompt.task) > 256:
            raise _bad(f"prompts[{i}].task", f"prompts[{i}].task is longer than 256 characters")
        gid = request.group_ids[i] if request.group_ids else ""
        _id(f"group_ids[{i}]", gid, required=False)
        groups.append(NewGroup(gid, prompt.prompt_id, prompt.task, prompt.SerializeToString()))
    return groups


# ------------------------------------------------------------------------------------------------ leases


def acquire_args(request: lp.AcquireLeasesRequest, at: str = "") -> AcquireArgs:
    """An AcquireLeases request checked; ``at`` prefixes field names (a batch item's)."""
    _id(f"{at}holder", request.holder)
    _id(f"{at}group_id", request.group_id, required=False)
    if not 0 <= request.max_leases <= MAX_LEASES_PER_CALL:
        raise _bad(
            f"{at}max_leases",
            f"{at}max_leases must be within [1, {MAX_LEASES_PER_CALL}] (0: 1), got {request.max_leases}",
        )
    if len(request.tasks) > 100 or any(len(t) > 256 for t in request.tasks):
        raise _bad(f"{at}tasks", f"{at}tasks: at most 100 tags of at most 256 characters")
    if len(request.region) > 128:
        raise _bad(f"{at}region", f"{at}region is too long")
    return AcquireArgs(
        holder=request.holder,
        max_leases=request.max_leases or 1,
        region=request.region,
        group_id=request.group_id,
        tasks=tuple(request.tasks),
    )


def acquire_batch(request: lp.AcquireLeasesBatchRequest) -> list[AcquireArgs]:
    n = len(request.requests)
    if not 1 <= n <= MAX_BATCH_ITEMS:
        raise _bad("requests", f"requests must hold 1 to {MAX_BATCH_ITEMS} requests, got {n}")
    holders: dict[str, int] = {}
    for i, item in enumerate(request.requests):
        if item.holder in holders:
            raise _bad(
                f"requests[{i}]",
                f"requests[{i}] names holder {errors.shorten(item.holder)} as requests[{holders[item.holder]}]"
                " does: one request per holder in a batch",
            )
        holders[item.holder] = i
    args = [acquire_args(item, f"requests[{i}].") for i, item in enumerate(request.requests)]
    total = sum(a.max_leases for a in args)
    if total > MAX_LEASES_PER_CALL:
        raise _bad("requests", f"requests ask for {total} leases in all, more than {MAX_LEASES_PER_CALL}")
    return args


def lease_id(value: str, field: str = "lease_id") -> None:
    if not value or len(value) > MAX_LEASE_ID_CHARS:
        raise _bad(field, f"{field} is required")


def lease(lease: str, holder: str) -> None:
    lease_id(lease)
    _id("holder", holder)


def release_lease(request: lp.ReleaseLeaseRequest) -> None:
    lease(request.lease_id, request.holder)
    if request.reason not in lp.ReleaseReason.values():
        raise _bad("reason", f"reason {request.reason} is not a ReleaseReason")
    if request.generated_tokens < 0:
        raise _bad("generated_tokens", "generated_tokens must be >= 0")


def cancel_leases(request: lp.CancelLeasesRequest) -> None:
    if not request.lease_ids and not request.group_ids:
        raise _bad("", "name lease_ids or group_ids to cancel")
    if len(request.lease_ids) + len(request.group_ids) > 10_000:
        raise _bad("", "at most 10000 leases and groups per call")
    if request.reason not in lp.CancelReason.values():
        raise _bad("reason", f"reason {request.reason} is not a CancelReason")
    for i, lid in enumerate(request.lease_ids):
        if not lid or len(lid) > MAX_LEASE_ID_CHARS:
            raise _bad(f"lease_ids[{i}]", f"lease_ids[{i}] is empty or too long")
    for i, gid in enumerate(request.group_ids):
        _id(f"group_ids[{i}]", gid)


def list_leases(request: lp.ListLeasesRequest) -> int:
    """The score after which the page starts (from ``page_token``)."""
    if not 0 <= request.page_size <= 1000:
        raise _bad("page_size", "page_size must be within [1, 1000] (0: 100)")
    if any(s not in lp.LeaseState.values() for s in request.states):
        raise _bad("states", "states holds a value that is not a LeaseState")
    if request.page_token:
        if not request.page_token.isdigit():
            raise _bad("page_token", "page_token is malformed")
        return int(request.page_token)
    return 0


# -------------------------------------------------------------------------------------------- settlement


def submission(request: lp.SubmitRequest, tau_window_ms: int, at: str = "") -> Submission:
    """A Submit request checked and flattened for the script; ``at`` prefixes field names (a batch item's)."""
    t = request.trajectory
    if not request.HasField("trajectory"):
        raise _bad(f"{at}trajectory", f"{at}trajectory is required")
    lease_id(t.lease_id, f"{at}trajectory.lease_id")
    _id(f"{at}trajectory.trajectory_id", t.trajectory_id)
    _id(f"{at}holder", request.holder)
    if t.lease_version < 0:
        raise _bad(f"{at}trajectory.lease_version", f"{at}trajectory.lease_version must be >= 0, got {t.lease_version}")
    if t.status not in common_pb2.TrajectoryStatus.values() or t.status == common_pb2.TRAJECTORY_STATUS_UNSPECIFIED:
        raise _bad(
            f"{at}trajectory.status", f"{at}trajectory.status is required (OK, CANCELLED, INFRA_FAILURE or TIMEOUT)"
        )
    ok = t.status == common_pb2.TRAJECTORY_STATUS_OK
    if ok and not t.turns:
        raise _bad(f"{at}trajectory.turns", f"{at}trajectory.turns is required")
    versions, problem = codec.turn_versions(t)
    if problem:
        raise _bad(f"{at}trajectory.turns", f"{at}{problem}")
    if ok and not t.version_hashes:
        raise _bad(
            f"{at}trajectory.version_hashes",
            f"{at}trajectory.version_hashes is required (version -> h(v) of every version used)",
        )
    missing = versions - set(t.version_hashes)
    if missing:
        raise _bad(
            f"{at}trajectory.version_hashes",
            f"{at}trajectory.version_hashes lacks versions {sorted(missing)[:10]} used by its turns",
        )
    for v, h in t.version_hashes.items():
        if v < 0 or not h or len(h) > 64:
            raise _bad(f"{at}trajectory.version_hashes", f"{at}trajectory.version_hashes[{v}] is malformed")
    scored, reward = False, 0.0
    if request.HasField("reward"):
        if request.reward.trajectory_id and request.reward.trajectory_id != t.trajectory_id:
            raise _bad(f"{at}reward.trajectory_id", f"{at}reward.trajectory_id names another trajectory")
        scored, reward = True, request.reward.reward
    elif t.scored:
        scored, reward = True, t.reward
    if not math.isfinite(reward):
        raise _bad(f"{at}reward", f"{at}reward must be finite")
    work: list[WorkReport] = []
    for i, w in enumerate(request.work):
        _id(f"{at}work[{i}].actor_id", w.actor_id)
        if w.tokens < 0:
            raise _bad(f"{at}work[{i}].tokens", f"{at}work[{i}].tokens must be >= 0")
        generation_s = duration(f"{at}work[{i}].generation_time", w.generation_time)
        work.append(WorkReport(w.actor_id, w.tokens, int(generation_s * 1000)))
    return Submission(
        lease_id=t.lease_id,
        trajectory_id=t.trajectory_id,
        holder=request.holder,
        lease_version=t.lease_version,
        ok=ok,
        token_versions=(min(versions), max(versions)) if versions else None,
        scored=scored,
        reward=reward,
        trajectory=t.SerializeToString(),
        tau_window_ms=tau_window_ms,
        version_hashes=dict(t.version_hashes),
        work=work,
        generated_tokens=sum(len(turn.action_token_ids) for turn in t.turns),
    )


def submit_batch(request: lp.SubmitBatchRequest) -> None:
    """The batch as a whole (each item is checked alone by :func:`submission`)."""
    n = len(request.submissions)
    if not 1 <= n <= MAX_BATCH_ITEMS:
        raise _bad("submissions", f"submissions must hold 1 to {MAX_BATCH_ITEMS} results, got {n}")
    leases: dict[str, int] = {}
    trajectories: dict[str, int] = {}
    for i, sub in enumerate(request.submissions):
        t = sub.trajectory
        for seen, key, what in ((leases, t.lease_id, "lease"), (trajectories, t.trajectory_id, "trajectory")):
            if key and key in seen:
                raise _bad(
                    f"submissions[{i}]",
                    f"submissions[{i}] names {what} {errors.shorten(key)} as submissions[{seen[key]}] does:"
                    " one result per lease and trajectory in a batch",
                )
            seen[key] = i


def record_reward(request: lp.RecordRewardRequest) -> None:
    _id("trajectory_id", request.trajectory_id)
    if not request.failed:
        if not request.HasField("reward"):
            raise _bad("reward", "reward is required unless failed is set")
        if request.reward.trajectory_id and request.reward.trajectory_id != request.trajectory_id:
            raise _bad("reward.trajectory_id", "reward.trajectory_id names another trajectory")
        if not math.isfinite(request.reward.reward):
            raise _bad("reward", "reward must be finite")


def list_unscored(request: lp.ListUnscoredRequest) -> tuple[int, tuple[int, str] | None]:
    """The most samples of the page and where it starts (``page_token``: admission ms and trajectory id)."""
    _id("holder_prefix", request.holder_prefix, required=False)
    if not 0 <= request.max_samples <= MAX_LEASES_PER_CALL:
        raise _bad("max_samples", f"max_samples must be within [1, {MAX_LEASES_PER_CALL}] (0: 100)")
    after = None
    if request.page_token:
        at, _, tid = request.page_token.partition(":")
        if not at.isdigit() or not ids.is_id(tid):
            raise _bad("page_token", "page_token is malformed")
        after = (int(at), tid)
    return request.max_samples or 100, after


def get_batch(request: lp.GetBatchRequest) -> float:
    """The wait asked for (seconds)."""
    if request.step < 0:
        raise _bad("step", "step must be >= 0")
    if not 1 <= request.batch_size <= MAX_BATCH:
        raise _bad("batch_size", f"batch_size must be within [1, {MAX_BATCH}], got {request.batch_size}")
    if request.current_version < 0:
        raise _bad("current_version", "current_version must be >= 0")
    if not 0 <= request.max_groups <= MAX_BATCH:
        raise _bad("max_groups", f"max_groups must be within [0, {MAX_BATCH}] (0: no bound), got {request.max_groups}")
    return duration("wait", request.wait)


def ack_batch(request: lp.AckBatchRequest) -> None:
    if request.step < 0:
        raise _bad("step", "step must be >= 0")
    if not request.batch_id or len(request.batch_id) > 256:
        raise _bad("batch_id", "batch_id is required")


def status(request: lp.LedgerStatusRequest) -> None:
    if not 0 <= request.versions_limit <= 10_000:
        raise _bad("versions_limit", "versions_limit must be within [0, 10000]")
