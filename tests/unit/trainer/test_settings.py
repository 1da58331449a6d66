"""GRPO settings from the job spec, and trajectories from the wire."""

from __future__ import annotations

import pytest

pytest.importorskip("torch")

from rollart.v1 import common_pb2, trainer_pb2  # noqa: E402
from rollart_trainer.grpo import GrpoSettings, Sample, TrainBatch  # noqa: E402


def test_zero_fields_take_defaults_and_options_are_parsed() -> None:
    spec = trainer_pb2.TrainerJobSpec(grpo=trainer_pb2.GrpoConfig(learning_rate=2e-5, clip_eps_high=0.28))
    spec.options["grpo.temperature"] = "0.7"
    spec.options["grpo.warmup_steps"] = "3"
    s = GrpoSettings.from_job_spec(spec)
    assert s.learning_rate == 2e-5 and s.clip_eps_low == 0.2 and s.clip_eps_high == 0.28
    assert s.max_grad_norm == 0.0 and s.kl_coef == 0.0 and s.epochs_per_batch == 1 and s.micro_batch_size == 0
    assert s.temperature == 0.7 and s.warmup_steps == 3
    spec.options["grpo.warmup_steps"] = "three"
    with pytest.raises(ValueError, match="grpo.warmup_steps"):
        GrpoSettings.from_job_spec(spec)
    with pytest.raises(ValueError, match="clip_eps_low"):
        GrpoSettings(clip_eps_low=1.5)


def test_trajectory_protos_become_samples() -> None:
    t = common_pb2.Trajectory(trajectory_id="t1", group_id="g", prompt_token_ids=[1, 2], reward=0.5, scored=True)
    t.turns.add(
        observation_token_ids=[3], action_token_ids=[4, 5], action_logprobs=[-0.5, -1.0], action_versions=[2, 2]
    )
    batch = TrainBatch.from_trajectories([t], "b", policy_version=3)
    s = batch.samples[0]
    assert (s.sample_id, s.group_id, s.reward, list(s.prompt_ids)) == ("t1", "g", 0.5, [1, 2])
    assert list(s.turns[0].action_ids) == [4, 5] and list(s.turns[0].action_versions) == [2, 2]
    t.scored = False
    with pytest.raises(ValueError, match="not scored"):
        Sample.from_proto(t)


def test_step_stats_fill_the_step_metrics_message() -> None:
    from rollart_trainer.grpo import StepStats

    msg = StepStats(loss=1.5, tokens_trained=10, staleness_max=2, train_seconds=1.25, behaviour_kl=0.01)
    m = msg.fill_step_metrics(trainer_pb2.StepMetrics(step=3))
    assert (m.step, m.loss, m.tokens_trained, m.staleness_max) == (3, 1.5, 10, 2)
    assert m.train_time.ToNanoseconds() == 1_250_000_000
    assert m.extra["behaviour_kl"] == pytest.approx(0.01) and "loss" not in m.extra
