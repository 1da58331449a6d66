"""bench_weights_scale's served checkpoints and updates for the actor's pause (--pause): pure parts, tiny shape."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from bench.weights.weights_scale import (
    SHAPES,
    delta_every_tensor,
    pause_table,
    perturbed_entries,
    served_tensors,
    untied_config,
    write_bf16_safetensors,
    write_full_checkpoint,
    write_random_checkpoint,
)
from rollart.delta import WeightSet, apply_delta, decode_delta, load_safetensors, weights_digest
from rollart.delta.errors import AuthError, BaseMismatchError, DeltaError
from tests.unit.actor.actor_testlib import JOB, KEY

TEMPLATE = {
    "architectures": ["Qwen3ForCausalLM"],
    "model_type": "qwen3",
    "hidden_size": 256,
    "num_hidden_layers": 4,
    "layer_types": ["full_attention"] * 4,
    "tie_word_embeddings": True,
    "eos_token_id": 2,
    "rope_parameters": {"rope_theta": 10000.0, "rope_type": "default"},
}


@pytest.fixture
def tokenizer_dir(tmp_path: Path) -> Path:
    d = tmp_path / "tok"
    d.mkdir()
    (d / "config.json").write_text(json.dumps(TEMPLATE))
    (d / "tokenizer.json").write_text("{}")
    return d


@pytest.mark.parametrize("size", ["tiny", "0.6b", "1.7b"])
def test_config_is_untied_with_the_size_shape(size: str) -> None:
    hidden, layers, inter, q, kv, head, vocab = SHAPES[size]
    cfg = untied_config(TEMPLATE, size)
    assert cfg["tie_word_embeddings"] is False
    assert (cfg["hidden_size"], cfg["num_hidden_layers"], cfg["intermediate_size"]) == (hidden, layers, inter)
    assert (cfg["num_attention_heads"], cfg["num_key_value_heads"], cfg["head_dim"], cfg["vocab_size"]) == (
        q,
        kv,
        head,
        vocab,
    )
    assert cfg["layer_types"] == ["full_attention"] * layers
    assert cfg["eos_token_id"] == 2 and cfg["rope_parameters"] == TEMPLATE["rope_parameters"]  # kept
    assert TEMPLATE["tie_word_embeddings"] is True  # the template is not modified


def test_served_tensors_have_a_separate_lm_head() -> None:
    shapes = served_tensors("0.6b")
    assert shapes["lm_head.weight"] == shapes["model.embed_tokens.weight"] == (151936, 1024)
    assert shapes["model.layers.27.self_attn.q_proj.weight"] == (16 * 128, 1024)
    assert "model.layers.28.mlp.up_proj.weight" not in shapes
    params = sum(int(np.prod(s)) for s in shapes.values())
    assert 0.75e9 < params < 0.76e9  # Qwen3-0.6B's 596M plus the 156M-entry lm_head


def test_random_checkpoint_is_untied_and_identified(tmp_path: Path, tokenizer_dir: Path) -> None:
    out = tmp_path / "m"
    h0 = write_random_checkpoint(out, "tiny", tokenizer_dir, seed=3)
    ws = load_safetensors(out / "model.safetensors")
    assert {n: a.shape for n, a in ws.arrays.items()} == served_tensors("tiny")
    assert set(ws.dtypes.values()) == {"BF16"}
    assert ws.version == 0 and ws.metadata["rollart.job"] == JOB
    assert ws.applied_hash == h0 == weights_digest(ws.arrays, ws.dtypes)
    assert not np.array_equal(ws.arrays["lm_head.weight"], ws.arrays["model.embed_tokens.weight"])
    cfg = json.loads((out / "config.json").read_text())
    assert cfg["tie_word_embeddings"] is False and cfg["vocab_size"] == SHAPES["tiny"][6]
    assert (out / "tokenizer.json").exists()
    # Deterministic: the same seed gives the same weights.
    assert write_random_checkpoint(tmp_path / "again", "tiny", tokenizer_dir, seed=3) == h0


def test_writer_refuses_a_tensor_of_another_shape(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="produced"):
        write_bf16_safetensors(tmp_path / "x.safetensors", {"a": (4, 4)}, lambda n: np.zeros((4, 5), np.uint16), {})


def test_perturbed_entries_move_a_few_ulps() -> None:
    flat = np.arange(1000, 11000, dtype=np.uint16)
    pos, new = perturbed_entries(flat, 0.01, np.random.default_rng(0))
    assert np.all(np.diff(pos) > 0) and 90 <= pos.size <= 100
    d = np.abs(new.astype(np.int32) - flat[pos].astype(np.int32))
    assert d.min() >= 1 and d.max() <= 3
    assert perturbed_entries(np.zeros(10, np.uint16), 0.01, np.random.default_rng(0))[0].size == 1  # at least one


def test_delta_touches_every_tensor_and_chains(tmp_path: Path, tokenizer_dir: Path) -> None:
    out = tmp_path / "m"
    h0 = write_random_checkpoint(out, "tiny", tokenizer_dir)
    base = load_safetensors(out / "model.safetensors")
    raws = delta_every_tensor(base, 0.01, 7, version=1, base_hash=h0, key=KEY, job=JOB)
    delta = decode_delta(raws, KEY, job=JOB, version=1)
    target = WeightSet({n: a.copy() for n, a in base.arrays.items()}, dict(base.dtypes), 0, h0)
    assert apply_delta(delta, target)
    assert target.version == 1 and target.applied_hash == delta.hash
    for name, a in base.arrays.items():
        changed = np.count_nonzero(a != target.arrays[name]) / a.size
        assert 0 < changed <= 0.011 + 1 / a.size, name
    # Version 2 is based on version 1's h(v): applies to the weights version 1 produced, not to others.
    raws2 = delta_every_tensor(base, 0.01, 8, version=2, base_hash=delta.hash, key=KEY, job=JOB)
    d2 = decode_delta(raws2, KEY, job=JOB)
    stale = WeightSet({n: a.copy() for n, a in base.arrays.items()}, dict(base.dtypes), 1, h0)
    with pytest.raises(BaseMismatchError):
        apply_delta(d2, stale)
    assert all(np.array_equal(stale.arrays[n], base.arrays[n]) for n in base.arrays)  # nothing written
    assert apply_delta(d2, target) and target.version == 2


def test_delta_segments_are_authenticated(tmp_path: Path, tokenizer_dir: Path) -> None:
    out = tmp_path / "m"
    h0 = write_random_checkpoint(out, "tiny", tokenizer_dir)
    base = load_safetensors(out / "model.safetensors")
    raws = delta_every_tensor(base, 0.01, 7, version=1, base_hash=h0, key=KEY, job=JOB)
    with pytest.raises(AuthError):
        decode_delta(raws, b"another-job-key-0123456789abcdef")
    cut = [*raws[:-1], raws[-1][:-5]]
    with pytest.raises(DeltaError):
        decode_delta(cut, KEY)


def test_full_checkpoint_changes_every_tensor(tmp_path: Path, tokenizer_dir: Path) -> None:
    out = tmp_path / "m"
    write_random_checkpoint(out, "tiny", tokenizer_dir)
    base = load_safetensors(out / "model.safetensors")
    write_full_checkpoint(tmp_path / "full", base, 0.01, 9, version=4)
    full = load_safetensors(tmp_path / "full" / "model.safetensors")
    assert full.version == 4 and full.applied_hash is None and full.metadata["rollart.job"] == JOB
    for name, a in base.arrays.items():
        assert full.arrays[name].shape == a.shape
        assert 0 < np.count_nonzero(full.arrays[name] != a) / a.size <= 0.011 + 1 / a.size, name


def test_pause_table_has_a_line_per_size_and_kind_and_says_what_was_skipped() -> None:
    m = {"bytes": 2e6, "tensors": 47, "server_ms": 400, "load_ms": 250, "gap_ms": 1100, "rpc_ms": 700, "recomputed": 4}
    rows = [
        {"size": "tiny", "pause": {"served_bytes": 1e7, "engine_start_s": 40, "delta": m, "full": m}},
        {"size": "1.7b", "pause": {"served_bytes": 4e9, "skipped": "MemAvailable 9.0 GiB < 15.2 GiB needed"}},
        {"size": "0.6b"},  # codec only
    ]
    lines = pause_table(rows).splitlines()
    assert len(lines) == 2 + 2 + 1
    assert all(line.count("|") == lines[0].count("|") for line in lines)
    assert "delta, every tensor" in lines[2] and "full checkpoint" in lines[3] and "| 4 (0) |" in lines[2]
    assert "skipped: MemAvailable 9.0 GiB" in lines[4]
