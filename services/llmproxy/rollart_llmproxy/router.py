"""Routing decisions: which actor generates a turn (and which one prefills it under PD).

Pure bookkeeping, no I/O, so that every rule is unit-testable. The order of preference for a turn:

1. the trajectory's sticky actor (prefix-cache locality), while it is usable and inside the task's affinity
   scope (or nothing inside the scope is usable);
2. the request's preferred actor (e.g. the lease's assigned actor), under the same conditions;
3. the least loaded usable actor (outstanding tokens, then outstanding requests, ties rotated) in the scope;
4. with fallback allowed: the least loaded usable actor in a compatible pool, then anywhere.

A rule with ``auto`` names no place: the task's profile does (``TaskProfiles``). A task whose turns prefill
many more tokens than they decode (many turns re-prefilling a growing context) is prefill-heavy and goes to
compute-kind pools (or, when a pool of bandwidth kind has PD enabled with compute-kind prefill actors, to
that pool: prefilled on compute, decoded on bandwidth); one that decodes more (few turns, long answers) is
decode-heavy and goes to bandwidth-kind pools; before ``min_turns`` turns it is unclassified and goes
anywhere. With fallback allowed (the default), an auto task leaves its kind when every actor of that kind is
saturated (``saturation_requests`` in flight each) or none is usable; each such turn is counted in its profile
and in the metrics.

Usable means healthy, ready, not draining, not excluded by the caller (an actor that just failed this turn)
and on an admissible version: ``lo <= active_version`` and, when ``hi > 0``, ``active_version <= hi``.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable
from dataclasses import dataclass, field

from rollart.v1 import common_pb2
from rollart.v1 import llmproxy_pb2 as pp

from . import metrics

HEALTHY = pp.PROXY_ACTOR_STATE_HEALTHY
UNHEALTHY = pp.PROXY_ACTOR_STATE_UNHEALTHY
DRAINING = pp.PROXY_ACTOR_STATE_DRAINING

PK = common_pb2.PoolKind
# Compatible pool kinds when a pool names no fallbacks (the resource manager's defaults).
KIND_FALLBACK = {
    PK.POOL_KIND_GPU_COMPUTE: (PK.POOL_KIND_GPU_BANDWIDTH,),
    PK.POOL_KIND_GPU_BANDWIDTH: (PK.POOL_KIND_GPU_COMPUTE,),
    PK.POOL_KIND_CPU: (PK.POOL_KIND_SERVERLESS,),
    PK.POOL_KIND_SERVERLESS: (PK.POOL_KIND_CPU,),
}
GRAVEYARD = 1024  # removed actors remembered for "was any actor ever registered for this task"
# An actor's kind is its pool's (from the resource manager); static actors may carry a "kind:<name>" tag.
KIND_NAMES = {
    "gpu-compute": PK.POOL_KIND_GPU_COMPUTE,
    "gpu-bandwidth": PK.POOL_KIND_GPU_BANDWIDTH,
    "cpu": PK.POOL_KIND_CPU,
    "serverless": PK.POOL_KIND_SERVERLESS,
}
PREFILL_HEAVY, DECODE_HEAVY, UNCLASSIFIED = "prefill-heavy", "decode-heavy", "unclassified"
PROFILE_KIND = {PREFILL_HEAVY: PK.POOL_KIND_GPU_COMPUTE, DECODE_HEAVY: PK.POOL_KIND_GPU_BANDWIDTH}
MAX_PROFILES = 256  # tasks profiled at once (least recently routed forgotten first)
RECENT_TRAJECTORIES = 4096  # per task: trajectory ids remembered to count trajectories
_OPEN = pp.VersionWindow()  # a job's window before its trainer set one: any version


class NoRoute(Exception):
    """No actor can take the turn. ``retryable``: maybe later (UNAVAILABLE); else FAILED_PRECONDITION."""

    def __init__(self, message: str, retryable: bool) -> None:
        super().__init__(message)
        self.retryable = retryable


@dataclass(eq=False)
class ActorEntry:
    actor_id: str
    endpoint: str
    pool: str = ""
    region: str = ""
    hardware: common_pb2.Hardware = field(default_factory=common_pb2.Hardware)
    pd_role: common_pb2.PdRole = common_pb2.PD_ROLE_UNIFIED
    state: pp.ProxyActorState = HEALTHY
    # Where it was learned from: AddActor/config, and/or the resource manager.
    static: bool = False
    from_rm: bool = False
    binding_ids: set[str] = field(default_factory=set)
    # Version state, from its status and from the versions of the tokens it streams.
    active_version: int = 0
    version_known: bool = False
    first_version_seen: int = -1
    # True once a status poll answered and said the engine serves.
    ready: bool = False
    outstanding_requests: int = 0
    outstanding_tokens: int = 0
    tokens_per_s: float = 0.0
    step_allocation: int = 0
    last_error: str = ""
    last_ok: float = 0.0
    model: str = ""
    max_model_len: int = 0
    failures: int = 0
    # time.monotonic() when the first of the current run of failed status polls was sent (0: last one answered).
    failing_since: float = 0.0
    removed: bool = False
    # The actor itself says it drains (a ledger Drain): its sticky trajectories continue, no new ones.
    self_draining: bool = False
    # LoRA fleets shared by several jobs: its own job, and the active version of each job attached besides it.
    job_id: str = ""
    job_versions: dict[str, int] = field(default_factory=dict)

    @property
    def tags(self) -> set[str]:
        return set(self.hardware.tags)

    def routable(self) -> bool:
        return self.state == HEALTHY and self.ready and not self.removed

    def version_of(self, job: str = "") -> int | None:
        """The active version it serves ``job`` with (None: unknown, or it does not serve the job)."""
        if job and job != self.job_id:
            return self.job_versions.get(job)
        return self.active_version if self.version_known else None

    def admits(self, lo: int, hi: int, job: str = "") -> bool:
        v = self.version_of(job)
        return v is not None and v >= lo and (hi <= 0 or v <= hi)

    def observe_version(self, version: int, job: str = "") -> bool:
        """Record an active version (from status or streamed tokens); True when it changed."""
        if job and job != self.job_id:
            changed = self.job_versions.get(job) != version
            self.job_versions[job] = version
            return changed
        if self.first_version_seen < 0:
            self.first_version_seen = version
        changed = not self.version_known or version != self.active_version
        self.version_known = True
        self.active_version = version
        return changed


@dataclass(frozen=True)
class Rule:
    task: str
    pool: str = ""
    binding_id: str = ""
    pool_kind: common_pb2.PoolKind = common_pb2.POOL_KIND_UNSPECIFIED
    hardware_tags: tuple[str, ...] = ()
    allow_fallback: bool = True
    auto: bool = False

    @classmethod
    def from_proto(cls, r: pp.AffinityRule) -> "Rule":
        return cls(r.task, r.pool, r.binding_id, r.pool_kind, tuple(r.hardware_tags), r.allow_fallback, r.auto)

    def to_proto(self) -> pp.AffinityRule:
        return pp.AffinityRule(
            task=self.task,
            pool=self.pool,
            binding_id=self.binding_id,
            pool_kind=self.pool_kind,
            hardware_tags=list(self.hardware_tags),
            allow_fallback=self.allow_fallback,
            auto=self.auto,
        )


def specificity(pattern: str, task: str) -> int | None:
    """How specifically ``pattern`` matches ``task`` (higher wins); None when it does not match."""
    if pattern == task:
        return 1 << 30
    if pattern.endswith("*") and task.startswith(pattern[:-1]):
        return len(pattern)  # "*" -> 1, "gem:*" -> 5, "gem:game:*" -> 10
    return None


def check_pattern(pattern: str) -> str | None:
    """Why an affinity task pattern is invalid, or None."""
    if not pattern:
        return "task is required (an exact tag, a prefix ending in '*', or '*')"
    if "*" in pattern[:-1]:
        return f"task {pattern!r}: '*' may only end the pattern"
    if len(pattern) > 256:
        return "task is longer than 256 characters"
    return None


def check_rule(r: pp.AffinityRule) -> str | None:
    """Why a rule cannot be used (naming the field), or None. Pools need not exist yet: actors may register
    later; a rule that must name an existing pool is checked where the pools are known (``rollart run``)."""
    problem = check_pattern(r.task)
    if problem:
        return problem
    if r.pool_kind not in common_pb2.PoolKind.values():
        return f"pool_kind: unknown kind {r.pool_kind}"
    if r.auto and (r.pool or r.binding_id or r.pool_kind or r.hardware_tags):
        return "auto: an auto rule names no pool, binding_id, pool_kind or hardware_tags (its profile decides)"
    for i, tag in enumerate(r.hardware_tags):
        if not tag or len(tag) > 128 or any(c.isspace() or not c.isprintable() for c in tag):
            return f"hardware_tags[{i}]: a tag is 1-128 printable characters without spaces"
    return None


@dataclass
class AutoSettings:
    """How ``auto`` rules classify tasks (LLMProxyConfig.auto_affinity)."""

    # Prefill-heavy when (prefill tokens per turn) >= prefill_ratio x (decode tokens per turn).
    prefill_ratio: float = 2.0
    # A classified task changes profile only when the ratio crosses prefill_ratio by this factor.
    hysteresis: float = 1.5
    # Turns seen before a task is classified (until then it goes anywhere).
    min_turns: int = 8
    # An actor with this many requests in flight is saturated (0: never; then only "no usable actor" spills).
    saturation_requests: int = 0


@dataclass
class TaskProfile:
    """Moving figures of one task's completed turns (exponential averages over ~64 turns)."""

    task: str
    turns: int = 0
    trajectories: int = 0
    prefill_avg: float = 0.0
    decode_avg: float = 0.0
    profile: str = UNCLASSIFIED
    fallback_turns: int = 0
    last_fallback: str = ""
    recent: OrderedDict[str, None] = field(default_factory=OrderedDict)

    def observe(self, trajectory_id: str, prefill_tokens: int, decode_tokens: int, auto: AutoSettings) -> None:
        self.turns += 1
        if trajectory_id and trajectory_id not in self.recent:
            self.trajectories += 1
            self.recent[trajectory_id] = None
            while len(self.recent) > RECENT_TRAJECTORIES:
                self.recent.popitem(last=False)
        alpha = max(1.0 / self.turns, 1.0 / 64)
        self.prefill_avg += alpha * (max(prefill_tokens, 0) - self.prefill_avg)
        self.decode_avg += alpha * (max(decode_tokens, 0) - self.decode_avg)
        if self.turns < auto.min_turns:
            return
        ratio = self.prefill_avg / max(self.decode_avg, 1.0)
        if self.profile == UNCLASSIFIED:
            self.profile = PREFILL_HEAVY if ratio >= auto.prefill_ratio else DECODE_HEAVY
        elif self.profile == PREFILL_HEAVY and ratio < auto.prefill_ratio / auto.hysteresis:
            self.profile = DECODE_HEAVY
        elif self.profile == DECODE_HEAVY and ratio >= auto.prefill_ratio * auto.hysteresis:
            self.profile = PREFILL_HEAVY

    def to_proto(self) -> pp.TaskProfile:
        return pp.TaskProfile(
            task=self.task,
            profile=self.profile,
            turns=self.turns,
            trajectories=self.trajectories,
            prefill_tokens_per_turn=round(self.prefill_avg, 3),
            decode_tokens_per_turn=round(self.decode_avg, 3),
            turns_per_trajectory=round(self.turns / self.trajectories, 3) if self.trajectories else 0.0,
            kind=PROFILE_KIND.get(self.profile, PK.POOL_KIND_UNSPECIFIED),
            fallback_turns=self.fallback_turns,
            last_fallback=self.last_fallback,
        )


@dataclass
class PoolInfo:
    kind: common_pb2.PoolKind = common_pb2.POOL_KIND_UNSPECIFIED
    fallback_pools: tuple[str, ...] = ()
    up: bool = True


@dataclass
class Route:
    actor: ActorEntry
    reason: pp.RouteReason
    # The pool's PD split when the actor's pool routes through PD (the caller decides by prompt length).
    pd: pp.PdPoolConfig | None = None


class Router:
    def __init__(self, max_sticky: int = 200_000, auto: AutoSettings | None = None) -> None:
        self.auto = auto or AutoSettings()
        # task -> its profile (recently routed tasks only; drives `auto` rules, shown by GetAffinity).
        self.profiles: OrderedDict[str, TaskProfile] = OrderedDict()
        self.actors: dict[str, ActorEntry] = {}
        self.graveyard: OrderedDict[str, ActorEntry] = OrderedDict()
        self.pools: dict[str, PoolInfo] = {}
        # Rules set by SetAffinity/config, and rules derived from resource-manager bindings (affinity_tag).
        self.rules: dict[str, Rule] = {}
        self.derived_rules: dict[str, Rule] = {}
        self.pd: dict[str, pp.PdPoolConfig] = {}
        self.window = pp.VersionWindow()
        self.job_windows: dict[str, pp.VersionWindow] = {}  # per job named by turns (SetVersionWindow job_id)
        self.max_sticky = max_sticky
        # trajectory -> (actor id, prefill actor id or "")
        self.sticky: OrderedDict[str, tuple[str, str]] = OrderedDict()
        # trajectories whose last turn failed on an actor (their next route says RETRY)
        self.retrying: OrderedDict[str, None] = OrderedDict()
        self._turn = 0

    # ------------------------------------------------------------------------------------------ membership

    def add(self, entry: ActorEntry) -> ActorEntry:
        self.graveyard.pop(entry.actor_id, None)
        self.actors[entry.actor_id] = entry
        return entry

    def remove(self, actor_id: str) -> ActorEntry | None:
        entry = self.actors.pop(actor_id, None)
        if entry is not None:
            entry.removed = True
            self.graveyard[actor_id] = entry
            while len(self.graveyard) > GRAVEYARD:
                self.graveyard.popitem(last=False)
        return entry

    # ------------------------------------------------------------------------------------------ affinity

    def rule_for(self, task: str) -> Rule | None:
        best: tuple[int, int] | None = None
        chosen = None
        for explicit, table in ((1, self.rules), (0, self.derived_rules)):
            for pattern, rule in table.items():
                s = specificity(pattern, task)
                if s is None:
                    continue
                key = (s, explicit)
                if best is None or key > best:
                    best, chosen = key, rule
        return chosen

    def kind_of(self, a: ActorEntry) -> common_pb2.PoolKind:
        info = self.pools.get(a.pool)
        if info is not None and info.kind:
            return info.kind
        for tag in a.hardware.tags:
            if tag.startswith("kind:") and tag[5:] in KIND_NAMES:
                return KIND_NAMES[tag[5:]]
        return PK.POOL_KIND_UNSPECIFIED

    def in_scope(self, rule: Rule | None, a: ActorEntry) -> bool:
        if rule is None:
            return True
        if rule.pool and a.pool != rule.pool:
            return False
        if rule.binding_id and rule.binding_id not in a.binding_ids:
            return False
        if rule.pool_kind and self.kind_of(a) != rule.pool_kind:
            return False
        return not rule.hardware_tags or set(rule.hardware_tags) <= a.tags

    def _target_pools(self, rule: Rule, actors: Iterable[ActorEntry]) -> set[str]:
        if rule.pool:
            return {rule.pool}
        if rule.pool_kind:
            named = {name for name, p in self.pools.items() if p.kind == rule.pool_kind}
            return named | {a.pool for a in actors if self.kind_of(a) == rule.pool_kind}
        return {a.pool for a in actors if self.in_scope(rule, a)}

    # ------------------------------------------------------------------------------------------ profiles

    def profile_of(self, task: str, create: bool = False) -> TaskProfile | None:
        p = self.profiles.get(task)
        if p is None and create:
            p = self.profiles[task] = TaskProfile(task)
            while len(self.profiles) > MAX_PROFILES:
                self.profiles.popitem(last=False)
        if p is not None:
            self.profiles.move_to_end(task)
        return p

    def observe_turn(
        self, task: str, trajectory_id: str, usage: common_pb2.GenerationUsage, prefilled: int = -1
    ) -> None:
        """A turn of ``task`` ended: what it prefilled (prompt tokens not served from the prefix cache; under
        PD ``prefilled``, the prefill actor's, since the decode actor received the KV) and decoded. Every task
        is profiled; only ``auto`` rules route by the profile."""
        p = self.profile_of(task, create=True)
        assert p is not None
        before = p.profile
        prefill = prefilled if prefilled >= 0 else usage.prompt_tokens - usage.cached_prompt_tokens
        p.observe(trajectory_id, prefill, usage.completion_tokens, self.auto)
        if p.profile != before:
            metrics.TASK_PROFILE_CHANGES.labels(p.profile).inc()

    def effective_rule(self, task: str, rule: Rule | None) -> Rule | None:
        """An ``auto`` rule becomes a kind rule by the task's profile (None while unclassified)."""
        if rule is None or not rule.auto:
            return rule
        p = self.profile_of(task)
        kind = PROFILE_KIND.get(p.profile if p is not None else UNCLASSIFIED)
        if kind is None:
            return None
        if kind == PK.POOL_KIND_GPU_COMPUTE:
            pd_pool = self._compute_to_bandwidth_pd_pool()
            if pd_pool:  # the operator split prefill (compute kind) from decode (bandwidth kind): use it
                return Rule(task=rule.task, pool=pd_pool, allow_fallback=rule.allow_fallback, auto=True)
        return Rule(task=rule.task, pool_kind=kind, allow_fallback=rule.allow_fallback, auto=True)

    def _compute_to_bandwidth_pd_pool(self) -> str:
        """The first (by name) pool with PD enabled whose decode side is bandwidth-kind and whose prefill actors
        are compute-kind, or "": where a prefill-heavy task gets both kinds' strengths."""
        for name in sorted(self.pd):
            cfg = self._pd_of(name)
            if cfg is None:
                continue
            members = [a for a in self.actors.values() if a.pool == name]
            info = self.pools.get(name)
            kind = info.kind if info is not None and info.kind else (self.kind_of(members[0]) if members else 0)
            prefill = self.prefill_candidates(cfg)
            if kind == PK.POOL_KIND_GPU_BANDWIDTH and any(self.kind_of(a) == PK.POOL_KIND_GPU_COMPUTE for a in prefill):
                return name
        return ""

    def saturated(self, a: ActorEntry) -> bool:
        n = self.auto.saturation_requests
        return n > 0 and a.outstanding_requests >= n

    def _count_fallback(self, task: str, trajectory_id: str, rule: Rule | None, why: str) -> None:
        if rule is None or not trajectory_id:
            return  # no rule to leave; Tokenize (no trajectory) is not a turn
        # Every task's profile counts its turns outside the scope (GetAffinity: a pool-rule task whose pool died
        # shows its fallback too); the metric's label is the profile for auto rules, "rule" otherwise.
        p = self.profile_of(task, create=True)
        assert p is not None
        p.fallback_turns += 1
        p.last_fallback = why
        profile = p.profile if rule.auto else "rule"
        metrics.AFFINITY_FALLBACKS.labels(profile, "saturated" if why.startswith("saturated") else "no_actor").inc()

    def compatible_pools(self, rule: Rule, actors: Iterable[ActorEntry]) -> set[str]:
        """Pools a rule's requests fall back to: the target pools' own fallbacks, else by kind."""
        out: set[str] = set()
        for name in self._target_pools(rule, list(actors)):
            info = self.pools.get(name)
            if info is None:
                continue
            if info.fallback_pools:
                out.update(info.fallback_pools)
            else:
                kinds = KIND_FALLBACK.get(info.kind, ())
                out.update(n for n, p in self.pools.items() if p.kind in kinds)
        return out

    # ------------------------------------------------------------------------------------------ PD

    def _pd_of(self, pool: str) -> pp.PdPoolConfig | None:
        cfg = self.pd.get(pool)
        return cfg if cfg is not None and cfg.enabled else None

    def _serves_decode(self, a: ActorEntry) -> bool:
        cfg = self._pd_of(a.pool)
        if cfg is not None:
            if a.actor_id in cfg.prefill_actor_ids:
                return False
            if cfg.decode_actor_ids:
                return a.actor_id in cfg.decode_actor_ids
        return a.pd_role != common_pb2.PD_ROLE_PREFILL

    def prefill_candidates(self, cfg: pp.PdPoolConfig) -> list[ActorEntry]:
        if cfg.prefill_actor_ids:
            return [self.actors[i] for i in cfg.prefill_actor_ids if i in self.actors]
        return [a for a in self.actors.values() if a.pool == cfg.pool and a.pd_role == common_pb2.PD_ROLE_PREFILL]

    # ------------------------------------------------------------------------------------------ routing

    def window_of(self, job: str = "") -> pp.VersionWindow:
        """The version window of ``job``'s turns (each job trains its own versions)."""
        return self.window if not job else self.job_windows.get(job, _OPEN)

    def bounds(self, min_version: int, job: str = "") -> tuple[int, int]:
        w = self.window_of(job)
        lo = max(w.min_version, min_version, 0)
        return lo, w.max_version

    def usable(self, a: ActorEntry, lo: int, hi: int, exclude: frozenset[str] | set[str], job: str = "") -> bool:
        return a.routable() and a.admits(lo, hi, job) and a.actor_id not in exclude

    def least_loaded(self, candidates: list[ActorEntry]) -> ActorEntry:
        best = min((a.outstanding_tokens, a.outstanding_requests) for a in candidates)
        tied = [a for a in candidates if (a.outstanding_tokens, a.outstanding_requests) == best]
        self._turn += 1
        return tied[self._turn % len(tied)]

    def route(
        self,
        *,
        trajectory_id: str,
        task: str,
        preferred_actor_id: str = "",
        min_version: int = 0,
        exclude: frozenset[str] | set[str] = frozenset(),
        job: str = "",
    ) -> Route:
        """``job``: several LoRA jobs on one fleet; only actors serving it, at a version in its window, qualify."""
        lo, hi = self.bounds(min_version, job)
        if hi > 0 and lo > hi:
            raise NoRoute(f"min_version {lo} is above the proxy's version window (max {hi})", retryable=False)
        rule = self.effective_rule(task, self.rule_for(task))
        actors = list(self.actors.values())
        usable = [a for a in actors if self.usable(a, lo, hi, exclude, job) and self._serves_decode(a)]
        in_scope = [a for a in usable if self.in_scope(rule, a)]
        # Actors that drain by themselves keep their sticky trajectories but take no new ones.
        fresh = [a for a in usable if not a.self_draining]
        fresh_in_scope = [a for a in in_scope if not a.self_draining]

        def acceptable(actor_id: str) -> ActorEntry | None:
            a = self.actors.get(actor_id)
            if a is None or a not in usable:
                return None
            return a if (a in in_scope or not in_scope) else None

        sticky = self.sticky.get(trajectory_id)
        if sticky is not None:
            a = acceptable(sticky[0])
            if a is not None and (a in in_scope or (rule is not None and rule.allow_fallback)):
                self.sticky.move_to_end(trajectory_id)
                if a not in in_scope:
                    self._count_fallback(task, trajectory_id, rule, "no usable actor in scope")
                return Route(a, pp.ROUTE_REASON_STICKY, self._pd_of(a.pool))
        if preferred_actor_id:
            a = acceptable(preferred_actor_id)
            if a is not None and (a in in_scope or (rule is not None and rule.allow_fallback)):
                if a not in in_scope:
                    self._count_fallback(task, trajectory_id, rule, "no usable actor in scope")
                return Route(a, pp.ROUTE_REASON_PREFERRED, self._pd_of(a.pool))
        retry = trajectory_id in self.retrying
        spill = (
            rule is not None
            and rule.allow_fallback
            and bool(fresh_in_scope)
            and all(self.saturated(a) for a in fresh_in_scope)
        )
        if spill:
            # Every actor of the scope is saturated: an unsaturated one elsewhere takes the turn, if any.
            assert rule is not None
            outside = [a for a in fresh if a not in fresh_in_scope and not self.saturated(a)]
            compatible = self.compatible_pools(rule, actors)
            tier = [a for a in outside if a.pool in compatible] or outside
            if tier:
                a = self.least_loaded(tier)
                self._count_fallback(task, trajectory_id, rule, f"saturated: {len(fresh_in_scope)} actor(s) in scope")
                return Route(a, pp.ROUTE_REASON_RETRY if retry else pp.ROUTE_REASON_FALLBACK, self._pd_of(a.pool))
        if fresh_in_scope:
            a = self.least_loaded(fresh_in_scope)
            reason = pp.ROUTE_REASON_RETRY if retry else pp.ROUTE_REASON_LEAST_LOADED
            return Route(a, reason, self._pd_of(a.pool))
        if rule is not None and rule.allow_fallback and fresh:
            compatible = self.compatible_pools(rule, actors)
            tier = [a for a in fresh if a.pool in compatible] or fresh
            a = self.least_loaded(tier)
            self._count_fallback(task, trajectory_id, rule, "no usable actor in scope")
            return Route(a, pp.ROUTE_REASON_RETRY if retry else pp.ROUTE_REASON_FALLBACK, self._pd_of(a.pool))
        if job and not any(a.version_of(job) is not None for a in actors):
            raise NoRoute(f"no actor serves job {job!r} (it is not attached to any)", retryable=True)
        raise self._no_route(task, rule, lo, hi, exclude)

    def _no_route(self, task: str, rule: Rule | None, lo: int, hi: int, exclude) -> NoRoute:
        known = [*self.actors.values(), *self.graveyard.values()]
        scope = known if (rule is None or rule.allow_fallback) else [a for a in known if self.in_scope(rule, a)]
        where = f"task {task!r}" + (f" (affinity rule {rule.task!r})" if rule is not None else "")
        if not scope:
            return NoRoute(f"no actor has ever been registered for {where}", retryable=False)
        if hi > 0 and all(0 <= a.first_version_seen and a.first_version_seen > hi for a in scope):
            # Versions only grow: none of these actors will ever be inside the window again.
            return NoRoute(f"every actor for {where} is past the version window's max {hi}", retryable=False)
        states = {}
        for a in scope:
            if a.removed:
                why = "removed"
            elif a.actor_id in exclude:
                why = "failed this turn"
            elif a.state != HEALTHY:
                why = pp.ProxyActorState.Name(a.state).removeprefix("PROXY_ACTOR_STATE_").lower()
            elif not a.ready:
                why = "not ready"
            elif not a.admits(lo, hi):
                why = f"version {a.active_version if a.version_known else '?'} outside [{lo}, {hi or 'inf'}]"
            elif a.self_draining:
                why = "draining"
            else:
                why = "prefill only"
            states[a.actor_id] = why
        shown = ", ".join(f"{k}: {v}" for k, v in list(states.items())[:8])
        return NoRoute(f"no usable actor for {where} right now ({shown})", retryable=True)

    def choose_prefill(
        self, trajectory_id: str, cfg: pp.PdPoolConfig, lo: int, hi: int, exclude: frozenset[str] | set[str]
    ) -> ActorEntry | None:
        candidates = [a for a in self.prefill_candidates(cfg) if self.usable(a, lo, hi, exclude)]
        if not candidates:
            return None
        sticky = self.sticky.get(trajectory_id)
        if sticky is not None and sticky[1]:
            for a in candidates:
                if a.actor_id == sticky[1]:
                    return a
        return self.least_loaded(candidates)

    # ------------------------------------------------------------------------------------------ stickiness

    def stick(self, trajectory_id: str, actor_id: str, prefill_actor_id: str = "") -> None:
        self.sticky[trajectory_id] = (actor_id, prefill_actor_id)
        self.sticky.move_to_end(trajectory_id)
        while len(self.sticky) > self.max_sticky:
            self.sticky.popitem(last=False)
        self.retrying.pop(trajectory_id, None)

    def mark_failed(self, trajectory_id: str, actor_id: str) -> None:
        """The trajectory's actor failed: forget the stickiness, and say RETRY on its next route."""
        entry = self.sticky.get(trajectory_id)
        if entry is not None and entry[0] == actor_id:
            del self.sticky[trajectory_id]
        self.retrying[trajectory_id] = None
        while len(self.retrying) > self.max_sticky:
            self.retrying.popitem(last=False)

    def sticky_counts(self) -> dict[str, int]:
        counts: dict[str, int] = {}
        for actor_id, _prefill in self.sticky.values():
            counts[actor_id] = counts.get(actor_id, 0) + 1
        return counts
