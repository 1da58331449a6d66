"""StartJob's check of a Megatron job: layouts the model cannot take, models the converter does not know, and a
missing megatron-core are INVALID_ARGUMENT naming the field, before anything is loaded."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from rollart.job.spec import job_spec
from rollart.runtime import errors
from rollart_trainer import validators
from rollart_trainer.validators import check_spec

from .test_megatron_convert import QWEN3_0_6B


def spec(model: Path, **kw):
    d = {"job_id": "j", "model": str(model), "backend": "megatron", "batch_size": 8, "group_size": 4}
    d.update(kw)
    return job_spec(d)


@pytest.fixture
def qwen3(tmp_path: Path) -> Path:
    (tmp_path / "config.json").write_text(json.dumps(QWEN3_0_6B))  # validation reads the config only
    return tmp_path


def cores(monkeypatch: pytest.MonkeyPatch, n: int) -> None:
    """The trainer host has ``n`` CPU cores (one rank each)."""
    monkeypatch.setattr(validators, "_rank_capacity", lambda device: (n, "CPU cores"))


def field_of(s) -> str:
    with pytest.raises(errors.InvalidArgument) as exc:
        check_spec(s)
    return exc.value.details()


def test_a_layout_the_model_takes_passes(qwen3: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("megatron.core")
    check_spec(spec(qwen3))
    cores(monkeypatch, 2)
    check_spec(spec(qwen3, parallel={"tensor_parallel_size": 2}))
    check_spec(spec(qwen3, parallel={"pipeline_parallel_size": 2}))  # 28 layers, 14 per stage
    cores(monkeypatch, 8)
    check_spec(spec(qwen3, parallel={"tensor_parallel_size": 2, "pipeline_parallel_size": 4}))


def test_bad_layouts_name_the_field(qwen3: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("megatron.core")
    cores(monkeypatch, 3)
    msg = field_of(spec(qwen3, parallel={"tensor_parallel_size": 3}))
    assert msg.startswith("spec.parallel.tensor_parallel_size") and "heads (16)" in msg
    msg = field_of(spec(qwen3, parallel={"pipeline_parallel_size": 3}))
    assert msg.startswith("spec.parallel.pipeline_parallel_size") and "28 layers" in msg
    msg = field_of(spec(qwen3, parallel={"pipeline_parallel_size": 8}))  # 28 layers: 3.5 per stage
    assert msg.startswith("spec.parallel.pipeline_parallel_size") and "28 layers are not divisible by 8" in msg
    cores(monkeypatch, 1)
    msg = field_of(spec(qwen3, parallel={"tensor_parallel_size": 2}))  # one core: no room for a second rank
    assert msg.startswith("spec.parallel.tensor_parallel_size") and "= 2 ranks, more than the 1 CPU cores" in msg
    # The trainer starts stages x tensor-parallel ranks itself, one core (or GPU) each: more are refused.
    cores(monkeypatch, 4)
    msg = field_of(spec(qwen3, parallel={"tensor_parallel_size": 4, "pipeline_parallel_size": 2}))
    assert msg.startswith("spec.parallel.pipeline_parallel_size") and "= 8 ranks, more than the 4" in msg
    check_spec(spec(qwen3, parallel={"pipeline_parallel_size": 2}))  # fewer ranks than cores is fine
    monkeypatch.setattr(validators, "_rank_capacity", lambda device: (1, "GPUs"))
    msg = field_of(spec(qwen3, device="cuda", parallel={"pipeline_parallel_size": 2}))
    assert msg.startswith("spec.parallel.pipeline_parallel_size") and "1 GPUs" in msg
    assert field_of(spec(qwen3, parallel={"pipeline_parallel_size": -2})).startswith(
        "spec.parallel.pipeline_parallel_size"
    )
    assert field_of(spec(qwen3, parallel={"pipeline_parallel_size": 1 << 20})).startswith(
        "spec.parallel.pipeline_parallel_size"
    )
    assert field_of(spec(qwen3, parallel={"tensor_parallel_size": -1})).startswith("spec.parallel.tensor_parallel_size")
    # Only the Megatron backend splits a model.
    msg = field_of(spec(qwen3, backend="torch", parallel={"tensor_parallel_size": 2}))
    assert msg.startswith("spec.parallel.tensor_parallel_size") and "megatron" in msg
    msg = field_of(spec(qwen3, backend="fsdp2", parallel={"pipeline_parallel_size": 2}))
    assert msg.startswith("spec.parallel.pipeline_parallel_size") and "megatron" in msg


def test_models_the_converter_does_not_know_name_the_model(qwen3: Path, tmp_path: Path) -> None:
    pytest.importorskip("megatron.core")
    llama = tmp_path / "llama"
    llama.mkdir()
    (llama / "config.json").write_text(json.dumps(dict(QWEN3_0_6B, model_type="llama")))
    msg = field_of(spec(llama))
    assert msg.startswith("spec.model") and "llama" in msg
    assert field_of(spec("Qwen/Qwen3-0.6B")).startswith("spec.model")  # a hub name: no config to check here


def test_megatron_core_missing_names_the_backend(qwen3: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("megatron", "megatron.core"):  # what an environment without the extra sees
        monkeypatch.setitem(sys.modules, name, None)
    msg = field_of(spec(qwen3))
    assert msg.startswith("spec.backend") and "megatron-core is not installed" in msg
    check_spec(spec(qwen3, backend="torch"))  # the other backends do not need it
