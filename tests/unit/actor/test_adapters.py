"""LoRA mode's host copy (rollart_actor.adapters): the base check, deltas, the peft folder, the pending template,
and the actor's ``lora`` settings. No engine here (tests/integration/actor/test_actor_lora.py runs one)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from pydantic import ValidationError

from rollart.delta import WeightSet, decode_delta, encode_delta, load_safetensors
from rollart.delta.errors import IncompatibleTargetError
from rollart.delta.identity import weights_digest
from rollart_actor.adapters import BASE_HASH, AdapterHost, adapter_shapes, base_digest, load_adapter_host, template
from rollart_actor.config import ActorConfig, ActorLoraConfig
from rollart_actor.host_weights import WeightError
from tests.unit.actor.actor_testlib import JOB, KEY, qwen_like

SETTINGS = ActorLoraConfig(rank=4, alpha=8)


def _cfg(**lora) -> ActorConfig:
    return ActorConfig(model="/m", insecure_disable_auth=True, lora=lora)


def _base() -> WeightSet:
    return qwen_like(np.random.default_rng(0))


def _adapter(base: WeightSet, seed: int = 1) -> WeightSet:
    ws = template(base, SETTINGS, base_digest(base))
    rng = np.random.default_rng(seed)
    for n, a in ws.arrays.items():
        if n.endswith(".lora_A.weight"):
            ws.arrays[n] = rng.standard_normal(a.shape).astype(np.float32)
    ws.version = 0
    ws.applied_hash = weights_digest(ws.arrays, ws.dtypes)
    return ws


def _host(base: WeightSet, ws: WeightSet) -> AdapterHost:
    return AdapterHost(ws, 0, ws.applied_hash, settings=SETTINGS, base_hash=base_digest(base), base_model="/m")


def _delta(a: WeightSet, b: WeightSet, v: int):
    return decode_delta(list(encode_delta(a, b, job=JOB, version=v, base_version=v - 1, key=KEY)), KEY)


def test_template_names_and_shapes_follow_peft_and_the_base() -> None:
    base = _base()
    shapes = adapter_shapes(base, SETTINGS)
    q = "base_model.model.model.layers.0.self_attn.q_proj"
    assert shapes[f"{q}.lora_A.weight"] == (4, 32) and shapes[f"{q}.lora_B.weight"] == (32, 4)
    assert shapes["base_model.model.model.layers.1.mlp.down_proj.lora_A.weight"] == (4, 48)
    assert len(shapes) == 2 * 7 * 2  # 2 layers x 7 projections x (A, B); embeddings and norms not targeted
    only_q = adapter_shapes(base, ActorLoraConfig(rank=2, alpha=1, target_modules=["q_proj"]))
    assert len(only_q) == 4
    with pytest.raises(WeightError, match="no 2-d weight"):
        template(base, ActorLoraConfig(rank=2, alpha=1, target_modules=["nothing_here"]), bytes(32))


def test_a_set_for_another_base_is_refused_before_anything_is_applied() -> None:
    base = _base()
    ws = _adapter(base)
    host = _host(base, ws)
    wrong = ws.copy()
    wrong.arrays[BASE_HASH] = np.full(32, 1, np.uint8)
    with pytest.raises(WeightError, match="trained on base 0101") as err:
        host.check_full(wrong)
    assert err.value.code == "FAILED_PRECONDITION"
    with pytest.raises(WeightError, match="trained on base"):
        _host(base, wrong)
    missing = ws.copy()
    del missing.arrays[BASE_HASH]
    with pytest.raises(WeightError, match="no rollart.base_hash"):
        host.check_full(missing)
    other_rank = template(base, ActorLoraConfig(rank=8, alpha=8), base_digest(base))
    with pytest.raises(WeightError, match="rank"):
        host.check_full(other_rank)


def test_deltas_apply_to_the_adapter_and_may_not_touch_the_base_hash() -> None:
    base = _base()
    v0 = _adapter(base)
    host = _host(base, v0.copy())
    v1 = v0.copy()
    name = "base_model.model.model.layers.0.mlp.up_proj.lora_B.weight"
    v1.arrays[name] = np.ones_like(v1.arrays[name])
    d1 = _delta(v0, v1, 1)
    host.check_delta(d1)
    touched, _, _ = host.apply_chain([d1])
    assert touched == [name] and np.array_equal(host.ws.arrays[name], v1.arrays[name])
    moved = v1.copy()
    moved.arrays[BASE_HASH] = np.zeros(32, np.uint8)
    v1.applied_hash = d1.hash
    d2 = _delta(v1, moved, 2)
    with pytest.raises(IncompatibleTargetError, match="rollart.base_hash"):
        host.check_delta(d2)


def test_the_peft_folder_holds_the_adapter_without_the_base_hash(tmp_path: Path) -> None:
    base = _base()
    ws = _adapter(base)
    host = _host(base, ws)
    folder = host.adapter_dir(tmp_path, 3)
    assert folder == tmp_path / "adapters" / "v3"
    nbytes = host.write(folder)
    cfg = json.loads((folder / "adapter_config.json").read_text())
    assert cfg["r"] == 4 and cfg["lora_alpha"] == 8 and cfg["peft_type"] == "LORA"
    assert cfg["target_modules"] == SETTINGS.target_modules and cfg["base_model_name_or_path"] == "/m"
    saved = load_safetensors(folder / "adapter_model.safetensors")
    assert BASE_HASH not in saved.arrays and set(saved.arrays) == set(ws.arrays) - {BASE_HASH}
    assert nbytes == sum(a.nbytes for a in saved.arrays.values())
    host.write(folder)  # a second write of the same version replaces the folder
    assert sorted(p.name for p in folder.iterdir()) == ["adapter_config.json", "adapter_model.safetensors"]


def test_start_with_the_adapter_or_pending(tmp_path: Path) -> None:
    from rollart.delta import save_safetensors

    base = _base()
    ws = _adapter(base)
    save_safetensors(tmp_path / "a.safetensors", ws)
    cfg = _cfg(rank=4, alpha=8, adapter=str(tmp_path / "a.safetensors"))
    host = load_adapter_host(base, cfg)
    assert not host.pending and host.version == 0
    pending = load_adapter_host(base, _cfg(rank=4, alpha=8))
    assert pending.pending and pending.hash == b""
    with pytest.raises(WeightError, match="no adapter version loaded"):
        pending.apply_chain([])
    wrong = _cfg(rank=4, alpha=8, base_hash="ab" * 32, adapter=str(tmp_path / "a.safetensors"))
    with pytest.raises(WeightError, match="trained on base"):
        load_adapter_host(base, wrong)


@pytest.mark.parametrize(
    ("lora", "field"),
    [
        ({"rank": 0, "alpha": 8}, "rank"),
        ({"rank": 300, "alpha": 8}, "rank"),
        ({"rank": 8, "alpha": 0}, "alpha"),
        ({"rank": 8}, "alpha"),
        ({"rank": 8, "alpha": 8, "dropout": 1.0}, "dropout"),
        ({"rank": 8, "alpha": 8, "target_modules": []}, "target_modules"),
        ({"rank": 8, "alpha": 8, "target_modules": ["q proj"]}, "target_modules"),
        ({"rank": 8, "alpha": 8, "trainable_modules": ["lm_head"]}, "trainable_modules"),
        ({"rank": 8, "alpha": 8, "base_hash": "xyz"}, "base_hash"),
        ({"rank": 8, "alpha": 8, "max_loras": 1}, "max_loras"),
        ({"rank": 8, "alpha": 8, "unknown": 1}, "unknown"),
    ],
)
def test_bad_lora_settings_are_refused_naming_the_field(lora: dict, field: str) -> None:
    with pytest.raises(ValidationError) as err:
        _cfg(**lora)
    assert field in str(err.value)


def test_the_launchers_lora_settings_reach_every_actors_config() -> None:
    from rollart.job.run import actor_lora_env
    from rollart.job.spec import job_spec, load_job_file
    from rollart.runtime.config import load_config

    data = load_job_file(Path(__file__).resolve().parents[3] / "examples" / "frozenlake-lora.yaml")
    spec = job_spec(data["job"])
    assert spec.HasField("lora")
    env = actor_lora_env(spec.lora, "cd" * 32)
    environ = {"ROLLART_MODEL": "/m", "ROLLART_INSECURE_DISABLE_AUTH": "true", **env}
    cfg = load_config(ActorConfig, environ=environ)
    assert cfg.lora is not None and cfg.weight_hash is None  # v0 is the trainer's adapter, not the base
    assert (cfg.lora.rank, cfg.lora.alpha, cfg.lora.base_hash) == (8, 16.0, "cd" * 32)
    assert cfg.lora.target_modules == list(spec.lora.target_modules)
