"""HF <-> Megatron conversion of the Qwen3 family: exact both ways (bf16 bit patterns), fused QKV interleaved per
query group, gate/up per tensor-parallel rank, on the tiny Qwen3 and on a randomly initialised Qwen3-0.6B-shaped
model (one layer at a time: its 1.2 GB of bf16 weights never exist at once)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from rollart_trainer.megatron import convert  # noqa: E402
from rollart_trainer.megatron.convert import Qwen3Layout, UnsupportedModel  # noqa: E402

#: Qwen/Qwen3-0.6B's config.json (the shapes; weights are random here, no hub access).
QWEN3_0_6B = {
    "architectures": ["Qwen3ForCausalLM"],
    "model_type": "qwen3",
    "hidden_size": 1024,
    "intermediate_size": 3072,
    "num_hidden_layers": 28,
    "num_attention_heads": 16,
    "num_key_value_heads": 8,
    "head_dim": 128,
    "hidden_act": "silu",
    "max_position_embeddings": 40960,
    "rms_norm_eps": 1e-06,
    "rope_theta": 1000000,
    "rope_scaling": None,
    "attention_bias": False,
    "tie_word_embeddings": True,
    "vocab_size": 151936,
}


def bits(t: torch.Tensor) -> torch.Tensor:
    return t.contiguous().view(torch.int16)


def round_trip(layout: Qwen3Layout, hf: dict[str, torch.Tensor], tp: int) -> dict[str, torch.Tensor]:
    shards = [convert.hf_to_megatron(layout, hf, tp, r) for r in range(tp)]
    return convert.megatron_to_hf(layout, shards)


def test_round_trip_of_the_tiny_qwen3_is_bit_exact(tiny_model: Path, tiny_tied_model: Path) -> None:
    from safetensors.torch import load_file

    for path in (tiny_model, tiny_tied_model):
        layout = Qwen3Layout.from_hf_config(json.loads((path / "config.json").read_text()))
        hf = {k: v.to(torch.bfloat16) for k, v in load_file(str(path / "model.safetensors")).items()}
        hf.pop("lm_head.weight", None) if layout.tied else None
        assert sorted(hf) == convert.hf_names(layout)
        assert {k: tuple(v.shape) for k, v in hf.items()} == convert.hf_shapes(layout)
        for tp in (1, 2):
            back = round_trip(layout, hf, tp)
            assert sorted(back) == sorted(hf)
            for name, t in hf.items():
                assert back[name].dtype == torch.bfloat16 and torch.equal(bits(back[name]), bits(t)), (tp, name)


def test_qkv_is_interleaved_per_query_group_and_split_by_groups() -> None:
    layout = Qwen3Layout.from_hf_config(dict(QWEN3_0_6B, num_hidden_layers=1, hidden_size=2, head_dim=1))
    # 16 query heads, 8 groups, head_dim 1: row value says which head of which projection it is.
    q = torch.arange(16, dtype=torch.float32)[:, None].expand(16, 2) + 100
    k = torch.arange(8, dtype=torch.float32)[:, None].expand(8, 2) + 200
    v = torch.arange(8, dtype=torch.float32)[:, None].expand(8, 2) + 300
    rule = next(r for r in convert.rules(layout) if r.kind == convert.QKV)
    fused = convert.to_megatron(layout, rule, [q, k, v], 1, 0)[:, 0].tolist()
    expected = []
    for g in range(8):
        expected += [100 + 2 * g, 101 + 2 * g, 200 + g, 300 + g]
    assert fused == expected
    for r in range(4):  # tensor parallel 4: rank r holds groups 2r and 2r+1, whole
        assert convert.to_megatron(layout, rule, [q, k, v], 4, r)[:, 0].tolist() == expected[8 * r : 8 * r + 8]


def test_gate_up_are_stacked_per_rank() -> None:
    layout = Qwen3Layout.from_hf_config(dict(QWEN3_0_6B, num_hidden_layers=1, intermediate_size=4, hidden_size=1))
    rule = next(r for r in convert.rules(layout) if r.kind == convert.GATE_UP)
    gate, up = torch.tensor([[0.0], [1], [2], [3]]), torch.tensor([[10.0], [11], [12], [13]])
    assert convert.to_megatron(layout, rule, [gate, up], 1, 0)[:, 0].tolist() == [0, 1, 2, 3, 10, 11, 12, 13]
    assert convert.to_megatron(layout, rule, [gate, up], 2, 0)[:, 0].tolist() == [0, 1, 10, 11]
    assert convert.to_megatron(layout, rule, [gate, up], 2, 1)[:, 0].tolist() == [2, 3, 12, 13]


@pytest.mark.slow
def test_round_trip_of_a_random_qwen3_0_6b_shaped_model_is_bit_exact() -> None:
    """Every tensor of the 0.6B shapes through tensor parallel 1, 2 and 8 and back, layer by layer."""
    layout = Qwen3Layout.from_hf_config(QWEN3_0_6B)
    assert layout.tied and layout.rope_theta == 1e6 and (layout.heads, layout.kv_heads) == (16, 8)
    shapes = convert.hf_shapes(layout)
    gen = torch.Generator().manual_seed(0)
    checked = 0
    for rule in convert.rules(layout):
        hf = {n: torch.randn(shapes[n], generator=gen).to(torch.bfloat16) for n in rule.hf}
        for tp in (1, 2, 8):
            shards = [convert.to_megatron(layout, rule, [hf[n] for n in rule.hf], tp, r) for r in range(tp)]
            back = convert.to_hf(layout, rule, shards)
            for name, t in zip(rule.hf, back, strict=True):
                assert torch.equal(bits(t), bits(hf[name])), (tp, name)
            del shards, back
        checked += len(hf)
        del hf
    assert checked == len(shapes) == 2 + 28 * 11  # tied: no lm_head.weight


def test_unknown_models_and_layouts_are_named() -> None:
    with pytest.raises(UnsupportedModel, match="llama"):
        Qwen3Layout.from_hf_config(dict(QWEN3_0_6B, model_type="llama"))
    with pytest.raises(UnsupportedModel, match="attention_bias"):
        Qwen3Layout.from_hf_config(dict(QWEN3_0_6B, attention_bias=True))
    layout = Qwen3Layout.from_hf_config(QWEN3_0_6B)
    assert layout.parallel_errors(8, 1) == layout.parallel_errors(4, 4) == layout.parallel_errors(2, 7) == []
    errs = layout.parallel_errors(3, 5)
    assert ("tensor_parallel_size", "attention heads (16) is not divisible by tensor_parallel_size 3") in errs
    assert ("pipeline_parallel_size", "28 layers are not divisible by 5 stages") in errs
    assert any("key/value heads (8)" in why for _, why in layout.parallel_errors(16, 1))


def test_converter_names_and_shapes_are_megatrons_for_qwen3_0_6b() -> None:
    """The converter's rules name every parameter of Megatron's GPTModel with its shape (built on the meta
    device: no memory)."""
    pytest.importorskip("megatron.core")
    from rollart_trainer.megatron.backend import init_model_parallel
    from rollart_trainer.megatron.model import build_gpt_model

    init_model_parallel(1)
    layout = Qwen3Layout.from_hf_config(QWEN3_0_6B)
    with torch.device("meta"):
        gpt = build_gpt_model(layout)
    params = {n: tuple(p.shape) for n, p in gpt.named_parameters()}
    shapes = convert.hf_shapes(layout)
    ours = {}
    for rule in convert.rules(layout):
        full = [torch.empty(shapes[n], device="meta") for n in rule.hf]
        ours[rule.megatron] = tuple(convert.to_megatron(layout, rule, full, 1, 0).shape)
    assert ours == params
