"""Step metrics records: the generation accounting (nested, round trip, wasted fraction, a step's share),
time to score, and the timeline drawn from the records."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from rollart.job.metrics import (
    FATES,
    accounting_delta,
    append_records,
    from_record,
    read_records,
    time_to_score,
    to_record,
    wasted_fraction,
)
from rollart.job.timeline import plot_timeline, spans
from rollart.v1 import common_pb2, trainer_pb2


def _acc(**fates: tuple[int, int]) -> common_pb2.GenerationAccounting:
    acc = common_pb2.GenerationAccounting()
    for name, (samples, tokens) in fates.items():
        getattr(acc, name).samples, getattr(acc, name).tokens = samples, tokens
    acc.wasted_token_fraction = wasted_fraction(acc)
    return acc


def test_wasted_fraction_is_untrained_over_generated():
    acc = _acc(trained=(32, 600), evicted=(8, 150), cancelled=(2, 20), rejected=(1, 10), failed=(1, 20))
    assert acc.wasted_token_fraction == pytest.approx(200 / 800)
    assert wasted_fraction(common_pb2.GenerationAccounting()) == 0.0


def test_step_accounting_is_the_difference_of_the_ledgers_totals():
    before = _acc(trained=(32, 600), evicted=(8, 150))
    after = _acc(trained=(64, 1300), evicted=(8, 150), cancelled=(4, 100))
    d = accounting_delta(after, before)
    assert (d.trained.samples, d.trained.tokens) == (32, 700)
    assert (d.evicted.samples, d.evicted.tokens) == (0, 0)
    assert (d.cancelled.samples, d.cancelled.tokens) == (4, 100)
    assert d.wasted_token_fraction == pytest.approx(100 / 800)


def test_accounting_round_trips_through_the_json_lines(tmp_path: Path):
    m = trainer_pb2.StepMetrics(step=4, samples=32)
    m.accounting.CopyFrom(_acc(trained=(32, 640), evicted=(8, 160)))
    m.accounting_total.CopyFrom(_acc(trained=(128, 2560), cancelled=(3, 40)))
    m.checkpoint_time.FromNanoseconds(250_000_000)
    rec = to_record(m)
    assert rec["accounting"]["evicted"] == {"samples": 8, "tokens": 160}
    assert rec["wasted_token_fraction"] == pytest.approx(0.2)
    assert rec["wasted_token_fraction_total"] == pytest.approx(40 / 2600)
    assert rec["checkpoint_seconds"] == pytest.approx(0.25)
    append_records(tmp_path / "m.jsonl", [rec])
    (back,) = list(read_records(tmp_path / "m.jsonl"))
    assert json.loads(json.dumps(back)) == back
    assert from_record(back) == m
    assert not from_record(to_record(trainer_pb2.StepMetrics(step=1))).HasField("accounting")
    assert set(FATES) == {f.name for f in common_pb2.GenerationAccounting.DESCRIPTOR.fields} - {
        "wasted_token_fraction"
    }


def _records(rewards: list[float], step_s: float = 10.0) -> list[dict]:
    out = []
    for i, r in enumerate(rewards):
        t = 1000.0 + i * step_s
        out.append(
            {
                "step": i + 1,
                "reward_mean": r,
                "started_at": t,
                "finished_at": t + step_s,
                "checkpoint_seconds": 0.5,
                "update_pause_seconds": 0.2,
                "get_batch_seconds": 6.0,
                "extra": {
                    "t_batch_ready": t + 6,
                    "t_update_start": t + 6.1,
                    "t_update_end": t + 6.5,
                    "t_train_start": t + 6.6,
                    "t_train_end": t + 9,
                    "t_rollout_start": t - 4,
                    "t_rollout_end": t + 5.5,
                    "t_publish_start": t - 1,
                    "t_publish_end": t + 0.5,
                },
            }
        )
    return out


def test_time_to_score_is_when_the_10_step_average_first_reaches_the_target():
    rewards = [0.0] * 5 + [1.0] * 20
    recs = _records(rewards)
    # 10-step windows: the average reaches 0.8 first at the window ending at step 13 (8 of 10 are 1.0).
    assert time_to_score(recs, 0.8) == pytest.approx(13 * 10.0)
    assert time_to_score(recs, 1.0) == pytest.approx(15 * 10.0)
    assert time_to_score(_records([1.0] * 9), 0.5) is None  # never a full window
    assert time_to_score(recs, 1.01) is None
    assert time_to_score([], 0.8) is None


def test_timeline_lanes_and_png(tmp_path: Path):
    recs = _records([0.1, 0.2, 0.3])
    bars = spans(recs)
    kinds = {(lane, kind) for lane, kind, *_ in bars}
    assert kinds == {
        ("trainer", "wait for batch"),
        ("trainer", "train"),
        ("trainer", "checkpoint"),
        ("relay / weights", "publish"),
        ("relay / weights", "update"),
        ("actors", "rollout"),
        ("actors", "pause"),
        ("reward", "reward"),
    }
    assert all(b > a for _, _, a, b, _ in bars)
    pytest.importorskip("matplotlib")
    assert plot_timeline(recs, tmp_path / "timeline.png", "t")
    assert (tmp_path / "timeline.png").stat().st_size > 1000
    assert not plot_timeline([{"step": 1}], tmp_path / "none.png", "t")
