"""Validation during training (issue 25): the ``eval`` section checked field by field, held-out prompts checked
against the training's episodes, the schedule, the metrics rows and summary figures (time to score across a
resume), and an evaluation that cannot reach its envmanager reported failed after its retries."""

from __future__ import annotations

import asyncio
import copy
import json
from pathlib import Path

import pytest

from rollart.job.evaluation import (
    EvalPrompt,
    EvalTask,
    Validator,
    append_row,
    draw_validation,
    episode_key,
    eval_plan,
    eval_rows,
    held_out_problem,
    progress_text,
    validation_summary,
)
from rollart.job.metrics import append_records, read_records
from rollart.job.spec import SpecError, environment_spec, job_spec, job_tasks
from rollart.v1 import envmanager_pb2

LAKE = "gymnasium:FrozenLake-v1"
ARITH = "reasoning_gym:basic_arithmetic"
HELD_OUT_MAP = "SFFF,FHFF,FFFH,FFFG"


def lake_job(**eval_section) -> dict:
    return {
        "job": {"job_id": "fl", "batch_size": 32, "group_size": 8, "max_steps": 30, "alpha": 1,
                "prompts": {"task": "frozenlake", "environment": LAKE, "seed": 0},
                "sampling": {"temperature": 1.0, "max_tokens": 8}},
        "environment": {"environment": LAKE, "task": "frozenlake", "max_turns": 8},
        "eval": eval_section,
    }  # fmt: skip


def plan(data: dict) -> list[EvalTask]:
    return eval_plan(data, job_spec(data["job"]), environment_spec(data.get("environment") or {}), job_tasks(data))


def test_held_out_maps_make_a_plan_with_the_tasks_environment_and_eval_sampling():
    (et,) = plan(lake_job(prompts=[{"options": {"desc": HELD_OUT_MAP}}], samples=4, temperature=0, every=5,
                          score_target=0.8, max_tokens=4))
    assert (et.task, et.samples, et.every, et.at_start, et.at_end, et.score_target) == ("frozenlake", 4, 5, True,
                                                                                        True, 0.8)
    assert et.environment.environment == LAKE and et.environment.max_turns == 8
    assert et.environment.sampling.temperature == 0.0 and et.environment.sampling.max_tokens == 4
    req = et.request("fl-frozenlake-s5-a0")
    assert req.samples_per_prompt == 4 and dict(req.prompts[0].options) == {"desc": HELD_OUT_MAP}
    assert req.env.task == "frozenlake"
    assert plan({"job": {}}) == []  # no section: no validation


def test_the_training_map_is_refused_whatever_the_seed():
    # a non-slippery lake ignores the seed: held-out seeds would replay the training's own episode
    with pytest.raises(SpecError, match=r"eval\.seeds\[0\]: not held out: .*ignores the seed"):
        plan(lake_job(seeds={"start": 1_000_000, "count": 2}))
    # the default map written out is the same map
    with pytest.raises(SpecError, match=r"eval\.prompts\[0\]: not held out"):
        plan(lake_job(prompts=[{"options": {"desc": "SFFF, FHFH ,FFFH,HFFG"}}]))


def test_a_slippery_lake_holds_out_seeds_beyond_the_training_range():
    data = lake_job(seeds=[131], samples=2)
    data["environment"]["options"] = {"is_slippery": "true"}
    # 4 groups a step x (30 steps + alpha 1 + 2) = 132 groups: seeds 0..131 are the training's
    with pytest.raises(SpecError, match=r"eval\.seeds\[0\]: not held out: seed 131 is one the training draws"):
        plan(data)
    data["eval"]["seeds"] = [132, 5000]
    assert [p.seed for p in plan(data)[0].prompts] == [132, 5000]
    data["job"]["max_steps"] = 0  # no end: every seed from prompts.seed up
    with pytest.raises(SpecError, match="every seed up"):
        plan(data)


def test_reasoning_gym_entries_not_seeds_are_what_is_held_out():
    train_opts = {"size": "20"}
    # 132 seeds cover all 20 entries: any seed of this dataset is a training entry
    problem = held_out_problem(ARITH, train_opts, (0, 132), EvalPrompt(10_000))
    assert "draws every entry" in problem
    # few training seeds: an entry outside them is held out, one inside is not
    assert held_out_problem(ARITH, {"size": "1000"}, (0, 100), EvalPrompt(500)) == ""
    assert "entry 5 (seed 1005 mod size 1000)" in held_out_problem(ARITH, {"size": "1000"}, (0, 100),
                                                                    EvalPrompt(1005))
    # another dataset seed is another dataset
    assert held_out_problem(ARITH, train_opts, (0, 132), EvalPrompt(3, {"seed": "7"})) == ""
    assert episode_key(ARITH, {"size": "20"}, 23) == episode_key(ARITH, {"size": "20"}, 3)
    assert episode_key("textarena:TicTacToe-v0", {}, 3) != episode_key("textarena:TicTacToe-v0", {}, 4)


def test_multi_task_sections_name_their_training_task():
    data = {
        "job": {"job_id": "mt", "batch_size": 48, "group_size": 8, "max_steps": 60},
        "tasks": [
            {"name": "frozenlake", "environment": {"environment": LAKE, "max_turns": 8}},
            {"name": "arith", "environment": {"environment": ARITH, "options": {"size": "20"}},
             "envmanager": "envmanager-2"},
        ],
        "eval": {"every": 10, "samples": 2, "tasks": [
            {"task": "frozenlake", "prompts": [{"options": {"desc": HELD_OUT_MAP}}], "score_target": 0.9},
            {"task": "arith", "prompts": [{"seed": 3, "options": {"seed": "1"}}], "samples": 8, "metric": "pass"},
        ]},
    }  # fmt: skip
    a, b = plan(data)
    assert (a.task, a.samples, a.every, a.score_target, a.envmanager) == ("frozenlake", 2, 10, 0.9, "envmanager")
    assert (b.task, b.samples, b.metric, b.envmanager) == ("arith", 8, "pass", "envmanager-2")
    assert dict(b.environment.options) == {"size": "20"}  # the task's; the prompt's own options travel apart
    bad = copy.deepcopy(data)
    bad["eval"]["tasks"][1]["task"] = "chess"
    with pytest.raises(SpecError, match=r"eval\.tasks\[1\]\.task: no training task 'chess'"):
        plan(bad)
    bad["eval"]["tasks"][1]["task"] = "frozenlake"
    with pytest.raises(SpecError, match=r"eval\.tasks\[1\]\.task: task 'frozenlake' is validated twice"):
        plan(bad)


@pytest.mark.parametrize("section, where", [
    ({"samples": 0}, r"eval\.samples"),
    ({"samples": 65}, r"eval\.samples"),
    ({"samples": 64, "seeds": {"start": 0, "count": 100}}, r"eval\.samples"),
    ({"temperature": -1}, r"eval\.temperature"),
    ({"every": -2}, r"eval\.every"),
    ({"metric": "median"}, r"eval\.metric"),
    ({"at_start": "yes"}, r"eval\.at_start"),
    ({"timeout": "soon"}, r"eval\.timeout"),
    ({"bogus": 1}, r"eval\.bogus: unknown key"),
    ({"seeds": [1, 1]}, r"eval\.seeds: a seed is listed twice"),
    ({"seeds": []}, r"eval\.seeds"),
    ({"seeds": {"start": 0, "count": 2000}}, r"eval\.seeds\.count"),
    ({"prompts": [{"seed": -1}]}, r"eval\.prompts\[0\]\.seed"),
    ({"prompts": [{"seed": 1, "map": "x"}]}, r"eval\.prompts\[0\]\.map: unknown key"),
    ({"task": "chess"}, r"eval\.task: no training task 'chess'"),
])  # fmt: skip
def test_bad_values_name_the_field(section, where):
    base = {"prompts": [{"options": {"desc": HELD_OUT_MAP}}]}
    if "seeds" in section:
        base = {}
    base.update(section)
    data = lake_job(**base)
    data["environment"]["options"] = {"is_slippery": "true"}
    if "seeds" in section:
        data["job"]["prompts"]["seed"] = 10_000_000
    with pytest.raises(SpecError, match=where):
        plan(data)
    with pytest.raises(SpecError, match=r"eval\.seeds: give seeds or prompts"):
        plan(lake_job(seeds=[1], prompts=[{"seed": 1}]))


def test_schedule_at_start_every_n_and_the_last_step():
    et = EvalTask("t", envmanager_pb2.EnvironmentSpec(), [EvalPrompt(1)], every=5)
    assert [s for s in range(0, 13) if et.due(s, last_step=12)] == [0, 5, 10, 12]
    et.at_start, et.at_end, et.every = False, False, 0
    assert not any(et.due(s, 12) for s in range(13))


def rows_and_records(tmp_path: Path) -> tuple[Path, list[dict]]:
    path = tmp_path / "metrics.jsonl"
    t0 = 1_000.0
    steps = [{"step": s, "started_at": t0 + 10 * (s - 1), "finished_at": t0 + 10 * s, "reward_mean": 0.1 * s}
             for s in range(1, 11)]  # fmt: skip
    append_records(path, steps)
    for step, score in ((0, 0.1), (5, 0.5), (10, 0.9)):
        append_row(path, {"kind": "validation", "task": "frozenlake", "eval_step": step, "score": score,
                          "mean_at_n": score, "pass_at_n": 1.0, "policy_at": t0 + 10 * step - (5 if step == 0 else 0),
                          "tokens_generated": 100, "metric": "mean", "n": 4})  # fmt: skip
    return path, steps


def test_rows_live_beside_the_step_records_and_give_time_to_score(tmp_path):
    path, steps = rows_and_records(tmp_path)
    assert [r["step"] for r in read_records(path)] == list(range(1, 11))  # step readers skip validation rows
    rows = eval_rows(path)
    assert [(r["eval_step"], r["score"]) for r in rows] == [(0, 0.1), (5, 0.5), (10, 0.9)]
    et = EvalTask("frozenlake", envmanager_pb2.EnvironmentSpec(), [EvalPrompt(1)], samples=4, score_target=0.5)
    s = validation_summary(rows, steps, [et])["frozenlake"]
    # reached at step 5, whose policy existed 50 s after the first step started
    assert (s["step_to_score"], s["time_to_score_seconds"], s["final"], s["best"]) == (5, 50.0, 0.9, 0.9)
    assert (s["evaluations"], s["tokens_generated"], s["metric"]) == (3, 300, "mean@4")
    et.score_target = 0.95
    assert validation_summary(rows, steps, [et])["frozenlake"]["time_to_score_seconds"] is None
    # a step evaluated again (a resumed runner) counts once: the last row written
    append_row(path, {"kind": "validation", "task": "frozenlake", "eval_step": 5, "failed": True, "score": None,
                      "error": "x"})
    again = validation_summary(eval_rows(path), steps, [et])["frozenlake"]
    assert (again["evaluations"], again["failed_evaluations"]) == (2, 1)


def test_resume_keeps_the_earlier_part_and_does_not_evaluate_again(tmp_path):
    path, steps = rows_and_records(tmp_path)
    et = EvalTask("frozenlake", envmanager_pb2.EnvironmentSpec(), [EvalPrompt(1)], every=5, score_target=0.8)
    v = Validator([et], "fl", path, lambda _name: None, last_step=20)
    assert v.done == {("frozenlake", 0), ("frozenlake", 5), ("frozenlake", 10)}
    v.start(resumed_step=10)  # not a fresh job: no initial evaluation
    v.step_finished(10, v.started)  # already evaluated
    v.step_finished(15, v.started - 3600)  # replayed from before this runner: its policy is gone
    assert v.queue.empty()
    v.step_finished(15, v.started + 1)
    assert v.queue.qsize() == 1
    # time to score counts from the first step of the earlier part
    later = steps + [{"step": 15, "started_at": 1_140.0, "finished_at": 1_150.0}]
    append_row(path, {"kind": "validation", "task": "frozenlake", "eval_step": 15, "score": 0.85,
                      "policy_at": 1_150.0})
    s = validation_summary(eval_rows(path), later, [et])["frozenlake"]
    assert (s["step_to_score"], s["time_to_score_seconds"]) == (10, 100.0)


def test_an_unreachable_envmanager_is_retried_then_reported_failed(tmp_path):
    path = tmp_path / "metrics.jsonl"
    et = EvalTask("frozenlake", envmanager_pb2.EnvironmentSpec(environment=LAKE), [EvalPrompt(1)], retries=2)
    said: list[str] = []
    v = Validator([et], "fl", path, lambda _name: None, say=said.append, retry_pause=0.01)

    async def go() -> None:
        stop = asyncio.Event()
        runner = asyncio.ensure_future(v.run(stop))
        v.start()
        assert await v.drain(10.0)
        stop.set()
        await runner

    asyncio.run(go())
    (row,) = eval_rows(path)
    assert row["failed"] and row["attempts"] == 3 and "no address" in row["error"] and row["eval_step"] == 0
    assert "FAILED after 3 attempt(s)" in said[0]
    assert progress_text(v.latest) == " | val frozenlake failed@0"


def test_progress_text_and_the_curve(tmp_path):
    path, _ = rows_and_records(tmp_path)
    rows = eval_rows(path)
    assert progress_text({"frozenlake": rows[-1]}) == " | val frozenlake 0.900@10"
    assert progress_text({}) == ""
    matplotlib = pytest.importorskip("matplotlib")
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots()
    assert draw_validation(ax, rows)
    (line,) = ax.get_lines()
    assert list(line.get_xdata()) == [0, 5, 10] and list(line.get_ydata()) == [0.1, 0.5, 0.9]
    assert not draw_validation(ax, [])
    plt.close(fig)
    json.dumps(rows)  # rows are plain JSON


def test_dynamic_sampling_widens_the_training_seeds():
    data = lake_job(seeds=[200], samples=2)
    data["environment"]["options"] = {"is_slippery": "true"}
    assert [p.seed for p in plan(data)[0].prompts] == [200]
    data["job"]["grpo"] = {"dynamic_sampling": True}  # up to 4x the groups a step: seeds 0..527
    with pytest.raises(SpecError, match=r"seed 200 is one the training draws \(seeds 0\.\.527\)"):
        plan(data)


@pytest.mark.parametrize("name", ["frozenlake", "multitask"])
def test_the_examples_validate_frozenlake_on_held_out_maps(name):
    from rollart.job.spec import load_job_file

    data = load_job_file(Path(__file__).resolve().parents[3] / "examples" / f"{name}.yaml")
    (et,) = plan(data)
    assert et.task == "frozenlake" and et.samples == 4 and et.score_target == 0.8
    assert len(et.prompts) == 4 and all(p.options["desc"] != "SFFF,FHFH,FFFH,HFFG" for p in et.prompts)
