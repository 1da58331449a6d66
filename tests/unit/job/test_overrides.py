"""``rollart run FILE --set KEY=VALUE``: any job-file field, YAML values, clear errors for unknown keys and bad values."""

from __future__ import annotations

from pathlib import Path

import pytest

from rollart.job.run import add_subparsers, cmd_run
from rollart.job.spec import SpecError, apply_overrides, job_spec, load_job_file
from rollart.v1 import trainer_pb2 as T

EXAMPLE = Path(__file__).resolve().parents[3] / "examples" / "frozenlake.yaml"


def test_overrides_set_proto_fields_maps_and_free_sections() -> None:
    data = apply_overrides(
        load_job_file(EXAMPLE),
        [
            "job.backend=megatron",
            "job.parallel.tensor_parallel_size=1",
            "job.grpo.learning_rate=0.001",
            "job.options.grpo.temperature=0.9",  # a map key may contain dots
            "environment.max_turns=6",
            "loops=4",
            "run.timeout=60",
            "model.seed=3",
        ],
    )
    spec = job_spec(data["job"])
    assert spec.backend == T.TRAINER_BACKEND_MEGATRON and spec.parallel.tensor_parallel_size == 1
    assert spec.grpo.learning_rate == pytest.approx(1e-3) and spec.grpo.clip_eps_high == pytest.approx(0.28)
    assert dict(spec.options) == {"grpo.temperature": "0.9"}
    assert data["environment"]["max_turns"] == 6 and data["loops"] == 4
    assert data["run"]["timeout"] == 60 and data["model"]["seed"] == 3
    assert data["job"]["max_steps"] == 30  # untouched


@pytest.mark.parametrize(
    "item, says",
    [
        ("job.backnd=torch", "--set job.backnd: unknown key"),
        ("job.grpo.nope=1", "--set job.grpo.nope: unknown key"),
        ("jobs.backend=torch", "unknown section 'jobs'"),
        ("job.alpha.x=1", "alpha is a value, not a section"),
        ("job.backend=megatronx", "unknown TrainerBackend 'megatronx'"),
        ("job.grpo.learning_rate=fast", "learning_rate"),
        ("loops=many", "--set loops: expected an integer"),
        ("job.backend", "expected KEY=VALUE"),
        ("job.grpo=3", "expected a mapping"),
    ],
)
def test_bad_overrides_are_refused_naming_the_key(item: str, says: str) -> None:
    with pytest.raises(SpecError) as exc:
        apply_overrides(load_job_file(EXAMPLE), [item])
    assert says in str(exc.value)


def test_rollart_run_refuses_a_bad_override_before_starting_anything(tmp_path: Path, capsys) -> None:
    import argparse

    parser = argparse.ArgumentParser()
    add_subparsers(parser.add_subparsers())
    args = parser.parse_args(["run", str(EXAMPLE), "--set", "job.backnd=megatron"])
    assert cmd_run(args) == 2
    assert "--set job.backnd: unknown key" in capsys.readouterr().err
    args = parser.parse_args(["run", str(EXAMPLE), "--out", str(tmp_path / "o"), "--set", "job.max_steps=-x"])
    assert cmd_run(args) == 2
    assert not (tmp_path / "o").exists()


MULTITASK = EXAMPLE.parent / "multitask.yaml"


def test_task_overrides_by_name_or_index_down_to_proto_fields() -> None:
    from rollart.job.spec import job_tasks

    data = apply_overrides(
        load_job_file(MULTITASK),
        [
            "tasks.arith.share=3",
            "tasks.0.loops=4",
            "tasks.arith.affinity.allow_fallback=false",
            "tasks.frozenlake.environment.max_turns=6",
            "tasks.arith.environment.options.size=10",  # a map key below a task's environment
            "tasks.1.prompts.seed=7",
            "tasks.arith.envmanager=envmanager-2",
            "tasks.frozenlake.affinity=auto",  # a whole field
        ],
    )
    frozenlake, arith = job_tasks(data)
    assert (arith.share, arith.prompts.share, arith.prompts.seed, arith.envmanager) == (3.0, 3.0, 7, "envmanager-2")
    assert arith.affinity is not None and arith.affinity.pool == "decode" and not arith.affinity.allow_fallback
    assert arith.environment.options["size"] == "10" and arith.loops == 6  # the rest untouched
    assert frozenlake.loops == 4 and frozenlake.environment.max_turns == 6
    assert frozenlake.affinity is not None and frozenlake.affinity.auto


def test_a_task_override_of_a_short_form_environment_becomes_a_mapping() -> None:
    data = {"job": {}, "tasks": [{"name": "arith", "environment": "reasoning_gym:basic_arithmetic"}]}
    apply_overrides(data, ["tasks.arith.environment.max_turns=2"])
    assert data["tasks"][0]["environment"] == {"environment": "reasoning_gym:basic_arithmetic", "max_turns": 2}


@pytest.mark.parametrize(
    "item, says",
    [
        ("tasks.sokoban.share=2", "--set tasks.sokoban.share: no task named 'sokoban' (tasks: frozenlake, arith)"),
        ("tasks.2.share=2", "--set tasks.2.share: no task at index 2 (indexes 0..1)"),
        ("tasks.arith.shares=2", "--set tasks.arith.shares: unknown task field 'shares' (known: name, environment,"),
        ("tasks.arith=2", "--set tasks.arith: expected tasks.<name or index>.<field>"),
        ("tasks..share=2", "--set tasks..share: not a field path"),
        ("tasks.arith.affinity.pol=x", "--set tasks.arith.affinity.pol: unknown key (known: allow_fallback, auto,"),
        ("tasks.arith.environment.max_turn=2", "--set tasks.arith.environment.max_turn: unknown key"),
        ("tasks.arith.share.x=2", "--set tasks.arith.share.x: tasks.arith.share is a value, not a section"),
        ("tasks.arith.share=-1", "--set: tasks[1].share: expected a finite number >= 0, got -1"),
        ("tasks.0.loops=many", "--set: tasks[0].loops: expected an integer in [1, 4096], got 'many'"),
        ("tasks.0.loops=100000", "--set: tasks[0].loops: expected an integer in [1, 4096], got 100000"),
        ("tasks.arith.share=.inf", "--set: tasks[1].share: expected a finite number >= 0, got inf"),
        ("tasks.arith.name=frozenlake", "--set: tasks[1].name: task 'frozenlake' is listed twice"),
        ("tasks.arith.envmanager=em2", "--set: tasks[1].envmanager: expected envmanager or envmanager-N"),
        ("tasks.arith.affinity.pool_kind=tpu", "--set: tasks[1].affinity.pool_kind: unknown PoolKind 'tpu'"),
    ],
)
def test_bad_task_overrides_are_one_line_naming_the_path(item: str, says: str) -> None:
    with pytest.raises(SpecError) as exc:
        apply_overrides(load_job_file(MULTITASK), [item])
    assert says in str(exc.value) and "\n" not in str(exc.value)


def test_task_overrides_need_a_tasks_list() -> None:
    with pytest.raises(SpecError, match=r"^--set tasks\.0\.share: the job file has no tasks list"):
        apply_overrides(load_job_file(EXAMPLE), ["tasks.0.share=2"])
    data = {"job": {}, "tasks": [{"name": "a", "environment": "x", "affinity": "auto"}]}
    with pytest.raises(SpecError, match=r"^--set tasks\.a\.affinity\.pool: tasks\.a\.affinity is 'auto', not a map"):
        apply_overrides(data, ["tasks.a.affinity.pool=p"])


def test_rollart_run_refuses_a_bad_task_override_with_one_line(capsys) -> None:
    import argparse

    parser = argparse.ArgumentParser()
    add_subparsers(parser.add_subparsers())
    args = parser.parse_args(["run", str(MULTITASK), "--set", "tasks.math.share=2"])
    assert cmd_run(args) == 2
    err = capsys.readouterr().err
    assert err == "rollart run: --set tasks.math.share: no task named 'math' (tasks: frozenlake, arith)\n"


def test_the_actors_flag_wins_over_the_job_files_cluster_actors(monkeypatch, capsys) -> None:
    import argparse

    import rollart.job.run as run_module

    seen: list[int] = []

    class Stop:
        def __init__(self, opts, data, log) -> None:
            seen.append(opts.actors)
            raise SpecError("stopped before anything starts")

    monkeypatch.setattr(run_module, "Runner", Stop)
    parser = argparse.ArgumentParser()
    add_subparsers(parser.add_subparsers())
    assert load_job_file(EXAMPLE)["cluster"]["actors"] == 2
    for argv, actors in ((["--actors", "1"], 1), ([], 2), (["--set", "cluster.actors=3"], 3)):
        assert cmd_run(parser.parse_args(["run", str(EXAMPLE), *argv])) == 2
        assert seen[-1] == actors, argv
    assert "stopped before anything starts" in capsys.readouterr().err
