"""Multi-task job files (issue 12): the ``tasks`` section, bad input refused with the field named, the pools an
affinity may name, per-task figures in the progress line, the summary and the reward curve."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
import yaml

from rollart.job.metrics import task_rewards, to_record
from rollart.job.run import (
    Progress,
    RunOptions,
    _scorer_problem,
    actor_instance_pools,
    actor_pools,
    plot_rewards,
    stranded_tasks,
)
from rollart.job.spec import SpecError, check_affinity_pools, cluster_actor_pools, job_tasks, load_job_file
from rollart.v1 import common_pb2, llmproxy_pb2, reward_pb2, trainer_pb2

REPO = Path(__file__).resolve().parents[3]
ARITH = "reasoning_gym:basic_arithmetic"


def two_tasks(**extra) -> dict:
    data = {
        "job": {"job_id": "mt"},
        "tasks": [
            {"name": "frozenlake", "environment": {"environment": "gymnasium:FrozenLake-v1", "max_turns": 8},
             "loops": 8, "affinity": {"pool": "prefill", "allow_fallback": True}},
            {"name": "arith", "environment": ARITH, "share": 1, "reward": {"kind": "reasoning_gym",
             "scorer": "basic_arithmetic"}, "prompts": {"seed": 1000}, "envmanager": "envmanager-2",
             "affinity": "auto"},
        ],
    }  # fmt: skip
    data.update(extra)
    return data


def test_tasks_become_env_specs_prompt_sources_and_rules():
    a, b = job_tasks(two_tasks(), default_loops=16)
    assert (a.name, a.share, a.loops, a.envmanager) == ("frozenlake", 1.0, 8, "envmanager")
    assert a.environment.task == "frozenlake" and a.environment.max_turns == 8
    assert a.prompts.task == "frozenlake" and a.prompts.environment == "gymnasium:FrozenLake-v1"
    assert a.affinity.task == "frozenlake" and a.affinity.pool == "prefill" and a.affinity.allow_fallback
    assert (b.loops, b.envmanager, b.prompts.seed, b.prompts.share) == (16, "envmanager-2", 1000, 1.0)
    assert b.environment.reward.kind == common_pb2.SCORER_KIND_REASONING_GYM
    assert b.prompts.reward == b.environment.reward and b.affinity.auto
    assert job_tasks({"job": {}}) == []  # one-environment job files are unchanged


def test_the_example_parses():
    data = load_job_file(REPO / "examples" / "multitask.yaml")
    tasks = job_tasks(data)
    assert len(tasks) == 2 and {t.name for t in tasks} == {"frozenlake", "arith"}
    pools = actor_pools(data["cluster"], RunOptions(Path("x"), Path("y")))
    check_affinity_pools(tasks, pools)
    assert pools == {"prefill", "decode"}
    assert {p.kind for p in cluster_actor_pools(data["cluster"])} == {"gpu-compute", "gpu-bandwidth"}
    # arith gets twice frozenlake's groups without taking any from it (why: the example's header)
    groups = data["job"]["batch_size"] // data["job"]["group_size"]
    total = sum(t.share for t in tasks)
    assert {t.name: groups * t.share / total for t in tasks} == {"frozenlake": 2, "arith": 4}


def bad(path: str, value) -> dict:
    data = two_tasks()
    node = data
    keys = path.split(".")
    for k in keys[:-1]:
        node = node[int(k)] if isinstance(node, list) else node[k]
    if value is KeyError:
        del node[keys[-1]]
    elif isinstance(node, list):
        node[int(keys[-1])] = value
    else:
        node[keys[-1]] = value
    return data


@pytest.mark.parametrize(
    "data,field",
    [
        (bad("tasks.0.share", 0) | {"tasks": [dict(t, share=0) for t in two_tasks()["tasks"]]}, "tasks[*].share"),
        (bad("tasks.0.share", -1), "tasks[0].share"),
        (bad("tasks.0.share", "lots"), "tasks[0].share"),
        (bad("tasks.0.share", float("inf")), "tasks[0].share"),
        (bad("tasks.1.name", "frozenlake"), "tasks[1].name"),
        (bad("tasks.1.name", "two words"), "tasks[1].name"),
        (bad("tasks.1.name", "x" * 300), "tasks[1].name"),
        (bad("tasks.0.environment", KeyError), "tasks[0].environment"),
        (bad("tasks.0.environment", {"max_turns": 3}), "tasks[0].environment"),
        (bad("tasks.0.environment", {"environment": "e", "bogus": 1}), "tasks[0].environment.bogus"),
        (bad("tasks.0.environment", {"environment": "e", "task": "other"}), "tasks[0].environment.task"),
        (bad("tasks.0.loops", 0), "tasks[0].loops"),
        (bad("tasks.0.loops", 10**9), "tasks[0].loops"),
        (bad("tasks.0.envmanager", "redis"), "tasks[0].envmanager"),
        (bad("tasks.0.affinity", "sometimes"), "tasks[0].affinity"),
        (bad("tasks.0.affinity", {"pool": "p", "task": "x"}), "tasks[0].affinity"),
        (bad("tasks.0.affinity", {"pool_kind": "quantum"}), "tasks[0].affinity.pool_kind"),
        (bad("tasks.1.reward", {"kind": "astrology"}), "tasks[1].reward.kind"),
        (bad("tasks.1.prompts", {"task": "x"}), "tasks[1].prompts.task"),
        (bad("tasks.1.prompts", {"seed": "many"}), "tasks[1].prompts"),
        (bad("tasks.0.colour", "blue"), "tasks[0].colour"),
        (bad("tasks.0", "frozenlake"), "tasks[0]"),
        (two_tasks(tasks=[]), "tasks"),
        (two_tasks(tasks=[{"environment": f"e{i}"} for i in range(65)]), "tasks"),
        (two_tasks(environment={"environment": "x"}), "environment"),
        (two_tasks(job={"job_id": "mt", "prompts": {"task": "x"}}), "job.prompts"),
    ],
)
def test_bad_tasks_are_refused_with_the_field_named(data, field):
    with pytest.raises(SpecError) as exc:
        job_tasks(copy.deepcopy(data))
    assert str(exc.value).startswith(field), str(exc.value)


def test_an_affinity_naming_no_pool_is_refused_unless_it_falls_back():
    tasks = job_tasks(bad("tasks.0.affinity", {"pool": "gpu-h20"}))
    with pytest.raises(SpecError, match=r"^tasks\[0\]\.affinity\.pool: no actor pool 'gpu-h20'"):
        check_affinity_pools(tasks, {"cpu"})
    check_affinity_pools(job_tasks(bad("tasks.0.affinity", {"pool": "gpu-h20", "allow_fallback": True})), {"cpu"})
    check_affinity_pools(tasks, {"gpu-h20"})


def test_actor_pools_per_instance_or_from_a_pool_list():
    opts = RunOptions(Path("x"), Path("y"), actors=3, service_env={"actor-2": {"ROLLART_POOL": "decode"}})
    assert actor_pools({}, opts) == {"cpu", "decode"}
    opts.service_env["actor"] = {"ROLLART_POOL": "prefill"}
    assert actor_pools({}, opts) == {"prefill", "decode"}
    assert actor_pools({"actors": [{"pool": "h800", "count": 1}, {"pool": "h20", "count": 2}]}, opts) == {"h800", "h20"}


def test_actor_instances_know_their_pool_and_kind():
    opts = RunOptions(Path("x"), Path("y"), actors=2, service_env={"actor-2": {"ROLLART_POOL": "decode"}})
    assert actor_instance_pools({}, opts) == {"actor": ("cpu", "cpu"), "actor-2": ("decode", "cpu")}
    pools = {"actors": [{"pool": "h800", "kind": "gpu-compute", "count": 1}, {"pool": "h20", "kind": "gpu-bandwidth",
             "count": 2}]}  # fmt: skip
    assert actor_instance_pools(pools, opts) == {
        "actor": ("h800", "gpu-compute"), "actor-2": ("h20", "gpu-bandwidth"), "actor-3": ("h20", "gpu-bandwidth")
    }  # fmt: skip


def test_a_task_is_stranded_only_when_its_whole_pool_is_dead_and_it_may_not_fall_back():
    instances = {"actor": ("h800", "gpu-compute"), "actor-2": ("h20", "gpu-bandwidth"), "actor-3": ("h20", "gpu-bandwidth")}
    data = two_tasks()
    data["tasks"][0]["affinity"] = {"pool": "h20"}  # no fallback
    data["tasks"][1]["affinity"] = {"pool_kind": "gpu-compute"}
    tasks = job_tasks(data)
    assert stranded_tasks(tasks, instances, {"actor-2"}) == []  # actor-3 still serves h20
    [(i, t, gone)] = stranded_tasks(tasks, instances, {"actor-2", "actor-3"})
    assert (i, t.name, gone) == (0, "frozenlake", "every actor of pool 'h20' (actor-2, actor-3) is dead and not restarted")
    [(i, t, gone)] = stranded_tasks(tasks, instances, {"actor"})
    assert (i, t.name) == (1, "arith") and gone.startswith("every actor of kind gpu-compute (actor)")
    data["tasks"][0]["affinity"] = {"pool": "h20", "allow_fallback": True}
    data["tasks"][1]["affinity"] = "auto"  # the proxy decides where an auto task goes: not judged here
    assert stranded_tasks(job_tasks(data), instances, set(instances)) == []


def test_scorer_checks():
    rg = common_pb2.SCORER_KIND_REASONING_GYM
    listed = [reward_pb2.ScorerInfo(kind=rg, name="", available=True),
              reward_pb2.ScorerInfo(kind=common_pb2.SCORER_KIND_CUSTOM, name="mine", available=True)]  # fmt: skip
    assert _scorer_problem(common_pb2.RewardSpec(kind=rg, scorer="basic_arithmetic"), listed) == ""
    assert _scorer_problem(common_pb2.RewardSpec(), listed) == ""
    assert "no math scorer" in _scorer_problem(common_pb2.RewardSpec(kind=common_pb2.SCORER_KIND_MATH), listed)
    spec = common_pb2.RewardSpec(kind=common_pb2.SCORER_KIND_CUSTOM, scorer="theirs")
    assert "unknown custom scorer 'theirs'" in _scorer_problem(spec, listed)


def step(n: int, rewards: dict[str, float]) -> trainer_pb2.StepMetrics:
    m = trainer_pb2.StepMetrics(step=n, reward_mean=sum(rewards.values()) / len(rewards))
    for task, r in rewards.items():
        m.tasks[task].CopyFrom(trainer_pb2.TaskStepMetrics(samples=8, reward_mean=r, batch_share=0.5))
    return m


def test_progress_summary_and_curve_per_task(tmp_path, capsys):
    import io

    out = io.StringIO()
    p = Progress(3, out)
    for n in (1, 2):
        p.step(step(n, {"a": 0.1 * n, "b": 0.5}))
    assert "tasks: a 0.200 (avg10 0.150), b 0.500 (avg10 0.500)" in out.getvalue().splitlines()[-1]
    records = [to_record(step(n, {"a": 0.1 * n, "b": 0.5})) for n in range(1, 13)]
    series = task_rewards(records)
    assert set(series) == {"a", "b"} and series["a"][0] == (1, pytest.approx(0.1)) and len(series["b"]) == 12
    assert plot_rewards(records, tmp_path / "reward.png", "t") and (tmp_path / "reward.png").stat().st_size > 0
    assert yaml  # the job files are YAML


def test_ledger_status_lists_task_pools():
    from rollart.cli.ledger import render
    from rollart.v1 import ledger_pb2

    st = ledger_pb2.LedgerStatus()
    assert "TASK POOLS" not in render(st)  # one-task jobs: no section
    st.task_pools.add(task="frozenlake", share=0.5, pending_slots=12, ready_groups=1, inflight_samples=16)
    st.task_pools.add(task="arith", share=0.5, pending_slots=3, ready_groups=0, inflight_samples=8)
    text = render(st)
    assert "TASK POOLS" in text
    row = next(line for line in text.splitlines() if line.strip().startswith("frozenlake"))
    assert row.split() == ["frozenlake", "50%", "12", "1", "16"]


class _RefusingProxy:
    """An LLMProxy servicer whose Generate answers like the real one when no actor is in a task's scope."""

    def __init__(self, code, details: str, retryable: bool) -> None:
        self.code, self.details, self.retryable = code, details, retryable
        self.tasks: list[str] = []

    async def Generate(self, request, context):  # noqa: N802 - the gRPC method name
        self.tasks.append(request.task)
        if self.retryable:
            context.set_trailing_metadata((("rollart-retryable", "true"),))
        await context.abort(self.code, self.details)
        yield  # pragma: no cover - a generator, as a response stream is


async def _runner_against(servicer) -> tuple:
    import grpc
    from grpc import aio

    from rollart.job.run import Runner

    server = aio.server()
    handler = grpc.method_handlers_generic_handler(
        "rollart.v1.LLMProxy",
        {"Generate": grpc.unary_stream_rpc_method_handler(
            servicer.Generate, request_deserializer=llmproxy_pb2.TrajectoryGenerateRequest.FromString,
            response_serializer=llmproxy_pb2.TrajectoryGenerateResponse.SerializeToString)},
    )  # fmt: skip
    server.add_generic_rpc_handlers((handler,))
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    data = two_tasks()
    data["tasks"][1]["affinity"] = {"pool": "decode"}  # arith may not fall back
    runner = Runner(RunOptions(Path("x"), Path("y")), data)
    runner.state = {"services": {"llmproxy": {"address": f"127.0.0.1:{port}"}}}
    runner.instance_pools = {"actor": ("prefill", "gpu-compute"), "actor-2": ("decode", "gpu-bandwidth")}
    return server, runner


async def test_a_stranded_task_stops_the_run_once_the_proxy_refuses_its_probe_turn():
    import asyncio

    import grpc

    proxy = _RefusingProxy(grpc.StatusCode.UNAVAILABLE, "no usable actor for task 'arith' right now\nsecond", True)
    server, runner = await _runner_against(proxy)
    try:
        stop = asyncio.Event()
        await runner._stop_if_stranded({"actor"}, stop)  # the other pool died: arith is not stranded
        assert not stop.is_set() and proxy.tasks == []
        await runner._stop_if_stranded({"actor-2"}, stop)
        assert stop.is_set() and proxy.tasks == ["arith"]
        assert runner.stop_reason == (
            "task arith cannot be generated any more: every actor of pool 'decode' (actor-2) is dead and not "
            "restarted, and tasks[1].affinity has no allow_fallback (the LLMProxy refuses its turns: UNAVAILABLE: "
            "no usable actor for task 'arith' right now)"
        )
        proxy.details = ""  # no details at all: still one line
        assert await runner._probe_turn("arith") == "UNAVAILABLE: "
        proxy.retryable = False  # an UNAVAILABLE the proxy did not say (it may be restarting): not a refusal
        assert await runner._probe_turn("arith") == ""
        proxy.code, proxy.details = grpc.StatusCode.FAILED_PRECONDITION, "no actor has ever been registered"
        assert await runner._probe_turn("arith") == "FAILED_PRECONDITION: no actor has ever been registered"
    finally:
        await server.stop(None)


async def test_an_unreachable_proxy_strands_nobody():
    import asyncio

    from rollart.job.run import Runner

    data = two_tasks()
    data["tasks"][1]["affinity"] = {"pool": "decode"}
    runner = Runner(RunOptions(Path("x"), Path("y")), data)
    runner.state = {"services": {"llmproxy": {"address": "127.0.0.1:1"}}}  # nothing listens there
    runner.instance_pools = {"actor-2": ("decode", "gpu-bandwidth")}
    stop = asyncio.Event()
    await runner._stop_if_stranded({"actor-2"}, stop)
    assert not stop.is_set() and runner.stop_reason == ""
