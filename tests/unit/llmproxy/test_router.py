"""Routing rules of the LLMProxy (pure: no processes, no network)."""

from __future__ import annotations

import pytest

from rollart.v1 import common_pb2
from rollart.v1 import llmproxy_pb2 as pp
from rollart_llmproxy.router import (
    DRAINING,
    UNHEALTHY,
    ActorEntry,
    AutoSettings,
    NoRoute,
    PoolInfo,
    Router,
    Rule,
    check_pattern,
    check_rule,
    specificity,
)

PK = common_pb2.PoolKind


def actor(router: Router, aid: str, pool: str = "p", version: int = 0, tags=(), **kw) -> ActorEntry:
    a = ActorEntry(
        actor_id=aid,
        endpoint=f"127.0.0.1:{1000 + len(router.actors)}",
        pool=pool,
        hardware=common_pb2.Hardware(tags=list(tags)),
        ready=True,
        **kw,
    )
    a.observe_version(version)
    return router.add(a)


def test_specificity_prefers_exact_then_longest_prefix():
    assert specificity("math", "math") > specificity("m*", "math") > specificity("*", "math")
    assert specificity("gem:game:*", "gem:game:Sokoban") > specificity("gem:*", "gem:game:Sokoban")
    assert specificity("code", "math") is None
    assert specificity("gem:*", "gemx") is None
    assert check_pattern("a*b") and check_pattern("") and check_pattern("gem:*") is None


def test_least_loaded_then_sticky():
    r = Router()
    a, b = actor(r, "a"), actor(r, "b")
    a.outstanding_tokens = 500
    route = r.route(trajectory_id="t", task="")
    assert route.actor is b and route.reason == pp.ROUTE_REASON_LEAST_LOADED
    r.stick("t", "b")
    b.outstanding_tokens = 10_000  # stickiness beats load (prefix-cache locality)
    route = r.route(trajectory_id="t", task="")
    assert route.actor is b and route.reason == pp.ROUTE_REASON_STICKY
    # Another trajectory goes to the less loaded actor.
    assert r.route(trajectory_id="u", task="").actor is a


def test_ties_rotate_over_equally_loaded_actors():
    r = Router()
    for name in "abc":
        actor(r, name)
    chosen = {r.route(trajectory_id=f"t{i}", task="").actor.actor_id for i in range(6)}
    assert chosen == {"a", "b", "c"}


def test_sticky_actor_unhealthy_or_excluded_is_replaced():
    r = Router()
    a, b = actor(r, "a"), actor(r, "b")
    r.stick("t", "a")
    a.state = UNHEALTHY
    assert r.route(trajectory_id="t", task="").actor is b
    a.state = DRAINING
    assert r.route(trajectory_id="t", task="").actor is b
    a.state = pp.PROXY_ACTOR_STATE_HEALTHY
    assert r.route(trajectory_id="t", task="").actor is a
    assert r.route(trajectory_id="t", task="", exclude={"a"}).actor is b


def test_mark_failed_drops_stickiness_and_says_retry():
    r = Router()
    actor(r, "a")
    b = actor(r, "b")
    r.stick("t", "a")
    r.mark_failed("t", "a")
    route = r.route(trajectory_id="t", task="", exclude={"a"})
    assert route.actor is b and route.reason == pp.ROUTE_REASON_RETRY
    r.stick("t", "b")
    assert r.route(trajectory_id="t", task="").reason == pp.ROUTE_REASON_STICKY


def test_preferred_actor_when_no_sticky():
    r = Router()
    actor(r, "a")
    b = actor(r, "b")
    b.outstanding_tokens = 99
    route = r.route(trajectory_id="t", task="", preferred_actor_id="b")
    assert route.actor is b and route.reason == pp.ROUTE_REASON_PREFERRED
    # An unknown or unusable preferred actor is ignored.
    b.ready = False
    assert r.route(trajectory_id="t", task="", preferred_actor_id="b").actor.actor_id == "a"


def test_affinity_rule_restricts_to_its_pool_and_most_specific_wins():
    r = Router()
    r.pools = {"h800": PoolInfo(PK.POOL_KIND_GPU_COMPUTE), "h20": PoolInfo(PK.POOL_KIND_GPU_BANDWIDTH)}
    c = actor(r, "c", pool="h800")
    d = actor(r, "d", pool="h20")
    c.outstanding_tokens = 1000  # load would pick d; affinity must win
    r.rules = {
        "gem:*": Rule("gem:*", pool="h20"),
        "gem:game:prefill*": Rule("gem:game:prefill*", pool="h800"),
        "*": Rule("*", pool_kind=PK.POOL_KIND_GPU_COMPUTE),
    }
    assert r.route(trajectory_id="1", task="gem:game:Sokoban").actor is d
    assert r.route(trajectory_id="2", task="gem:game:prefill-heavy").actor is c
    assert r.route(trajectory_id="3", task="math").actor is c  # "*" -> compute kind
    assert r.rule_for("gem:x").pool == "h20"


def test_explicit_rules_beat_binding_derived_rules_and_bindings_scope():
    r = Router()
    a = actor(r, "a", pool="p1")
    b = actor(r, "b", pool="p2")
    a.binding_ids = {"math-actors"}
    r.derived_rules = {"math": Rule("math", binding_id="math-actors", allow_fallback=False)}
    b.outstanding_tokens = -1  # would win on load
    assert r.route(trajectory_id="t", task="math").actor is a
    r.rules = {"math": Rule("math", pool="p2")}
    assert r.route(trajectory_id="u", task="math").actor is b


def test_hardware_tags_must_all_be_present():
    r = Router()
    actor(r, "a", tags=["decode"])
    b = actor(r, "b", tags=["decode", "avx512"])
    r.rules = {"x": Rule("x", hardware_tags=("decode", "avx512"), allow_fallback=False)}
    assert r.route(trajectory_id="t", task="x").actor is b


def test_fallback_to_compatible_pool_then_anywhere():
    r = Router()
    r.pools = {
        "h20": PoolInfo(PK.POOL_KIND_GPU_BANDWIDTH),
        "h800": PoolInfo(PK.POOL_KIND_GPU_COMPUTE),
        "cpu": PoolInfo(PK.POOL_KIND_CPU),
    }
    d = actor(r, "d", pool="h20")
    c = actor(r, "c", pool="h800")
    x = actor(r, "x", pool="cpu")
    x.outstanding_tokens = -5  # least loaded overall, but not compatible
    r.rules = {"decode": Rule("decode", pool="h20", allow_fallback=True)}
    assert r.route(trajectory_id="1", task="decode").actor is d
    d.state = UNHEALTHY
    route = r.route(trajectory_id="2", task="decode")
    assert route.actor is c and route.reason == pp.ROUTE_REASON_FALLBACK
    c.state = UNHEALTHY
    assert r.route(trajectory_id="3", task="decode").actor is x
    # Without fallback: no route, and it is retryable (actors exist, just not usable now).
    r.rules = {"decode": Rule("decode", pool="h20", allow_fallback=False)}
    with pytest.raises(NoRoute) as err:
        r.route(trajectory_id="4", task="decode")
    assert err.value.retryable and "unhealthy" in str(err.value)


def test_pool_named_fallbacks_win_over_kind_defaults():
    r = Router()
    r.pools = {
        "a": PoolInfo(PK.POOL_KIND_GPU_BANDWIDTH, ("z",)),
        "b": PoolInfo(PK.POOL_KIND_GPU_COMPUTE),
        "z": PoolInfo(PK.POOL_KIND_CPU),
    }
    actor(r, "a1", pool="a").state = UNHEALTHY
    b1 = actor(r, "b1", pool="b")
    z1 = actor(r, "z1", pool="z")
    b1.outstanding_tokens = -1
    r.rules = {"t": Rule("t", pool="a")}
    assert r.route(trajectory_id="1", task="t").actor is z1


def test_sticky_outside_scope_is_left_when_the_scope_recovers():
    r = Router()
    d = actor(r, "d", pool="h20")
    c = actor(r, "c", pool="h800")
    r.rules = {"decode": Rule("decode", pool="h20")}
    d.state = UNHEALTHY
    assert r.route(trajectory_id="t", task="decode").actor is c
    r.stick("t", "c")
    assert r.route(trajectory_id="t", task="decode").reason == pp.ROUTE_REASON_STICKY  # still no h20 actor
    d.state = pp.PROXY_ACTOR_STATE_HEALTHY
    assert r.route(trajectory_id="t", task="decode").actor is d


def test_version_window_and_request_min_version():
    r = Router()
    old = actor(r, "old", version=3)
    new = actor(r, "new", version=5)
    new.outstanding_tokens = 100
    assert r.route(trajectory_id="1", task="").actor is old
    assert r.route(trajectory_id="2", task="", min_version=4).actor is new
    r.window = pp.VersionWindow(min_version=4)
    assert r.route(trajectory_id="3", task="").actor is new
    r.window = pp.VersionWindow(min_version=0, max_version=3)
    assert r.route(trajectory_id="4", task="").actor is old
    with pytest.raises(NoRoute) as err:
        r.route(trajectory_id="5", task="", min_version=4)
    assert not err.value.retryable  # min above the window's max: never satisfiable


def test_unknown_version_is_not_routable():
    r = Router()
    a = r.add(ActorEntry(actor_id="a", endpoint="x:1", ready=True))
    with pytest.raises(NoRoute) as err:
        r.route(trajectory_id="t", task="")
    assert err.value.retryable
    a.observe_version(0)
    assert r.route(trajectory_id="t", task="").actor is a


def test_no_actor_ever_is_a_precondition_failure_and_past_window_too():
    r = Router()
    with pytest.raises(NoRoute) as err:
        r.route(trajectory_id="t", task="math")
    assert not err.value.retryable
    a = actor(r, "a", version=7)
    r.window = pp.VersionWindow(min_version=1, max_version=5)
    with pytest.raises(NoRoute) as err:
        r.route(trajectory_id="t", task="math")
    assert not err.value.retryable and "past the version window" in str(err.value)
    # Below the window (it will catch up): retryable.
    r.window = pp.VersionWindow(min_version=9)
    with pytest.raises(NoRoute) as err:
        r.route(trajectory_id="t", task="math")
    assert err.value.retryable
    # A removed actor still counts as "registered once" (its task may come back).
    r.window = pp.VersionWindow()
    r.remove("a")
    assert a.removed
    with pytest.raises(NoRoute) as err:
        r.route(trajectory_id="t", task="math")
    assert err.value.retryable and "removed" in str(err.value)


def test_self_draining_actor_keeps_sticky_but_gets_no_new_trajectories():
    r = Router()
    a, b = actor(r, "a"), actor(r, "b")
    r.stick("t", "a")
    a.self_draining = True
    b.outstanding_tokens = 10**6
    assert r.route(trajectory_id="t", task="").actor is a
    assert r.route(trajectory_id="new", task="").actor is b


def test_pd_split_decode_side_and_prefill_choice():
    r = Router()
    p1 = actor(r, "p1", pool="pd", pd_role=common_pb2.PD_ROLE_PREFILL)
    p2 = actor(r, "p2", pool="pd", pd_role=common_pb2.PD_ROLE_PREFILL)
    d1 = actor(r, "d1", pool="pd", pd_role=common_pb2.PD_ROLE_DECODE)
    p1.outstanding_tokens = p2.outstanding_tokens = -10  # prefill actors are never decode targets
    r.pd = {"pd": pp.PdPoolConfig(pool="pd", enabled=True, min_prompt_tokens=64)}
    route = r.route(trajectory_id="t", task="")
    assert route.actor is d1 and route.pd is not None and route.pd.min_prompt_tokens == 64
    p1.outstanding_tokens = 50
    assert r.choose_prefill("t", route.pd, 0, 0, set()) is p2
    r.stick("t", "d1", "p1")  # prefill stickiness (its prefix cache) beats load
    assert r.choose_prefill("t", route.pd, 0, 0, set()) is p1
    assert r.choose_prefill("t", route.pd, 0, 0, {"p1"}) is p2
    # Explicit lists win over roles.
    r.pd["pd"] = pp.PdPoolConfig(pool="pd", enabled=True, prefill_actor_ids=["d1"], decode_actor_ids=["p2"])
    route = r.route(trajectory_id="u", task="")
    assert route.actor is p2
    assert r.choose_prefill("u", route.pd, 0, 0, set()) is d1
    # Disabled: no PD, prefill-role actors still do not decode.
    r.pd["pd"].enabled = False
    route = r.route(trajectory_id="v", task="")
    assert route.actor is d1 and route.pd is None


def test_sticky_table_is_bounded_lru():
    r = Router(max_sticky=3)
    actor(r, "a")
    for i in range(5):
        r.stick(f"t{i}", "a")
    assert list(r.sticky) == ["t2", "t3", "t4"]
    r.route(trajectory_id="t2", task="")  # a hit refreshes it
    r.stick("t5", "a")
    assert "t2" in r.sticky and "t3" not in r.sticky
    assert r.sticky_counts() == {"a": 3}


# ------------------------------------------------------------------------------------------ auto affinity


def usage(prompt: int, completion: int, cached: int = 0) -> common_pb2.GenerationUsage:
    return common_pb2.GenerationUsage(prompt_tokens=prompt, completion_tokens=completion, cached_prompt_tokens=cached)


def two_kinds(**auto) -> tuple[Router, ActorEntry, ActorEntry]:
    r = Router(auto=AutoSettings(min_turns=4, **auto))
    r.pools = {"h800": PoolInfo(PK.POOL_KIND_GPU_COMPUTE), "h20": PoolInfo(PK.POOL_KIND_GPU_BANDWIDTH)}
    return r, actor(r, "c", pool="h800"), actor(r, "b", pool="h20")


def test_auto_classifies_tasks_by_prefill_versus_decode_and_routes_by_kind():
    r, c, b = two_kinds()
    r.rules = {"*": Rule("*", auto=True)}
    # Unclassified: any actor (both get turns).
    assert {r.route(trajectory_id=f"u{i}", task="swe").actor.actor_id for i in range(4)} == {"c", "b"}
    for i in range(4):  # many turns per trajectory, long uncached observations, short actions
        r.observe_turn("swe", f"s{i // 2}", usage(prompt=2000 + 2000 * i, completion=20, cached=2000 * i))
        r.observe_turn("math", f"m{i}", usage(prompt=300, completion=2048))
    assert r.route(trajectory_id="x", task="swe").actor is c
    assert r.route(trajectory_id="y", task="math").actor is b
    profiles = {p.task: p for p in (x.to_proto() for x in r.profiles.values())}
    assert profiles["swe"].profile == "prefill-heavy" and profiles["swe"].kind == PK.POOL_KIND_GPU_COMPUTE
    assert profiles["swe"].turns_per_trajectory == 2.0 and profiles["swe"].prefill_tokens_per_turn == 2000
    assert profiles["math"].profile == "decode-heavy" and profiles["math"].kind == PK.POOL_KIND_GPU_BANDWIDTH
    assert profiles["math"].turns_per_trajectory == 1.0


def test_auto_profile_changes_only_past_the_hysteresis():
    r, _c, _b = two_kinds(prefill_ratio=2.0, hysteresis=1.5)
    for i in range(4):
        r.observe_turn("t", f"t{i}", usage(300, 100))  # ratio 3: prefill-heavy
    assert r.profiles["t"].profile == "prefill-heavy"
    for i in range(4):
        r.observe_turn("t", f"t{i}", usage(180, 100))  # the average drifts to ~1.9 (< 2, > 2/1.5): kept
    assert r.profiles["t"].profile == "prefill-heavy"
    for i in range(40):
        r.observe_turn("t", f"t{i}", usage(50, 100))
    assert r.profiles["t"].profile == "decode-heavy"


def test_auto_falls_back_when_its_kind_is_gone_or_saturated_and_says_so():
    r, c, b = two_kinds(saturation_requests=2)
    r.rules = {"*": Rule("*", auto=True)}
    for i in range(4):
        r.observe_turn("math", f"m{i}", usage(300, 2048))
    b.outstanding_requests = 2  # the only bandwidth actor is saturated: spill to the compute one
    route = r.route(trajectory_id="m9", task="math")
    assert route.actor is c and route.reason == pp.ROUTE_REASON_FALLBACK
    assert r.profiles["math"].fallback_turns == 1 and r.profiles["math"].last_fallback.startswith("saturated")
    c.outstanding_requests = 5  # both saturated: stay in scope (nowhere better to go)
    assert r.route(trajectory_id="m10", task="math").actor is b
    b.outstanding_requests = 0
    b.state = UNHEALTHY  # the bandwidth pool died: its task moves to the compute pool
    route = r.route(trajectory_id="m11", task="math")
    assert route.actor is c and route.reason == pp.ROUTE_REASON_FALLBACK
    assert r.profiles["math"].fallback_turns == 2 and r.profiles["math"].last_fallback == "no usable actor in scope"
    r.rules = {"*": Rule("*", auto=True, allow_fallback=False)}
    with pytest.raises(NoRoute):
        r.route(trajectory_id="m12", task="math")


def test_a_pool_rule_task_whose_pool_died_falls_back_and_its_profile_counts_it():
    r, c, b = two_kinds()
    r.rules = {"arith": Rule("arith", pool="h20", allow_fallback=True)}
    assert r.route(trajectory_id="a1", task="arith").actor is b
    assert "arith" not in r.profiles  # nothing left its scope yet
    b.state = UNHEALTHY  # every actor of the task's pool is gone: the compute pool takes its turns
    route = r.route(trajectory_id="a2", task="arith")
    assert route.actor is c and route.reason == pp.ROUTE_REASON_FALLBACK
    p = r.profiles["arith"]
    assert p.fallback_turns == 1 and p.last_fallback == "no usable actor in scope" and p.profile == "unclassified"
    assert p.to_proto().fallback_turns == 1  # what GetAffinity shows
    r.rules = {"arith": Rule("arith", pool="h20", allow_fallback=False)}
    with pytest.raises(NoRoute) as exc:
        r.route(trajectory_id="a3", task="arith")
    assert exc.value.retryable and "no usable actor for task 'arith'" in str(exc.value)
    assert r.profiles["arith"].fallback_turns == 1


def test_kind_of_static_actors_comes_from_their_kind_tag():
    r = Router()
    x = actor(r, "x", pool="static", tags=["kind:gpu-compute"])
    y = actor(r, "y", pool="static", tags=["kind:bogus"])
    assert r.kind_of(x) == PK.POOL_KIND_GPU_COMPUTE and r.kind_of(y) == PK.POOL_KIND_UNSPECIFIED
    r.rules = {"t": Rule("t", pool_kind=PK.POOL_KIND_GPU_COMPUTE, allow_fallback=False)}
    assert {r.route(trajectory_id=f"t{i}", task="t").actor.actor_id for i in range(4)} == {"x"}


def test_check_rule_names_the_field():
    assert check_rule(pp.AffinityRule(task="*", auto=True)) is None
    assert "auto" in check_rule(pp.AffinityRule(task="*", auto=True, pool="h20"))
    assert "pool_kind" in check_rule(pp.AffinityRule(task="*", pool_kind=99))
    assert "hardware_tags[1]" in check_rule(pp.AffinityRule(task="*", hardware_tags=["ok", "a b"]))
    assert "task" in check_rule(pp.AffinityRule(task=""))


def test_profiles_are_bounded():
    r = Router()
    for i in range(300):
        r.observe_turn(f"task-{i}", "t", usage(1, 1))
    assert len(r.profiles) == 256 and "task-299" in r.profiles and "task-0" not in r.profiles


def test_auto_sends_a_prefill_heavy_task_through_a_compute_to_bandwidth_pd_split():
    r, c, b = two_kinds()
    r.rules = {"*": Rule("*", auto=True)}
    for i in range(4):
        r.observe_turn("swe", f"s{i}", usage(prompt=2000, completion=20))
    assert r.route(trajectory_id="x", task="swe").actor is c  # no PD split: the compute kind
    r.pd = {"h20": pp.PdPoolConfig(pool="h20", enabled=True, prefill_actor_ids=["c"])}
    route = r.route(trajectory_id="y", task="swe")
    assert route.actor is b and route.pd is not None  # decoded on bandwidth, prefilled on compute
    assert r.choose_prefill("y", route.pd, 0, 0, set()) is c
    r.pd = {"h20": pp.PdPoolConfig(pool="h20", enabled=True, prefill_actor_ids=["b"])}  # not compute-kind prefill
    assert r.route(trajectory_id="z", task="swe").actor is c


# ------------------------------------------------------------------------------- several jobs on one fleet


def test_a_jobs_turn_goes_only_to_actors_serving_it_at_a_version_in_its_window():
    r = Router()
    a = actor(r, "a", version=3, job_id="own")
    b = actor(r, "b", version=3, job_id="own")
    a.observe_version(7, "job-b")  # job-b attached to a only
    assert a.version_of("job-b") == 7 and b.version_of("job-b") is None
    assert a.version_of("own") == a.version_of("") == 3
    for i in range(4):
        assert r.route(trajectory_id=f"t{i}", task="x", job="job-b").actor is a
    b.observe_version(5, "job-b")
    r.job_windows["job-b"] = pp.VersionWindow(min_version=6)  # job-b's trainer needs >= 6: b (on 5) is out
    assert {r.route(trajectory_id=f"u{i}", task="x", job="job-b").actor.actor_id for i in range(4)} == {"a"}
    # The own job's window is not job-b's: its turns still go to both.
    assert {r.route(trajectory_id=f"v{i}", task="x", min_version=3).actor.actor_id for i in range(4)} == {"a", "b"}
    with pytest.raises(NoRoute) as err:
        r.route(trajectory_id="w", task="x", job="job-c")
    assert err.value.retryable and "no actor serves job 'job-c'" in str(err.value)


def test_a_sticky_actor_that_dropped_the_job_is_left():
    r = Router()
    a, b = actor(r, "a"), actor(r, "b")
    a.observe_version(1, "j")
    b.observe_version(1, "j")
    first = r.route(trajectory_id="t", task="x", job="j").actor
    r.stick("t", first.actor_id)
    first.job_versions.pop("j")  # detached (its status no longer lists the job)
    assert r.route(trajectory_id="t", task="x", job="j").actor is not first
