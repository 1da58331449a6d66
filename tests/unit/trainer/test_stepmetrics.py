"""A step's metrics from its batch: the response length figures (train_stats.response_lengths: the longest
response, the share that hit the max length) and the groups dynamic sampling filtered for the batch, all in
StepMetrics.extra under stable names (and so in metrics.jsonl's ``extra``)."""

from __future__ import annotations

import pytest

from rollart.job.metrics import to_record
from rollart.v1 import common_pb2, trainer_pb2
from rollart.v1 import ledger_pb2 as lp
from rollart_trainer import stepmetrics
from rollart_trainer.train_stats import StepStats, response_lengths


def traj(*actions: int, prompt: int = 4, obs: int = 0) -> common_pb2.Trajectory:
    """A trajectory whose turns generated ``actions[i]`` tokens (each turn after the first sees ``obs``)."""
    turns = [
        common_pb2.Turn(action_token_ids=[5] * a, observation_token_ids=[6] * (obs if i else 0))
        for i, a in enumerate(actions)
    ]
    return common_pb2.Trajectory(prompt_token_ids=[1] * prompt, turns=turns, scored=True)


def test_longest_response_is_over_all_turns() -> None:
    got = response_lengths([traj(3, 4), traj(10), traj()])
    assert got == {"response_length_max": 10.0, "response_clip_fraction": 0.0}  # no limit: nothing clipped


def test_a_turn_at_max_tokens_is_clipped() -> None:
    # limit 8 per request: (8) hit it and (9) passed it (a turn whose limit was raised); (7, 7) did not,
    # although its total is longer
    got = response_lengths([traj(8), traj(7, 7), traj(2), traj(9)], max_tokens=8)
    assert got["response_clip_fraction"] == pytest.approx(2 / 4)
    assert got["response_length_max"] == 14.0


def test_a_stream_beyond_max_seq_len_is_clipped() -> None:
    # streams: 4 + 6 = 10 (fits 10), 4 + 3 + 2 + 3 = 12 (over)
    got = response_lengths([traj(6), traj(3, 3, obs=2)], max_seq_len=10)
    assert got["response_clip_fraction"] == pytest.approx(0.5)
    assert response_lengths([traj(6)], max_seq_len=0)["response_clip_fraction"] == 0.0


def test_an_empty_batch_has_no_figures_to_divide() -> None:
    assert response_lengths([], max_tokens=4) == {"response_length_max": 0.0, "response_clip_fraction": 0.0}


def test_fill_puts_the_figures_and_the_filtered_counts_in_extra_and_the_record() -> None:
    batch = lp.Batch(
        batch_id="b1-1",
        step=1,
        groups=[lp.SampleGroup(group_id="g", trajectories=[traj(4), traj(2, 2)])],
        filtered_groups=3,
        filtered_samples=12,
        filtered_tokens=345,
    )
    m = trainer_pb2.StepMetrics(step=1)
    stepmetrics.fill(m, StepStats(samples=2, groups=1), batch, multitask=False, max_tokens=4)
    assert m.extra["filtered_groups"] == 3 and m.extra["filtered_samples"] == 12 and m.extra["filtered_tokens"] == 345
    assert m.extra["response_length_max"] == 4.0 and m.extra["response_clip_fraction"] == 0.5
    rec = to_record(m)["extra"]
    assert rec["filtered_groups"] == 3.0 and rec["response_clip_fraction"] == 0.5
    # without dynamic sampling the counts are there and 0 (a stable series)
    m2 = trainer_pb2.StepMetrics(step=2)
    stepmetrics.fill(m2, StepStats(), lp.Batch(groups=batch.groups), multitask=False)
    assert m2.extra["filtered_groups"] == 0.0 and m2.extra["response_clip_fraction"] == 0.0
