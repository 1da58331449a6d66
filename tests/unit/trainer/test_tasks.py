"""Multi-task jobs in the trainer (issue 12): which task each group comes from, per-task figures, bad specs."""

from __future__ import annotations

import pytest

from rollart.job.spec import job_spec
from rollart.runtime import errors
from rollart.v1 import common_pb2, ledger_pb2
from rollart_trainer import tasks
from rollart_trainer.validators import check_spec


def spec(**kw):
    d = {"job_id": "mt", "model": "Qwen/Qwen3-0.6B", "batch_size": 16, "group_size": 4}
    d.update(kw)
    return job_spec(d)


TWO = [{"task": "a", "environment": "env-a", "seed": 100, "share": 3}, {"task": "b", "seed": 7}]


def test_groups_follow_the_shares_interleaved_and_each_tasks_own_seeds():
    plan = tasks.Plan.of(spec(tasks=TWO), groups_per_step=4)
    assert plan.quota == {"a": 3, "b": 1}  # share 3 : 0 (uniform = 1)
    assert plan.order.count("a") == 3 and plan.order.count("b") == 1
    got = [(plan.group(i)[0].task, plan.group(i)[1]) for i in range(12)]
    assert [i for t, i in got if t == "a"] == list(range(9))  # each task counts its own groups
    assert [i for t, i in got if t == "b"] == [0, 1, 2]
    assert plan.group(5) == tasks.Plan.of(spec(tasks=TWO), 4).group(5)  # a function of i alone
    assert tasks.layout({"a": 2, "b": 2}) == ["a", "b", "a", "b"]


def test_one_task_jobs_use_prompts_for_every_group():
    plan = tasks.Plan.of(spec(prompts={"task": "frozenlake", "seed": 3}), groups_per_step=4)
    assert [plan.group(i)[1] for i in range(6)] == list(range(6))
    assert {plan.group(i)[0].task for i in range(6)} == {"frozenlake"}


def test_step_metrics_per_task():
    batch = ledger_pb2.Batch()
    for task, reward, n_turns in (("a", 1.0, 3), ("a", 0.0, 1), ("b", 0.5, 1)):
        g = batch.groups.add(group_id=f"g-{task}-{reward}")
        t = g.trajectories.add(task=task, reward=reward, prompt_token_ids=[1, 2])
        for _ in range(n_turns):
            t.turns.add(observation_token_ids=[3], action_token_ids=[4, 5])
    m = tasks.step_metrics(batch)
    assert (m["a"].samples, m["a"].groups, m["a"].reward_mean, m["a"].turns_mean) == (2, 2, 0.5, 2.0)
    assert m["a"].tokens == 8 and m["a"].prompt_tokens == 4 + 4 and m["b"].batch_share == pytest.approx(1 / 3)


def test_task_label_is_bounded():
    for i in range(tasks.MAX_TASK_LABELS + 10):
        tasks.task_label(f"label-test-{i}")
    assert tasks.task_label("one-more") == "other" and len(tasks._labels) <= tasks.MAX_TASK_LABELS


@pytest.mark.parametrize(
    "bad,field",
    [
        ([{"task": "a", "share": -1}, {"task": "b"}], "spec.tasks[0].share"),
        ([{"task": "a", "share": "NaN"}], "spec.tasks[0].share"),
        ([{"task": "a"}, {"task": "a"}], "spec.tasks[1].task"),
        ([{"task": "a"}, {}], "spec.tasks[1].task"),
        ([{"task": "a b"}], "spec.tasks[0].task"),
        ([{"task": "a", "share": 100}, {"task": "b", "share": 1}], "spec.tasks[1].share"),  # 0 of 4 groups
        ([{"task": "a", "dataset_uri": "/no/such/file.jsonl"}], "spec.tasks[0].dataset_uri"),
        ([{"task": f"t{i}"} for i in range(65)], "spec.tasks"),
    ],
)
def test_bad_tasks_are_refused_with_the_field_named(bad, field):
    with pytest.raises(errors.InvalidArgument) as exc:
        check_spec(spec(tasks=bad))
    assert exc.value.field == field, str(exc.value)


def test_zero_shares_are_uniform():
    assert tasks.shares(tasks.sources(spec(tasks=[{"task": "a"}, {"task": "b"}]))) == {"a": 0.5, "b": 0.5}
    check_spec(spec(tasks=[{"task": "a"}, {"task": "b"}]))
    assert common_pb2  # the protos import cleanly
