"""The weight-update extension's checks, on a small stand-in model (no engine): every rejection happens
before vLLM touches the model, fused engine names are split into HF members, tied aliases are handled."""

from __future__ import annotations

from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("vllm")

from safetensors.torch import save, save_file  # noqa: E402
from torch import nn  # noqa: E402

from rollart_actor.vllm_ext import WeightUpdateError, _ModelIndex, load_payload  # noqa: E402
from rollart_devtools.engine_probe import fuse_like_engine  # noqa: E402

H, Q, KV, FF, V = 8, 8, 4, 12, 16


class _Linear(nn.Module):
    def __init__(self, rows: int, cols: int, output_sizes: list[int] | None = None) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.zeros(rows, cols), requires_grad=False)
        self.weight.output_dim = 0  # vLLM parameters carry their sharded dimensions
        if output_sizes:
            self.output_sizes = output_sizes


class _Norm(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(H), requires_grad=False)


class _Layer(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.self_attn = nn.Module()
        self.self_attn.qkv_proj = _Linear(Q + 2 * KV, H, [Q, KV, KV])
        self.self_attn.o_proj = _Linear(H, Q)
        self.mlp = nn.Module()
        self.mlp.gate_up_proj = _Linear(2 * FF, H, [FF, FF])
        self.mlp.down_proj = _Linear(H, FF)
        self.input_layernorm = _Norm()


class _Model(nn.Module):
    packed_modules_mapping = {
        "qkv_proj": ["q_proj", "k_proj", "v_proj"],
        "gate_up_proj": ["gate_proj", "up_proj"],
    }

    def __init__(self, tied: bool) -> None:
        super().__init__()
        self.model = nn.Module()
        self.model.embed_tokens = _Linear(V, H)
        self.model.layers = nn.ModuleList([_Layer(), _Layer()])
        self.lm_head = _Linear(V, H)
        if tied:
            self.lm_head.weight = self.model.embed_tokens.weight


def _index(tied: bool = False) -> _ModelIndex:
    from vllm.model_executor.model_loader.reload.layerwise import record_metadata_for_reloading

    model = _Model(tied)
    record_metadata_for_reloading(model)
    return _ModelIndex(model, tp_size=1)


def _full_layer(i: int) -> dict[str, torch.Tensor]:
    p = f"model.layers.{i}."
    return {
        p + "self_attn.q_proj.weight": torch.ones(Q, H),
        p + "self_attn.k_proj.weight": torch.ones(KV, H),
        p + "self_attn.v_proj.weight": torch.ones(KV, H),
        p + "self_attn.o_proj.weight": torch.ones(H, Q),
        p + "mlp.gate_proj.weight": torch.ones(FF, H),
        p + "mlp.up_proj.weight": torch.ones(FF, H),
        p + "mlp.down_proj.weight": torch.ones(H, FF),
        p + "input_layernorm.weight": torch.ones(H),
    }


def test_index_lists_hf_names_with_shapes() -> None:
    idx = _index()
    assert idx.shapes["model.layers.0.self_attn.q_proj.weight"] == (Q, H)
    assert idx.shapes["model.layers.0.self_attn.k_proj.weight"] == (KV, H)
    assert idx.shapes["model.layers.1.mlp.up_proj.weight"] == (FF, H)
    assert idx.shapes["lm_head.weight"] == (V, H)
    assert not any("qkv_proj" in n or "gate_up_proj" in n for n in idx.shapes)
    assert len(idx.shapes) == 2 + 2 * 8


def test_whole_layer_and_single_tensors_validate() -> None:
    idx = _index()
    idx.validate(_full_layer(1))
    idx.validate({"model.layers.0.input_layernorm.weight": torch.ones(H)})  # a module of its own
    idx.validate({"model.layers.0.self_attn.o_proj.weight": torch.ones(H, Q)})


@pytest.mark.parametrize("drop", ["self_attn.k_proj.weight", "self_attn.q_proj.weight", "mlp.up_proj.weight"])
def test_partial_fused_group_is_rejected(drop: str) -> None:
    tensors = _full_layer(0)
    del tensors[f"model.layers.0.{drop}"]
    with pytest.raises(WeightUpdateError, match="partial fused group"):
        _index().validate(tensors)


def test_unknown_name_and_wrong_shape_are_rejected() -> None:
    idx = _index()
    with pytest.raises(WeightUpdateError, match="not parameters"):
        idx.validate({"model.layers.7.input_layernorm.weight": torch.ones(H)})
    bad = _full_layer(0)
    bad["model.layers.0.self_attn.v_proj.weight"] = torch.ones(KV + 1, H)
    with pytest.raises(WeightUpdateError, match="shape mismatch"):
        idx.validate(bad)


def test_engine_fused_names_split_into_hf_members() -> None:
    idx = _index()
    layer = {k: torch.randn(v.shape) for k, v in _full_layer(1).items()}
    fused = fuse_like_engine(layer)
    assert (
        "model.layers.1.self_attn.qkv_proj.weight" in fused
        and "model.layers.1.mlp.gate_up_proj.weight" in fused
    )
    assert not any(k.endswith(("q_proj.weight", "gate_proj.weight")) for k in fused)
    back = idx.to_hf(fused)
    assert back.keys() == layer.keys()
    assert all(torch.equal(back[k], layer[k]) for k in layer)
    with pytest.raises(WeightUpdateError, match="rows"):
        idx.to_hf({"model.layers.1.self_attn.qkv_proj.weight": torch.ones(Q, H)})


def test_tied_alias_is_dropped_and_its_module_reprocessed() -> None:
    idx = _index(tied=True)
    assert "lm_head.weight" not in idx.shapes and idx.aliases == {
        "lm_head.weight": "model.embed_tokens.weight"
    }
    hf = idx.to_hf({"lm_head.weight": torch.ones(V, H), "model.embed_tokens.weight": torch.ones(V, H)})
    assert list(hf) == ["model.embed_tokens.weight"]
    assert idx.tied_modules_of({"model.embed_tokens.weight"}) == [idx.modules["lm_head"]]
    assert idx.tied_modules_of({"model.layers.0.input_layernorm.weight"}) == []


def test_payload_from_bytes_file_and_directory(tmp_path: Path) -> None:
    a = {"x": torch.arange(6, dtype=torch.bfloat16).reshape(2, 3)}
    b = {"y": torch.ones(4)}
    assert torch.equal(load_payload(save(a))["x"], a["x"])
    save_file(a, str(tmp_path / "a.safetensors"))
    save_file(b, str(tmp_path / "b.safetensors"))
    assert torch.equal(load_payload(str(tmp_path / "a.safetensors"))["x"], a["x"])
    assert sorted(load_payload(tmp_path)) == ["x", "y"]
    with pytest.raises(WeightUpdateError, match="not found"):
        load_payload(str(tmp_path / "missing.safetensors"))
    (tmp_path / "empty").mkdir()
    with pytest.raises(WeightUpdateError, match="no .safetensors"):
        load_payload(tmp_path / "empty")
