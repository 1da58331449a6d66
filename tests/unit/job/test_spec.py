"""Job files to protos (short enum names, durations, maps), the v0 weights digest, metrics records."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest

from rollart.delta import save_safetensors
from rollart.job.metrics import append_records, from_record, read_records, to_record
from rollart.job.run import Progress, improvement
from rollart.job.spec import (
    SpecError,
    environment_spec,
    job_spec,
    load_job_file,
    model_dir_digest,
    weights_digest,
)
from rollart.local.cluster import SERVICES, instance_names
from rollart.v1 import common_pb2, envmanager_pb2, trainer_pb2

REPO = Path(__file__).resolve().parents[3]


def test_job_spec_friendly_forms():
    s = job_spec(
        {
            "job_id": "j",
            "mode": "One-Off",
            "admission": "STRICT",
            "backend": "fsdp2",
            "batch_timeout": "2m",
            "grpo": {"learning_rate": 1e-4, "micro_batch_size": 4},
            "publish": {"weight_sync": "buckets", "relay_endpoints": "127.0.0.1:1"},
            "prompts": {"reward": {"kind": "game"}, "metadata": {"n": 3, "flag": True}},
            "options": {"grpo.temperature": 0.7},
        }
    )
    assert s.mode == trainer_pb2.STEP_MODE_ONE_OFF
    assert s.admission == common_pb2.ADMISSION_POLICY_STRICT
    assert s.backend == trainer_pb2.TRAINER_BACKEND_FSDP2
    assert s.batch_timeout.seconds == 120
    assert s.publish.weight_sync == trainer_pb2.WEIGHT_SYNC_MODE_BUCKETS
    assert list(s.publish.relay_endpoints) == ["127.0.0.1:1"]
    assert s.prompts.reward.kind == common_pb2.SCORER_KIND_GAME
    assert dict(s.prompts.metadata) == {"n": "3", "flag": "true"}
    assert s.options["grpo.temperature"] == "0.7"
    assert s.grpo.micro_batch_size == 4


@pytest.mark.parametrize(
    "data, where",
    [
        ({"mode": "fast"}, "job.mode: unknown StepMode 'fast'"),
        ({"grpo": {"lr": 1}}, "job.grpo.lr: unknown key"),
        ({"batch_timeout": "soon"}, "job.batch_timeout: expected a duration"),
        ({"grpo": 3}, "job.grpo: expected a mapping"),
        ({"alpha": "two"}, "job"),
    ],
)
def test_job_spec_errors_name_the_key(data, where):
    with pytest.raises(SpecError) as exc:
        job_spec(data)
    assert where in str(exc.value)


def test_environment_spec_latency_and_sandbox():
    e = environment_spec(
        {
            "environment": "gymnasium:FrozenLake-v1",
            "max_turns": 8,
            "latency": {"kind": "lognormal", "mean": 0.3, "stddev": "300ms"},
            "sandbox": {"backend": "in_process"},
        }
    )
    assert e.latency.kind == envmanager_pb2.DISTRIBUTION_KIND_LOGNORMAL
    assert e.latency.mean.ToNanoseconds() == e.latency.stddev.ToNanoseconds() == 300_000_000
    assert e.sandbox.backend == envmanager_pb2.SANDBOX_BACKEND_IN_PROCESS


@pytest.mark.parametrize(("raw", "mode"), [("batch", envmanager_pb2.INTERACTION_MODE_BATCH),
                                           ("trajectory", envmanager_pb2.INTERACTION_MODE_TRAJECTORY),
                                           ("INTERACTION_MODE_BATCH", envmanager_pb2.INTERACTION_MODE_BATCH)])
def test_environment_spec_interaction(raw, mode):
    e = environment_spec({"environment": "gymnasium:FrozenLake-v1", "interaction": raw})
    assert e.interaction == mode
    assert environment_spec({"environment": "x"}).interaction == envmanager_pb2.INTERACTION_MODE_UNSPECIFIED
    with pytest.raises(SpecError, match="environment.interaction: unknown InteractionMode 'lockstep'"):
        environment_spec({"environment": "x", "interaction": "lockstep"})


@pytest.mark.parametrize("name", ["frozenlake.yaml", "qwen3-gpu.yaml"])
def test_examples_parse(name):
    data = load_job_file(REPO / "examples" / name)
    spec = job_spec(data["job"])
    env = environment_spec(data["environment"])
    assert spec.job_id and spec.batch_size % spec.group_size == 0 and spec.max_steps > 0
    assert env.environment == spec.prompts.environment


def test_job_file_sections(tmp_path):
    p = tmp_path / "j.yaml"
    p.write_text("job: {job_id: x}\nextra: 1\n")
    with pytest.raises(SpecError, match="unknown section"):
        load_job_file(p)
    p.write_text("environment: {}\n")
    with pytest.raises(SpecError, match="job section is required"):
        load_job_file(p)


def test_weights_digest_covers_names_dtypes_shapes_and_bits(tmp_path):
    a = {"w": np.arange(12, dtype=np.uint16).reshape(3, 4), "b": np.ones(4, dtype=np.uint16)}
    dt = {"w": "BF16", "b": "BF16"}
    base = weights_digest(a, dt)
    assert len(base) == 32 and base == weights_digest(dict(reversed(a.items())), dt)
    flipped = {"w": a["w"].copy(), "b": a["b"]}
    flipped["w"][2, 3] ^= 1
    assert weights_digest(flipped, dt) != base
    assert weights_digest({"w": a["w"].reshape(4, 3), "b": a["b"]}, dt) != base
    assert weights_digest(a, {"w": "F16", "b": "BF16"}) != base
    assert weights_digest({"w2": a["w"], "b": a["b"]}, {"w2": "BF16", "b": "BF16"}) != base
    # A checkpoint directory hashes to the digest of its tensors.
    save_safetensors(tmp_path / "model.safetensors", a, dt)
    assert model_dir_digest(tmp_path) == base
    with pytest.raises(SpecError):
        model_dir_digest(tmp_path / "missing")


def test_metrics_records_round_trip(tmp_path):
    m = trainer_pb2.StepMetrics(step=3, version_trained=2, samples=16, reward_mean=0.25, staleness_max=1)
    m.train_time.FromNanoseconds(1_500_000_000)
    m.finished_at.FromNanoseconds(1_700_000_000_000_000_000)
    m.actor_versions["a"] = 2
    m.extra["x"] = 1.5
    rec = to_record(m)
    assert rec["train_seconds"] == 1.5 and rec["step"] == 3 and isinstance(rec["step"], int)
    assert rec["actor_versions"] == {"a": 2} and rec["finished_at"] == 1.7e9
    json.dumps(rec)  # plain JSON
    assert from_record(rec) == m
    path = tmp_path / "m.jsonl"
    append_records(path, [rec])
    with open(path, "a") as fh:
        fh.write('{"step": 4, "reward_me')  # a line cut by a crash
    assert [r["step"] for r in read_records(path)] == [3]


def test_improvement_and_progress_line(tmp_path):
    assert improvement([0.1] * 10 + [0.4] * 10) == pytest.approx((0.1, 0.4, 4.0))
    assert improvement([0.0] * 10 + [0.5] * 10)[2] == math.inf
    assert improvement([]) == (0.0, 0.0, 0.0)
    with open(tmp_path / "out.txt", "w") as fh:
        bar = Progress(total=4, stream=fh)
        m = trainer_pb2.StepMetrics(step=2, reward_mean=0.5, rollout_tokens_per_s=120, staleness_mean=0.5)
        m.actor_versions["actor-h-1"] = 1
        m.actor_versions["actor-h-2"] = 2
        bar.step(m)
    line = (tmp_path / "out.txt").read_text()
    assert "2/4" in line and "reward 0.500" in line and "120 tok/s" in line and "1:v1 2:v2" in line


def test_instance_names():
    actor = next(s for s in SERVICES if s.name == "actor")
    assert instance_names(actor, 3) == ["actor", "actor-2", "actor-3"]
    # The trainer starts before the actors: they name it as their fallback weight source.
    order = [s.name for s in SERVICES]
    assert order.index("trainer") < order.index("actor") and order.index("relay") < order.index("trainer")
