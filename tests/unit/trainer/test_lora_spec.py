"""LoRA settings: the job file's ``model.lora`` becomes ``job.lora`` (``--set`` included), and StartJob's check
refuses every bad value naming the field (rank bounds and a rank larger than a targeted layer, alpha, dropout,
module names the model does not have, malformed or duplicated names, the megatron backend); torch and fsdp2 train
LoRA."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from rollart.job.spec import SpecError, apply_overrides, job_spec, load_job_file, model_lora
from rollart.runtime import errors
from rollart.v1 import trainer_pb2 as T
from rollart_trainer import validators
from rollart_trainer.lora import DEFAULT_TARGETS, LoraSettings, check_lora, settings_of

LORA = {"rank": 8, "alpha": 16, "target_modules": ["q_proj", "v_proj"]}


def job_file(tmp_path: Path, model: dict[str, Any] | None = None, job: dict[str, Any] | None = None) -> Path:
    data: dict[str, Any] = {"job": {"job_id": "j", "batch_size": 4, "group_size": 2, **(job or {})}}
    if model is not None:
        data["model"] = model
    p = tmp_path / "job.yaml"
    p.write_text(yaml.safe_dump(data))
    return p


def test_model_lora_reaches_the_trainer_spec(tmp_path: Path) -> None:
    data = load_job_file(job_file(tmp_path, {"warm_start": "frozenlake", "lora": LORA}))
    spec = job_spec(data["job"])
    assert spec.HasField("lora")
    assert (spec.lora.rank, spec.lora.alpha, list(spec.lora.target_modules)) == (8, 16.0, ["q_proj", "v_proj"])
    assert data["model"]["lora"] == LORA  # left in place for the launcher
    s = settings_of(spec)
    assert s == LoraSettings(rank=8, alpha=16.0, target_modules=("q_proj", "v_proj"))
    # --set model.lora.* is copied again; job.lora written by hand must agree with model.lora.
    data = apply_overrides(data, ["model.lora.rank=4", "model.lora.dropout=0.05"])
    spec = job_spec(data["job"])
    assert (spec.lora.rank, spec.lora.dropout) == (4, 0.05)
    with pytest.raises(SpecError, match=r"job.lora: differs from model.lora"):
        load_job_file(job_file(tmp_path, {"lora": LORA}, {"lora": {"rank": 2, "alpha": 1}}))
    same = {"rank": 2, "alpha": 1}
    data = load_job_file(job_file(tmp_path, {"lora": same}, {"lora": same}))
    # Left out, target_modules are the defaults, written out for the launcher and the actors.
    assert tuple(job_spec(data["job"]).lora.target_modules) == DEFAULT_TARGETS
    assert tuple(model_lora(data).target_modules) == DEFAULT_TARGETS  # type: ignore[union-attr]


def test_a_job_without_lora_is_unchanged(tmp_path: Path) -> None:
    data = load_job_file(job_file(tmp_path, {"warm_start": "frozenlake"}))
    assert "lora" not in data["job"]
    spec = job_spec(data["job"])
    assert not spec.HasField("lora") and settings_of(spec) is None
    assert LoraSettings.from_proto(T.LoraConfig(rank=1, alpha=1)).target_modules == DEFAULT_TARGETS


@pytest.mark.parametrize(
    "lora, says",
    [
        ({"rank": 0, "alpha": 1}, "model.lora.rank"),
        ({"rank": 257, "alpha": 1}, "model.lora.rank"),
        ({"rank": 8, "alpha": 0}, "model.lora.alpha"),
        ({"rank": 8, "alpha": float("nan")}, "model.lora.*alpha"),
        ({"rank": 8, "alpha": 1, "dropout": 1.0}, "model.lora.dropout"),
        ({"rank": 8, "alpha": 1, "dropout": -0.1}, "model.lora.dropout"),
        ({"rank": "eight", "alpha": 1}, "model.lora"),
        ({"rank": 8, "alpha": 1, "rnak": 2}, "model.lora.rnak: unknown key"),
        ("yes", "model.lora: expected a mapping"),
    ],
)
def test_bad_job_file_lora_is_refused_naming_the_key(tmp_path: Path, lora: Any, says: str) -> None:
    with pytest.raises(SpecError, match=says):
        load_job_file(job_file(tmp_path, {"lora": lora}))
    assert model_lora({"model": {}}) is None


def spec(model: Path, **lora: Any) -> T.TrainerJobSpec:
    s = T.TrainerJobSpec(job_id="j", model=str(model), batch_size=4, group_size=2)
    s.lora.CopyFrom(T.LoraConfig(**{"rank": 4, "alpha": 8.0, **lora}))
    return s


def refused(s: T.TrainerJobSpec) -> errors.InvalidArgument:
    with pytest.raises(errors.InvalidArgument) as info:
        validators.check_spec(s)
    return info.value


def test_good_lora_specs_pass(tiny_model: Path) -> None:
    validators.check_spec(spec(tiny_model))
    validators.check_spec(spec(tiny_model, rank=64, dropout=0.1, target_modules=["mlp.down_proj", "q_proj"]))
    validators.check_spec(spec(tiny_model, target_modules=["q_proj"], trainable_modules=["lm_head"]))
    validators.check_spec(T.TrainerJobSpec(job_id="j", model=str(tiny_model), batch_size=4, group_size=2))


@pytest.mark.parametrize(
    "lora, field, says",
    [
        ({"rank": 0}, "spec.lora.rank", "within [1, 256]"),
        ({"rank": -3}, "spec.lora.rank", "within"),
        ({"rank": 1 << 30}, "spec.lora.rank", "within [1, 256]"),  # oversized
        ({"rank": 256}, "spec.lora.rank", "exceeds the smallest dimension (64)"),  # larger than v_proj's 64 outputs
        ({"alpha": 0.0}, "spec.lora.alpha", "within"),
        ({"alpha": -1.0}, "spec.lora.alpha", "within"),
        ({"alpha": float("inf")}, "spec.lora.alpha", "finite"),
        ({"dropout": 1.0}, "spec.lora.dropout", "within [0, 1)"),
        ({"dropout": float("nan")}, "spec.lora.dropout", "finite"),
        ({"target_modules": ["q_proj", "attn.c_attn"]}, "spec.lora.target_modules[1]", "no linear layer"),
        ({"target_modules": ["q_proj", "q_proj"]}, "spec.lora.target_modules[1]", "listed twice"),
        ({"target_modules": ["q_proj; rm -rf /"]}, "spec.lora.target_modules[0]", "module name"),
        ({"target_modules": ["x" * 5000]}, "spec.lora.target_modules[0]", "module name"),
        ({"target_modules": [f"m{i}" for i in range(65)]}, "spec.lora.target_modules", "0 to 64 entries"),
        ({"target_modules": ["input_layernorm"]}, "spec.lora.target_modules[0]", "no linear layer"),
        ({"trainable_modules": ["wte"]}, "spec.lora.trainable_modules[0]", "no module"),
        ({"trainable_modules": ["q_proj"]}, "spec.lora.trainable_modules[0]", "already has an adapter"),
        ({"trainable_modules": [""]}, "spec.lora.trainable_modules[0]", "module name"),
    ],
)
def test_bad_lora_is_refused_naming_the_field(tiny_model: Path, lora: dict[str, Any], field: str, says: str) -> None:
    err = refused(spec(tiny_model, **lora))
    assert err.field == field, err.details()
    assert says in err.details()


def test_an_empty_lora_section_is_not_a_full_weight_job(tiny_model: Path) -> None:
    s = T.TrainerJobSpec(job_id="j", model=str(tiny_model), batch_size=4, group_size=2)
    s.lora.SetInParent()  # present with no rank: refused, never silently trained in full
    assert refused(s).field == "spec.lora.rank"


@pytest.mark.parametrize("backend", [T.TRAINER_BACKEND_UNSPECIFIED, T.TRAINER_BACKEND_TORCH, T.TRAINER_BACKEND_FSDP2])
def test_torch_and_fsdp2_train_lora(tiny_model: Path, backend: int) -> None:
    s = spec(tiny_model)
    s.backend = backend  # type: ignore[assignment]
    validators.check_spec(s)


def test_megatron_is_refused_naming_spec_lora(tiny_model: Path) -> None:
    s = spec(tiny_model)
    s.backend = T.TRAINER_BACKEND_MEGATRON
    with pytest.raises(errors.InvalidArgument) as info:
        check_lora(s)  # StartJob's LoRA check itself: check_spec refuses megatron sooner without megatron-core
    err = info.value
    assert err.field == "spec.lora" and "megatron-core ships no LoRA" in err.details()
    assert "fsdp2" in err.details()
    err = refused(s)
    assert err.field in ("spec.lora", "spec.backend")  # spec.backend: megatron-core is not installed


def test_a_broken_model_config_is_refused_naming_the_model(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text("{}")
    assert refused(spec(tmp_path)).field == "spec.model"


def test_the_model_check_never_changes_torch_s_default_dtype(tiny_model: Path, monkeypatch) -> None:
    """StartJob runs while a job may train in another thread (an idempotent StartJob): building the model on the
    meta device must not switch the process-wide default dtype to the config's bf16, even for a moment."""
    import json

    import torch

    assert json.loads((tiny_model / "config.json").read_text()).get("dtype", "bfloat16") != "float32"
    seen: list[torch.dtype] = []
    real = torch.set_default_dtype

    def spy(d: torch.dtype) -> None:
        seen.append(d)
        real(d)

    monkeypatch.setattr(torch, "set_default_dtype", spy)
    validators.check_spec(spec(tiny_model))
    assert all(d == torch.float32 for d in seen), seen
