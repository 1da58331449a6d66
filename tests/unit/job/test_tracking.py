"""Tracking: the stable metric names of a metrics.jsonl record, the job file's tracking section (bad values
name their field), rollout samples picked from a ledger batch, and `rollart samples` printing them."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from rollart.job import samples as S
from rollart.job.metrics import to_record
from rollart.job.spec import SpecError, apply_overrides
from rollart.job.tracking import metric_names, sample_step, settings
from rollart.v1 import common_pb2, ledger_pb2, trainer_pb2


def _record() -> dict:
    m = trainer_pb2.StepMetrics(
        step=7, version_trained=6, version_produced=7, samples=32, groups=4, reward_mean=0.25, reward_std=0.4,
        reward_min=0.0, reward_max=1.0, loss=0.1, pg_loss=0.09, kl=0.01, entropy=1.5, clip_fraction=0.05,
        grad_norm=0.7, learning_rate=5e-4, tokens_trained=800, response_length_mean=6.5, staleness_mean=0.4,
        staleness_max=1, rollout_tokens_per_s=900.0, admitted=33, rejected=1,
    )
    m.step_time.FromNanoseconds(4_000_000_000)
    m.train_time.FromNanoseconds(1_500_000_000)
    m.get_batch_time.FromNanoseconds(2_000_000_000)
    m.update_pause.FromNanoseconds(250_000_000)
    m.extra.update({"turns_mean": 3.5, "behaviour_kl": 0.002, "ratio_mean": 1.01, "ratio_max": 1.4,
                    "mismatch_k3_kl": 0.003, "train_tokens_per_s": 500.0, "t_rollout_start": 100.0,
                    "t_rollout_end": 103.5, "t_train_start": 104.0, "eval_frozenlake_mean": 0.6, "custom": 2.0})
    m.accounting.trained.samples, m.accounting.trained.tokens = 32, 800
    m.accounting.evicted.samples, m.accounting.evicted.tokens = 4, 90
    m.accounting_total.cancelled.samples = 9
    m.tasks["frozenlake"].CopyFrom(trainer_pb2.TaskStepMetrics(samples=32, reward_mean=0.25, turns_mean=3.5))
    m.actor_versions["actor-2"] = 6
    rec = to_record(m)
    # Validation figures as another part of the run writes them (nested per task, or flat): mapped by prefix.
    rec["eval"] = {"frozenlake": {"mean@4": 0.5, "pass@4": 0.75}}
    rec["val_score"] = 0.5
    return rec


def test_metric_names_are_the_documented_ones():
    names = metric_names(_record())
    expected = {
        "reward/mean": 0.25, "reward/std": 0.4, "reward/max": 1.0, "train/entropy": 1.5, "train/kl": 0.01,
        "train/clip_fraction": 0.05, "response_length/mean": 6.5, "turns/mean": 3.5, "staleness/mean": 0.4,
        "staleness/max": 1.0, "mismatch/behaviour_kl": 0.002, "mismatch/ratio_mean": 1.01, "mismatch/ratio_max": 1.4,
        "mismatch/mismatch_k3_kl": 0.003, "generation/trained_samples": 32.0, "generation/evicted_tokens": 90.0,
        "generation_total/cancelled_samples": 9.0, "perf/rollout_tokens_per_s": 900.0,
        "perf/train_tokens_per_s": 500.0, "perf/samples_per_s": 8.0, "timing_s/step": 4.0, "timing_s/train": 1.5,
        "timing_s/get_batch": 2.0, "timing_s/update_pause": 0.25, "timing_s/rollout": 3.5,
        "task/frozenlake/reward_mean": 0.25, "actor_version/actor-2": 6.0, "val/frozenlake/mean@4": 0.5,
        "val/frozenlake/pass@4": 0.75, "val/score": 0.5, "val/frozenlake_mean": 0.6, "extra/custom": 2.0,
    }
    for name, value in expected.items():
        assert names[name] == pytest.approx(value), name
    assert not [n for n in names if "t_train_start" in n or n.startswith("extra/t_")]  # timestamps are not figures
    assert all(isinstance(v, float) for v in names.values())


def test_documented_names_are_in_the_doc_table():
    doc = (Path(__file__).resolve().parents[3] / "docs" / "tracking.md").read_text()
    for name in ("reward/mean", "val/<task>/<stat>", "response_length/mean", "turns/mean", "train/entropy", "train/kl",
                 "train/clip_fraction", "mismatch/behaviour_kl", "staleness/mean", "generation/<fate>_samples",
                 "perf/rollout_tokens_per_s", "perf/samples_per_s", "timing_s/<phase>"):
        assert f"`{name}`" in doc, name


def test_non_finite_values_are_left_out():
    assert "train/grad_norm" not in metric_names({"step": 1, "grad_norm": float("nan")})


def test_settings_defaults_and_sections():
    s = settings({})
    assert s.tensorboard and s.wandb is None and s.mlflow is None and s.samples_every == 5
    s = settings({"tracking": {"wandb": {"project": "p", "tags": ["a", 1]}, "mlflow": True,
                               "samples": {"every": 2, "per_task": 3}}})
    assert s.wandb is not None and s.wandb.mode == "offline" and s.wandb.tags == ["a", "1"]
    assert s.mlflow is not None and s.mlflow.tracking_uri == ""
    assert (s.samples_every, s.samples_per_task) == (2, 3)
    assert [st for st in range(1, 8) if sample_step(s, st)] == [1, 2, 4, 6]
    off = settings({"tracking": False})
    assert not off.tensorboard and off.samples_every == 0
    assert settings({"tracking": {"wandb": {"enabled": False}}}).wandb is None


@pytest.mark.parametrize(
    "section, field",
    [
        ({"tensorboard": "yes"}, "tracking.tensorboard"),
        ({"wandb": {"mode": "cloud"}}, "tracking.wandb.mode"),
        ({"wandb": {"projekt": "x"}}, "tracking.wandb.projekt"),
        ({"wandb": {"id": "bad id!"}}, "tracking.wandb.id"),
        ({"wandb": {"tags": "a"}}, "tracking.wandb.tags"),
        ({"mlflow": {"run_id": "../x"}}, "tracking.mlflow.run_id"),
        ({"mlflow": {"tags": [1]}}, "tracking.mlflow.tags"),
        ({"samples": {"every": -1}}, "tracking.samples.every"),
        ({"samples": {"per_task": 0}}, "tracking.samples.per_task"),
        ({"samples": {"often": 1}}, "tracking.samples.often"),
        ({"tensorboad": True}, "tracking.tensorboad"),
        ("on", "tracking"),
    ],
)
def test_bad_settings_name_the_field(section, field):
    with pytest.raises(SpecError) as err:
        settings({"tracking": section})
    assert str(err.value).startswith(field + ":") or str(err.value).startswith(field + " "), str(err.value)


def test_job_file_and_overrides_accept_the_tracking_section():
    data = apply_overrides({"job": {}, "tracking": {"wandb": {"project": "a"}}}, ["tracking.wandb.mode=online"])
    assert settings(data).wandb.mode == "online"  # type: ignore[union-attr]


def _traj(tid: str, task: str, reward: float, versions: list[int]) -> common_pb2.Trajectory:
    t = common_pb2.Trajectory(trajectory_id=tid, task=task, reward=reward, lease_version=min(versions),
                              prompt_token_ids=[1, 2, 3], status=common_pb2.TRAJECTORY_STATUS_OK, group_id="g")
    for i, v in enumerate(versions):
        t.turns.add(observation=f"obs {i} of {tid}", action=f"move {i}", action_token_ids=[5, 6],
                    action_versions=[v, v])
    return t


def _batch() -> ledger_pb2.Batch:
    b = ledger_pb2.Batch(step=5)
    g = b.groups.add(group_id="g1")
    g.trajectories.extend(_traj(f"a{i}", "arith", i / 10, [3, 4]) for i in range(8))
    g = b.groups.add(group_id="g2")
    g.trajectories.extend(_traj(f"f{i}", "frozenlake", float(i % 2), [4]) for i in range(8))
    return b


def test_samples_pick_k_per_task_across_the_rewards():
    picked = S.pick(_batch(), 3)
    assert [t.task for t in picked] == ["arith"] * 3 + ["frozenlake"] * 3
    arith = [t.reward for t in picked if t.task == "arith"]
    assert arith[0] == 0.0 and arith[-1] == pytest.approx(0.7)  # lowest and highest included
    assert len(S.pick(_batch(), 100)) == 16


def test_sample_rows_carry_prompt_turns_reward_version_and_staleness():
    rows = S.rows(_batch(), step=5, per_task=1, max_chars=8)
    arith = next(r for r in rows if r["task"] == "arith")
    assert arith["step"] == 5 and arith["version"] == 3 and arith["token_versions"] == [3, 4]
    assert arith["staleness"] == (5 - 1) - 3  # the step trains v4; its oldest token is v3
    assert arith["prompt"] == arith["turns"][0]["observation"] and len(arith["prompt"]) <= 8
    assert arith["turns"][1]["action"] == "move 1" and arith["response_tokens"] == 4
    assert json.loads(json.dumps(rows)) == rows


def test_rollart_samples_prints_them(tmp_path: Path):
    rows = S.rows(_batch(), step=5, per_task=2) + S.rows(_batch(), step=10, per_task=1)
    (tmp_path / "samples.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows) + '{"cut')
    cli = [sys.executable, "-m", "rollart.cli.main", "samples", str(tmp_path)]
    out = subprocess.run([*cli, "--step", "5", "--task", "arith"], capture_output=True, text=True, check=True)
    assert out.stdout.count("step 5  arith") == 2 and "[1] policy move 1" in out.stdout
    assert "frozenlake" not in out.stdout and "\x1b[" not in out.stdout  # no colour when not a terminal
    last = subprocess.run([*cli, "--last", "1", "--json"], capture_output=True, text=True, check=True)
    assert {json.loads(line)["step"] for line in last.stdout.splitlines()} == {10}
    none = subprocess.run([*cli, "--step", "7"], capture_output=True, text=True)
    assert none.returncode == 1 and "steps with samples: 5, 10" in none.stderr
    missing = subprocess.run([*cli[:-1], str(tmp_path / "nope")], capture_output=True, text=True)
    assert missing.returncode == 1 and "no samples.jsonl" in missing.stderr


def test_run_tracking_reads_whole_validation_lines_and_never_raises(tmp_path: Path):
    import asyncio

    from rollart.job.tracking import RunTracking

    lines: list[str] = []
    rt = RunTracking({"job": {}, "tracking": {"samples": False}}, tmp_path, "j", fresh=True, say=lines.append)
    rt.start(tmp_path / "cluster", {"services": {}}, "token", 8)
    assert (tmp_path / "cluster" / "prometheus" / "targets.json").is_file()  # any Prometheus can scrape the run
    val = {"kind": "validation", "eval_step": 0, "task": "t", "score": 0.5, "n": 2, "mean_at_n": 0.5}
    step = {"step": 1, "reward_mean": 0.1}
    # A validation line, a step line (the trainer's, tracked from its event instead) and half a line being written.
    (tmp_path / "metrics.jsonl").write_text(json.dumps(val) + "\n" + json.dumps(step) + "\n" + '{"kind": "valid')
    ev = trainer_pb2.TrainerEvent(step_finished=trainer_pb2.StepMetrics(step=1, reward_mean=0.1))
    asyncio.run(rt.on_event(ev))
    assert rt.tracker is not None and rt.tracker.last_step == 1
    assert rt.tracker.state["validation"] == {"t": 0}
    assert rt.metrics_offset == len(json.dumps(val) + "\n" + json.dumps(step) + "\n")  # the half line waits
    rt.tracker.log_step = None  # type: ignore[assignment,method-assign]  # a tracker that breaks
    asyncio.run(rt.on_event(trainer_pb2.TrainerEvent(step_finished=trainer_pb2.StepMetrics(step=2))))
    assert any("step_finished event not tracked" in line for line in lines)
    rt.close(ok=True)
    rt.stop()
    kept = json.loads((tmp_path / "tracking.json").read_text())  # the time the run's loop spent tracking
    assert kept["last_step"] == 1 and 0 < kept["loop_seconds"] < 60


@pytest.mark.parametrize("value", ["false", "off", "{enabled: false}"])
def test_set_tracking_false_turns_every_backend_off(value: str):
    data = apply_overrides({"job": {}, "tracking": {"wandb": True, "mlflow": True}}, [f"tracking={value}"])
    s = settings(data)
    assert not s.enabled and not s.tensorboard and s.wandb is None and s.mlflow is None
    assert s.samples_every == 0 and not s.prometheus
    assert settings(apply_overrides({"job": {}}, ["tracking=true"])).enabled  # and back on, with the defaults


def test_a_job_file_with_tracking_false_turns_every_backend_off(tmp_path: Path):
    from rollart.job.spec import load_job_file

    (tmp_path / "job.yaml").write_text("job: {job_id: j}\ntracking: false\n")
    assert not settings(load_job_file(tmp_path / "job.yaml")).enabled


@pytest.mark.parametrize(
    "override, names",
    [
        ("tracking=maybe", "tracking:"),
        ("tracking=3", "tracking:"),
        ("tracking=", "tracking:"),
        ("tracking=[tensorboard]", "tracking:"),
        ("tracking.samples.every=-1", "tracking.samples.every:"),
        ("tracking.wandb.mode=cloud", "tracking.wandb.mode:"),
        ("tracking.tensorbord=false", "tracking.tensorbord:"),
    ],
)
def test_a_malformed_tracking_override_is_refused_naming_the_field(override: str, names: str):
    with pytest.raises(SpecError) as err:
        apply_overrides({"job": {}}, [override])
    assert str(err.value).startswith(f"--set: {names}"), str(err.value)


def test_only_loops_and_tracking_are_set_whole():
    for bad in ("model=3", "cluster=false", "loops.x=1", "tracking..wandb=1"):
        with pytest.raises(SpecError, match="not a field path"):
            apply_overrides({"job": {}}, [bad])
    with pytest.raises(SpecError, match="the tracking section is not a mapping"):
        apply_overrides({"job": {}, "tracking": False}, ["tracking.wandb=true"])


def test_run_tracking_off_starts_nothing_and_writes_nothing(tmp_path: Path):
    import asyncio

    from rollart.job.tracking import STATE_FILE, RunTracking

    for old in ("tb/events.out", "samples.jsonl", STATE_FILE):  # a previous run's tracking output
        (tmp_path / old).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / old).write_text("{}\n")
    lines: list[str] = []
    rt = RunTracking({"job": {}, "tracking": False}, tmp_path, "j", fresh=True, say=lines.append)
    rt.start(tmp_path / "cluster", {"services": {}}, "token", 8)
    assert rt.tracker is None and "tracking         off (tracking: false)" in lines
    asyncio.run(rt.on_event(trainer_pb2.TrainerEvent(step_finished=trainer_pb2.StepMetrics(step=1))))
    rt.close(ok=True)
    rt.stop()
    assert not (tmp_path / "tb").exists() and not (tmp_path / "samples.jsonl").exists()
    assert not (tmp_path / STATE_FILE).exists()  # cleared on a fresh run, and nothing written after
    kept = tmp_path / "resumed"
    (kept / "tb").mkdir(parents=True)
    (kept / STATE_FILE).write_text('{"last_step": 3}\n')
    RunTracking({"job": {}, "tracking": False}, kept, "j", fresh=False, say=lines.append).start(
        kept / "cluster", {"services": {}}, "token", 8)
    assert (kept / "tb").is_dir() and (kept / STATE_FILE).read_text() == '{"last_step": 3}\n'  # a resume keeps them
