"""Helpers for the actor tests: bf16 arithmetic on raw uint16 arrays, realistic deltas, segment messages."""

from __future__ import annotations

import numpy as np

from rollart.delta import WeightSet, encode_delta
from rollart.delta import segment as sg
from rollart.v1 import common_pb2

KEY = b"actor-test-job-key-0123456789abcdef"
JOB = "actor-test"


def bf16_to_f32(raw: np.ndarray) -> np.ndarray:
    return (raw.astype(np.uint32) << 16).view(np.float32)


def f32_to_bf16(x: np.ndarray) -> np.ndarray:
    """Round to nearest even, as torch does."""
    u = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32)
    return ((u + (((u >> 16) & 1) + 0x7FFF)) >> 16).astype(np.uint16)


def perturb(ws: WeightSet, names: list[str], seed: int, scale: float = 0.05) -> WeightSet:
    """A copy of ``ws`` with the given bf16 tensors shifted by seeded Gaussian noise (a training step)."""
    out = ws.copy()
    rng = np.random.default_rng(seed)
    for n in names:
        a = out.arrays[n]
        assert out.dtypes[n] == "BF16", n
        out.arrays[n] = f32_to_bf16(bf16_to_f32(a) + scale * rng.standard_normal(a.shape, dtype=np.float32))
    return out


def layer_projections(ws: WeightSet, layer: int) -> list[str]:
    """Every projection weight of one layer: whole fused groups (q, k, v; gate, up) plus o and down."""
    return sorted(n for n in ws.arrays if f".layers.{layer}." in n and n.endswith("_proj.weight"))


def delta_segments(
    base: WeightSet,
    target: WeightSet,
    *,
    version: int,
    base_version: int,
    key: bytes = KEY,
    job: str = JOB,
    max_segment_bytes: int = 64 * 1024,
) -> tuple[list[common_pb2.DeltaSegment], bytes]:
    """D_version between two weight sets as DeltaSegment messages, and h(v)."""
    raws = list(
        encode_delta(
            base,
            target,
            job=job,
            version=version,
            base_version=base_version,
            key=key,
            max_segment_bytes=max_segment_bytes,
        )
    )
    msgs = []
    for raw in raws:
        seg = sg.parse(raw, key)
        msgs.append(
            common_pb2.DeltaSegment(
                job_id=job,
                version=version,
                base_version=base_version,
                sequence=seg.seq,
                trailer=seg.is_trailer,
                data=raw,
            )
        )
    trailer = sg.parse(raws[-1], key)
    return msgs, trailer.hash


def qwen_like(
    rng: np.random.Generator, layers: int = 2, hidden: int = 32, kv: int = 16, inter: int = 48, vocab: int = 64
) -> WeightSet:
    """A small bf16 weight set with Qwen3's HF names (fusable q/k/v and gate/up)."""
    shapes: dict[str, tuple[int, ...]] = {
        "model.embed_tokens.weight": (vocab, hidden),
        "model.norm.weight": (hidden,),
        "lm_head.weight": (vocab, hidden),
    }
    for i in range(layers):
        p = f"model.layers.{i}"
        shapes.update(
            {
                f"{p}.self_attn.q_proj.weight": (hidden, hidden),
                f"{p}.self_attn.k_proj.weight": (kv, hidden),
                f"{p}.self_attn.v_proj.weight": (kv, hidden),
                f"{p}.self_attn.o_proj.weight": (hidden, hidden),
                f"{p}.mlp.gate_proj.weight": (inter, hidden),
                f"{p}.mlp.up_proj.weight": (inter, hidden),
                f"{p}.mlp.down_proj.weight": (hidden, inter),
                f"{p}.input_layernorm.weight": (hidden,),
            }
        )
    arrays = {n: f32_to_bf16(rng.standard_normal(s, dtype=np.float32) * 0.02) for n, s in shapes.items()}
    return WeightSet(arrays, {n: "BF16" for n in arrays})
