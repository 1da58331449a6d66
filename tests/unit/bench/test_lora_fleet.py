"""bench lora-fleet's figures: a shared row counts only the steps that ran beside the other job."""

from __future__ import annotations

from bench.protocol.lora_fleet import figures, overlapping


def rec(step: int, start: float, end: float, reward: float = 0.5, samples: int = 32) -> dict:
    return {"step": step, "started_at": start, "finished_at": end, "step_seconds": end - start,
            "samples": samples, "reward_mean": reward}  # fmt: skip


def test_figures_use_the_median_step_from_step_3_and_thirds_for_reward() -> None:
    rs = [rec(1, 0, 10, 0.0), rec(2, 10, 20, 0.0), rec(3, 20, 24, 0.5), rec(4, 24, 28, 0.5), rec(5, 28, 36, 1.0),
          rec(6, 36, 40, 1.0)]  # fmt: skip
    f = figures(rs)
    assert f["steps"] == 6 and f["step_seconds"] == 4.0 and f["samples_per_second"] == 8.0
    assert f["reward_first"] == 0.0 and f["reward_last"] == 1.0
    assert figures([])["samples_per_second"] is None


def test_overlap_keeps_my_steps_inside_the_other_jobs_run() -> None:
    mine = [rec(1, 0, 5), rec(2, 5, 12), rec(3, 12, 18), rec(4, 18, 30)]
    other = [rec(1, 6, 10), rec(2, 10, 20)]
    assert [r["step"] for r in overlapping(mine, other)] == [3]  # wholly inside [6, 20]; step 2 began before
    other.append(rec(3, 20, 40))
    assert [r["step"] for r in overlapping(mine, other)] == [3, 4]
    assert overlapping(mine, []) == []


def test_a_row_counts_the_actors_the_run_started_not_the_ones_asked_for(tmp_path) -> None:
    import json

    from bench.protocol.lora_fleet import actors_started

    assert actors_started(tmp_path) is None  # no summary: the run did not end
    groups = {"actor": 1, "actor-2": 2, "llmproxy": 3, "redis": 4, "trainer": 5}
    (tmp_path / "summary.json").write_text(json.dumps({"process_groups": groups}))
    assert actors_started(tmp_path) == 2


def test_pinned_actors_get_a_core_each_through_the_pools_cpus() -> None:
    from bench.protocol.lora_fleet import actors_args

    assert actors_args(2, pin=False) == ["--actors", "2"]
    assert actors_args(2, pin=True) == ["--set", 'cluster.actors=[{count: 2, cpus: ["0", "1"]}]']


def test_shares_set_the_proxys_slots_and_weights_for_the_owner_and_job_b() -> None:
    import json

    from bench.protocol.lora_fleet import JOB_A, JOB_B_ID, shares_args
    from rollart.job.spec import apply_overrides, load_job_file

    assert shares_args("", 8) == []
    data = apply_overrides(load_job_file(JOB_A), shares_args("3:1", 8)[1:])
    env = data["cluster"]["env"]["llmproxy"]
    assert env["ROLLART_FLEET_TURN_SLOTS"] == "8" and json.loads(env["ROLLART_JOB_SHARES"]) == {"": 3.0, JOB_B_ID: 1.0}
