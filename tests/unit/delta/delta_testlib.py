"""Helpers shared by the delta codec tests (imported by the test modules beside it)."""

from __future__ import annotations

import numpy as np

from rollart.delta import WeightSet
from rollart.delta.dtypes import BY_NAME

KEY = b"job-key-0123456789abcdef-unit-tests"
OTHER_KEY = b"someone-else's-key-0123456789abcdef"


def random_raw(rng: np.random.Generator, dtype: str, shape: tuple[int, ...]) -> np.ndarray:
    """Random bit patterns of a safetensors dtype (NaNs and all), held in its numpy type."""
    d = BY_NAME[dtype]
    n = int(np.prod(shape, dtype=np.int64))
    if dtype == "BOOL":
        return rng.integers(0, 2, n, dtype=np.uint8).view(np.bool_).reshape(shape)
    raw = rng.integers(0, 256, n * d.itemsize, dtype=np.uint8)
    return raw.view(d.numpy).reshape(shape).copy()


def mutate(rng: np.random.Generator, a: np.ndarray, dtype: str, density: float) -> np.ndarray:
    """Copy of ``a`` with about ``density`` of its elements given new random bit patterns."""
    b = a.copy()
    flat = b.reshape(-1)
    pos = np.flatnonzero(rng.random(flat.size) < density)
    flat[pos] = random_raw(rng, dtype, (pos.size,))
    return b


def qwen3_like(rng: np.random.Generator, layers: int = 2, hidden: int = 32, dtype: str = "BF16") -> WeightSet:
    """A tiny Qwen3-shaped checkpoint (HF names): GQA attention with q/k norms, SwiGLU MLP, tied head."""
    heads, kv_heads, head_dim, inter, vocab = 4, 2, hidden // 4, 3 * hidden, 64
    shapes: dict[str, tuple[int, ...]] = {
        "model.embed_tokens.weight": (vocab, hidden),
        "model.norm.weight": (hidden,),
    }
    for i in range(layers):
        p = f"model.layers.{i}."
        shapes |= {
            p + "input_layernorm.weight": (hidden,),
            p + "post_attention_layernorm.weight": (hidden,),
            p + "self_attn.q_proj.weight": (heads * head_dim, hidden),
            p + "self_attn.k_proj.weight": (kv_heads * head_dim, hidden),
            p + "self_attn.v_proj.weight": (kv_heads * head_dim, hidden),
            p + "self_attn.o_proj.weight": (hidden, heads * head_dim),
            p + "self_attn.q_norm.weight": (head_dim,),
            p + "self_attn.k_norm.weight": (head_dim,),
            p + "mlp.gate_proj.weight": (inter, hidden),
            p + "mlp.up_proj.weight": (inter, hidden),
            p + "mlp.down_proj.weight": (hidden, inter),
        }
    arrays = {n: random_raw(rng, dtype, s) for n, s in shapes.items()}
    return WeightSet(arrays, {n: dtype for n in arrays}, version=0)


def train_step(rng: np.random.Generator, ws: WeightSet, density: float) -> WeightSet:
    """The next version: some entries of every tensor change, the version advances."""
    out = WeightSet(
        {n: mutate(rng, a, ws.dtypes[n], density) for n, a in ws.arrays.items()},
        dict(ws.dtypes),
        None if ws.version is None else ws.version + 1,
    )
    return out


def same_bits(a: WeightSet, b: WeightSet) -> bool:
    if a.arrays.keys() != b.arrays.keys():
        return False
    return all(
        a.arrays[n].shape == b.arrays[n].shape
        and np.array_equal(a.arrays[n].reshape(-1).view(np.uint8), b.arrays[n].reshape(-1).view(np.uint8))
        for n in a.arrays
    )
