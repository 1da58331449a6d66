from __future__ import annotations

import numpy as np
from delta_testlib import KEY, qwen3_like, same_bits, train_step

from rollart.delta import ParamMap, WeightSet, apply_delta, decode_delta, encode_delta, weights_digest


def test_qwen3_fused_names_and_offsets() -> None:
    ws = qwen3_like(np.random.default_rng(0), layers=2, hidden=32)
    pm = ParamMap.from_weights(ws)
    names = pm.engine_names()
    assert "model.layers.0.self_attn.qkv_proj.weight" in names
    assert "model.layers.1.mlp.gate_up_proj.weight" in names
    assert not any(
        n.endswith((".q_proj.weight", ".k_proj.weight", ".v_proj.weight", ".gate_proj.weight")) for n in names
    )
    assert "model.layers.0.self_attn.q_norm.weight" in names  # norms are not fused
    assert "model.layers.0.self_attn.o_proj.weight" in names
    qkv = pm.engine("model.layers.0.self_attn.qkv_proj.weight")
    assert qkv.hf_names == tuple(f"model.layers.0.self_attn.{m}_proj.weight" for m in "qkv")
    q, k, v = (ws.arrays[h] for h in qkv.hf_names)
    assert [p.offset for p in qkv.parts] == [0, q.size, q.size + k.size]  # q first, then k, then v
    assert qkv.shape == (q.shape[0] + k.shape[0] + v.shape[0], q.shape[1])
    gu = pm.engine("model.layers.0.mlp.gate_up_proj.weight")
    assert gu.hf_names == ("model.layers.0.mlp.gate_proj.weight", "model.layers.0.mlp.up_proj.weight")
    assert pm.to_engine("model.layers.0.mlp.up_proj.weight") == (gu.name, gu.parts[1].offset)
    assert pm.hf_group("model.layers.0.self_attn.k_proj.weight") == qkv.hf_names
    assert sorted(pm.hf_names()) == sorted(ws.arrays)  # every HF tensor appears exactly once


def test_fuse_unfuse_round_trip_matches_stacking() -> None:
    ws = qwen3_like(np.random.default_rng(1))
    pm = ParamMap.from_weights(ws)
    engine = pm.fuse_arrays(ws.arrays)
    qkv = engine["model.layers.1.self_attn.qkv_proj.weight"]
    p = "model.layers.1.self_attn."
    expected = np.concatenate(
        [ws.arrays[p + "q_proj.weight"], ws.arrays[p + "k_proj.weight"], ws.arrays[p + "v_proj.weight"]]
    )
    assert np.array_equal(qkv, expected)  # what vLLM's stacked loader builds (rows q, k, v)
    back = pm.unfuse_arrays(engine)
    assert same_bits(WeightSet(back, ws.dtypes), WeightSet(dict(ws.arrays), ws.dtypes))
    # engine names map to themselves: a ParamMap over engine arrays is the identity
    epm = ParamMap.from_specs({n: (a.shape, "BF16") for n, a in engine.items()})
    assert all(not et.fused for et in epm) and epm.engine_names() == pm.engine_names()


def test_biases_fuse_and_incomplete_groups_do_not() -> None:
    specs = {
        "m.layers.0.self_attn.q_proj.bias": ((8,), "F32"),
        "m.layers.0.self_attn.k_proj.bias": ((4,), "F32"),
        "m.layers.0.self_attn.v_proj.bias": ((4,), "F32"),
        "m.layers.1.self_attn.q_proj.weight": ((8, 4), "F32"),  # k and v missing
        "m.layers.1.self_attn.k_proj.weight": ((4, 4), "F32"),
        "m.layers.2.mlp.gate_proj.weight": ((6, 4), "F32"),  # dtypes differ: not fusable
        "m.layers.2.mlp.up_proj.weight": ((6, 4), "BF16"),
        "m.layers.3.mlp.experts.0.gate_proj.weight": ((6, 4), "F32"),  # MoE experts are left alone
        "m.layers.3.mlp.experts.0.up_proj.weight": ((6, 4), "F32"),
    }
    pm = ParamMap.from_specs(specs)
    assert pm.engine("m.layers.0.self_attn.qkv_proj.bias").shape == (16,)
    assert "m.layers.1.self_attn.q_proj.weight" in pm and "m.layers.1.self_attn.qkv_proj.weight" not in pm
    assert "m.layers.2.mlp.gate_proj.weight" in pm and "m.layers.2.mlp.up_proj.weight" in pm
    assert "m.layers.3.mlp.experts.0.gate_proj.weight" in pm
    assert all(not et.fused for et in ParamMap.from_specs(specs, fuse=False))


def test_split_positions_by_block() -> None:
    ws = qwen3_like(np.random.default_rng(2))
    pm = ParamMap.from_weights(ws)
    name = "model.layers.0.self_attn.qkv_proj.weight"
    et = pm.engine(name)
    q, k, v = et.parts
    pos = np.array([0, q.numel - 1, q.numel, k.offset + k.numel - 1, v.offset + 3], dtype=np.int64)
    split = pm.split_positions(name, pos)
    assert [(p.hf_name, sl.start, sl.stop) for p, sl in split] == [
        (q.hf_name, 0, 2),
        (k.hf_name, 2, 4),
        (v.hf_name, 4, 5),
    ]


def test_delta_in_engine_names_applies_to_hf_and_engine_layouts() -> None:
    rng = np.random.default_rng(3)
    v0 = qwen3_like(rng)
    v1 = train_step(rng, v0, 0.05)
    delta = decode_delta(list(encode_delta(v0, v1, job="j", version=1, key=KEY)), KEY)
    pm = ParamMap.from_weights(v0)
    assert set(delta.tensors) <= set(pm.engine_names())
    assert any(pm.engine(n).fused for n in delta.tensors)
    # HF layout (split back into q/k/v by block offsets)
    hf = v0.copy()
    apply_delta(delta, hf)
    assert same_bits(hf, WeightSet(v1.arrays, v1.dtypes))
    # engine layout (vLLM's fused parameters)
    eng = WeightSet(pm.fuse_arrays(v0.arrays), {et.name: et.dtype for et in pm}, version=0)
    eng.applied_hash = weights_digest(v0.arrays, v0.dtypes)  # another layout: its identity is passed, not computed
    apply_delta(delta, eng)
    assert same_bits(eng, WeightSet(pm.fuse_arrays(v1.arrays), eng.dtypes))
    # the HF tensors to reload are whole groups
    names = delta.hf_names(pm)
    for n in names:
        assert set(pm.hf_group(n)) <= set(names)
