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
