"""StartJob's and the job file's checks of the objective: bad modes, caps and bounds are INVALID_ARGUMENT
naming ``spec.grpo.<field>``; sampling with top-p or top-k truncation is refused naming the field, in the
trainer's check and in the job file's (job.sampling, environment.sampling, tasks[i].environment.sampling)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from rollart.job.spec import SpecError, apply_overrides, environment_spec, job_spec, job_tasks
from rollart.runtime import errors
from rollart_trainer.validators import check_spec


@pytest.fixture
def model_dir(tmp_path: Path) -> Path:
    (tmp_path / "config.json").write_text("{}")  # validation only looks for it
    return tmp_path


def spec(model: Path, **kw: Any):
    d: dict[str, Any] = {"job_id": "j", "model": str(model), "batch_size": 8, "group_size": 4}
    d.update(kw)
    return job_spec(d)


def refusal(s: Any) -> errors.InvalidArgument:
    with pytest.raises(errors.InvalidArgument) as exc:
        check_spec(s)
    return exc.value


def test_the_defaults_and_a_full_objective_pass(model_dir: Path) -> None:
    check_spec(spec(model_dir))
    grpo = {
        "loss_aggregation": "seq-mean-token-sum-norm",
        "aggregation_length": 256,
        "ratio_level": "sequence",
        "entropy_coef": 0.001,
        "advantage_estimator": "rloo",
        "overlong_buffer": 16,
        "overlong_max_tokens": 128,
        "overlong_penalty": 0.5,
        "correction": "mis",
        "correction_level": "geometric",
        "mis_low": 0.0,
        "mis_high": 4.0,
        "proximal": "loglinear",
        "max_groups_per_batch": 8,
    }
    check_spec(spec(model_dir, grpo=grpo, sampling={"top_p": 1.0, "top_k": -1}))


@pytest.mark.parametrize(
    ("grpo", "field", "words"),
    [
        ({"correction": "importance"}, "spec.grpo.correction", "unknown mode 'importance'"),
        ({"loss_aggregation": "sum"}, "spec.grpo.loss_aggregation", "one of token-mean"),
        ({"correction_level": "batch"}, "spec.grpo.correction_level", "unknown mode"),
        ({"proximal": "guess"}, "spec.grpo.proximal", "unknown mode"),
        ({"advantage_estimator": "gae"}, "spec.grpo.advantage_estimator", "unknown mode"),
        ({"ratio_level": "group"}, "spec.grpo.ratio_level", "unknown mode"),
        ({"correction": "tis", "is_cap": -2.0}, "spec.grpo.is_cap", "within"),
        ({"correction": "tis", "is_cap": 0.0}, "spec.grpo.is_cap", "> 0"),
        ({"correction": "mis", "mis_low": 1.5, "mis_high": 1.2}, "spec.grpo.mis_low", "mis_low 1.5 > mis_high 1.2"),
        ({"correction": "mis", "mis_high": 0.9}, "spec.grpo.mis_high", ">= 1"),
        ({"mis_low": -1.0}, "spec.grpo.mis_low", "within"),
        ({"entropy_coef": -0.1}, "spec.grpo.entropy_coef", "within"),
        ({"overlong_buffer": 64, "overlong_max_tokens": 32}, "spec.grpo.overlong_max_tokens", "> overlong_buffer"),
        ({"loss_aggregation": "seq-mean-token-sum-norm"}, "spec.grpo.aggregation_length", "constant length"),
        ({"max_groups_per_batch": -1}, "spec.grpo.max_groups_per_batch", "within"),
        ({"dynamic_sampling": True, "max_groups_per_batch": 1}, "spec.grpo.max_groups_per_batch", "batch's 2 groups"),
        ({"dynamic_sampling": True, "max_groups_per_batch": 2_000_000}, "spec.grpo.max_groups_per_batch", "within"),
    ],
)
def test_bad_objective_fields_are_refused_naming_the_field(
    model_dir: Path, grpo: dict[str, Any], field: str, words: str
) -> None:
    err = refusal(spec(model_dir, grpo=grpo))
    assert err.field == field
    assert words in err.details()


def test_dynamic_sampling_is_accepted(model_dir: Path) -> None:
    check_spec(spec(model_dir, grpo={"dynamic_sampling": True}))  # bound 0: 4 x the batch's groups
    check_spec(spec(model_dir, grpo={"dynamic_sampling": True, "max_groups_per_batch": 2}))
    check_spec(spec(model_dir, grpo={"max_groups_per_batch": 1}))  # without dynamic sampling: unused


def test_dynamic_sampling_in_a_multi_task_job_is_refused(model_dir: Path) -> None:
    two = [{"task": "a", "environment": "env-a", "seed": 1}, {"task": "b", "environment": "env-b", "seed": 2}]
    err = refusal(spec(model_dir, tasks=two, grpo={"dynamic_sampling": True}))
    assert err.field == "spec.grpo.dynamic_sampling" and "multi-task" in err.details()
    check_spec(spec(model_dir, tasks=two))  # the job itself is fine


def test_dynamic_sampling_with_groups_of_one_is_refused(model_dir: Path) -> None:
    err = refusal(spec(model_dir, group_size=1, grpo={"dynamic_sampling": True}))
    assert err.field == "spec.grpo.dynamic_sampling" and "at least 2 samples" in err.details()


@pytest.mark.parametrize(
    ("sampling", "field"),
    [({"top_p": 0.9}, "spec.sampling.top_p"), ({"top_k": 50}, "spec.sampling.top_k")],
)
def test_truncated_sampling_is_refused_at_start_job(model_dir: Path, sampling: dict[str, Any], field: str) -> None:
    s = spec(model_dir)
    for k, val in sampling.items():
        setattr(s.sampling, k, val)
    err = refusal(s)
    assert err.field == field and "whole vocabulary" in err.details()


def test_untruncated_sampling_values_pass(model_dir: Path) -> None:
    for top_p, top_k in ((0.0, 0), (1.0, -1), (1.0, 0)):
        s = spec(model_dir)
        s.sampling.top_p, s.sampling.top_k = top_p, top_k
        check_spec(s)


def test_job_file_refuses_truncated_sampling_naming_the_key() -> None:
    with pytest.raises(SpecError, match=r"^job\.sampling\.top_p: 0\.95 truncates"):
        job_spec({"job_id": "j", "sampling": {"top_p": 0.95}})
    with pytest.raises(SpecError, match=r"^environment\.sampling\.top_k: 20 truncates"):
        environment_spec({"environment": "gymnasium:FrozenLake-v1", "sampling": {"top_k": 20}})
    tasks = {"tasks": [{"name": "a", "environment": {"environment": "x:A", "sampling": {"top_p": 0.5}}}]}
    with pytest.raises(SpecError, match=r"^tasks\[0\]\.environment\.sampling\.top_p"):
        job_tasks(tasks)
    with pytest.raises(SpecError, match=r"job\.sampling\.top_k"):
        apply_overrides({"job": {"job_id": "j"}}, ["job.sampling.top_k=40"])
    # no truncation: accepted
    assert job_spec({"job_id": "j", "sampling": {"top_p": 1.0, "top_k": -1}}).sampling.top_k == -1


def test_job_file_objective_fields_parse() -> None:
    s = job_spec({"job_id": "j", "grpo": {"correction": "tis", "is_cap": 3, "mis_low": 0}})
    assert s.grpo.correction == "tis" and s.grpo.is_cap == 3.0
    assert s.grpo.HasField("mis_low") and not s.grpo.HasField("mis_high")
