"""bench protocol's time to score on the validation score (issue 25): the tts rows as job-file fields, --set applied
to every row (a bad path refused), seeds, medians over seeds where "never" counts, and the --json row objects."""

from __future__ import annotations

import json

import pytest
import yaml

from bench.protocol.protocol import ROW_SETS, _median_or_none, combine, finished, job_file, json_rows, validation
from rollart.job.spec import SpecError, load_job_file


def test_tts_rows_are_sync_plus_and_each_mode_with_and_without_correction():
    names = [n for n, _ in ROW_SETS["tts"]]
    assert names[0] == "sync+"
    for mode in ("areal", "async-1", "async-2", "async-4"):
        assert mode in names and any(n.startswith(mode + "+") for n in names)
    rows = dict(ROW_SETS["tts"])
    assert rows["sync+"]["job.mode"] == "sync" and rows["async-2+tis"]["job.alpha"] == 2
    assert rows["async-2+tis"]["job.grpo.correction"] == "tis" and "job.grpo.correction" not in rows["async-2"]


def test_a_row_file_gets_its_fields_then_the_sets_and_the_seed(tmp_path):
    fields = dict(ROW_SETS["tts"])["async-1+tis"]
    path = job_file(tmp_path, "async-1+tis", {}, "delta", "trajectory", steps=5, latency=0.3, target=0.7, seed=2,
                    fields=fields, overrides=["eval.every=2", "job.batch_size=16"])  # fmt: skip
    assert path.name == "async-1+tis-seed2.yaml"
    data = load_job_file(path)
    job = data["job"]
    assert (job["mode"], job["alpha"], job["grpo"]["correction"], job["seed"], job["max_steps"]) == (
        "async", 1, "tis", 2, 5)  # fmt: skip
    assert job["batch_size"] == 16 and data["eval"]["every"] == 2 and data["eval"]["score_target"] == 0.7
    assert data["environment"]["latency"]["seed"] == 9  # 7 + the seed: each seed its own latencies
    with pytest.raises(SpecError, match="job.grpo.bogus"):
        job_file(tmp_path, "x", {}, "delta", "trajectory", 5, 0.0, overrides=["job.grpo.bogus=1"])
    yaml.safe_load(path.read_text())


def test_medians_over_seeds_count_never_as_never():
    assert _median_or_none([10.0, None, 30.0]) == 30.0
    assert _median_or_none([10.0, None, None]) is None
    assert _median_or_none([]) is None
    base = {"name": "async-1", "step_s": 2.0, "steps": 5, "state": "COMPLETED", "time_to_score_s": None,
            "reward_first10": 0.1, "reward_last10": 0.5, "samples_per_s": 16.0, "wasted": 0.0, "accounting": {},
            "eval_points": [(0.0, 0.1), (40.0, 0.8)], **validation({"validation": {"frozenlake": {"time_to_score_seconds": 40.0, "step_to_score": 4,
                                                        "final": 0.75, "curve": [[0, 0.1]]}}})}  # fmt: skip
    seeds = [dict(base, seed=0), dict(base, seed=1, eval_time_to_score_s=None, eval_steps_to_score=None,
                                      final_eval=0.5, step_s=4.0), dict(base, seed=2, eval_time_to_score_s=60.0,
                                                                        eval_steps_to_score=6, final_eval=0.8)]  # fmt: skip
    row = combine(seeds)
    assert (row["eval_time_to_score_s"], row["eval_steps_to_score"], row["final_eval"], row["step_s"]) == (
        60.0, 6, 0.75, 2.0)  # fmt: skip
    assert row["eval_points_seeds"] == [[(0.0, 0.1), (40.0, 0.8)]] * 3  # curves are kept per seed, not medians
    (obj,) = json_rows([row])
    assert obj["config"] == "async-1"
    assert (obj["time_to_score_seconds"], obj["steps_to_score"], obj["final_eval"]) == (60.0, 6, 0.75)
    assert [p["time_to_score_seconds"] for p in obj["per_seed"]] == [40.0, None, 60.0]
    assert [p["seed"] for p in obj["per_seed"]] == [0, 1, 2] and obj["train_time_to_score_seconds"] is None
    assert validation({})["eval_time_to_score_s"] is None  # a run without validation


def test_resume_keeps_only_a_completed_run_of_the_same_job_file(tmp_path):
    cfg = tmp_path / "a.yaml"
    cfg.write_text("job: {seed: 0}\n")
    out = tmp_path / "a"
    out.mkdir()
    assert not finished(out, cfg)  # nothing there
    (out / "job.yaml").write_text(cfg.read_text())
    (out / "summary.json").write_text(json.dumps({"state": "COMPLETED"}))
    assert finished(out, cfg)
    cfg.write_text("job: {seed: 1}\n")
    assert not finished(out, cfg)  # another job file: run again
    (out / "job.yaml").write_text(cfg.read_text())
    (out / "summary.json").write_text(json.dumps({"state": "FAILED"}))
    assert not finished(out, cfg)  # a failed run: run again


def test_the_picture_of_a_tts_run_draws_every_row_and_seed(tmp_path):
    from bench.protocol.protocol import plot

    rows = [
        {"name": name, "eval_points_seeds": [[(0.0, 0.1), (40.0, 0.5), (80.0, 0.85)], [(0.0, 0.2), (50.0, 0.9)]],
         "eval_time_to_score_s": tts, "curve": [], "step_s": 7.0}
        for name, tts in (("sync+", 80.0), ("async-1", None), ("async-1+tis", 50.0))
    ]  # fmt: skip
    plot(rows, tmp_path / "curves.png")  # names such as async-1+tis are no alpha sweep
    assert (tmp_path / "curves.png").stat().st_size > 10_000
