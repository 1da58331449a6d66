"""bf16 export: bit-exact with torch's cast, named like the checkpoint files, usable by the delta codec."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from rollart.delta import apply_delta, decode_delta, encode_delta, load_safetensors  # noqa: E402
from rollart_trainer.grpo import GrpoSettings, TorchBackend, TrainBatch  # noqa: E402
from rollart_trainer.policy import Policy, bf16_bits  # noqa: E402

from .test_loss import _random_batch, _set_behaviour  # noqa: E402


def _rne_bf16(x: np.ndarray) -> np.ndarray:
    """Independent round-to-nearest-even fp32 -> bf16 on the bits (finite values and infinities)."""
    u = x.astype(np.float32).view(np.uint32).astype(np.uint64)
    rounded = (u + 0x7FFF + ((u >> 16) & 1)) >> 16
    return rounded.astype(np.uint16)


def test_bf16_bits_equal_torch_cast_including_edge_cases() -> None:
    g = torch.Generator().manual_seed(0)
    x = torch.randn(4096, generator=g) * torch.logspace(-40, 38, 4096).float()
    edge = torch.tensor(
        [
            0.0,
            -0.0,
            float("inf"),
            float("-inf"),
            float("nan"),
            1e-45,
            -1e-45,
            1.17549435e-38,
            3.4028235e38,
            1.0 + 2.0**-8,
            1.0 + 3 * 2.0**-8,
            -(1.0 + 2.0**-8),
            1.0 + 2.0**-8 + 2.0**-20,
        ],
        dtype=torch.float32,
    )
    x = torch.cat([x, edge]).reshape(-1, 7)
    got = bf16_bits(x)
    assert got.dtype == np.uint16 and got.shape == tuple(x.shape) and got.flags.c_contiguous
    expected = x.to(torch.bfloat16).view(torch.uint16).numpy()
    np.testing.assert_array_equal(got, expected)
    finite_or_inf = ~np.isnan(x.numpy())
    np.testing.assert_array_equal(got[finite_or_inf], _rne_bf16(x.numpy()[finite_or_inf]))
    # ties round to even: 1 + 2^-8 is halfway between 1 and 1 + 2^-7 -> 1.0 (0x3F80)
    assert bf16_bits(torch.tensor([1.0 + 2.0**-8])).tolist() == [0x3F80]
    assert bf16_bits(torch.tensor([1.0 + 3 * 2.0**-8])).tolist() == [0x3F82]


@pytest.mark.parametrize("fixture", ["tiny_model", "tiny_tied_model"])
def test_export_of_a_loaded_checkpoint_reproduces_its_file(fixture: str, request: pytest.FixtureRequest) -> None:
    path: Path = request.getfixturevalue(fixture)
    policy = Policy.load(path)
    assert next(policy.model.parameters()).dtype == torch.float32
    exported = policy.export_bf16()
    on_disk = load_safetensors(path / "model.safetensors")
    assert list(exported) == list(on_disk.arrays)  # same names, same (sorted) order; tied weights once
    for name, arr in exported.items():
        assert arr.dtype == np.uint16 and on_disk.dtypes[name] == "BF16"
        np.testing.assert_array_equal(arr, on_disk.arrays[name], err_msg=name)
    ws = policy.weight_set(version=0)
    assert ws.version == 0 and set(ws.dtypes.values()) == {"BF16"}


def test_export_after_training_is_the_cast_of_the_master_weights(tiny_model: Path) -> None:
    b = TorchBackend.from_pretrained(tiny_model, GrpoSettings(learning_rate=1e-3))
    samples = _random_batch(2)
    _set_behaviour(samples, b.action_logprobs(samples))
    b.train_step(TrainBatch(samples, "e"))
    masters = dict(b.policy.named_tensors())
    exported = b.export()
    for name, arr in exported.items():
        np.testing.assert_array_equal(arr, masters[name].detach().to(torch.bfloat16).view(torch.uint16).numpy())
    # into caller-owned buffers: same bits, same arrays
    bufs = {n: np.zeros_like(a) for n, a in exported.items()}
    again = b.export(out=bufs)
    for name in exported:
        assert again[name] is bufs[name]
        np.testing.assert_array_equal(bufs[name], exported[name])
    with pytest.raises(ValueError, match="out buffer"):
        b.export(out={n: np.zeros((1,), np.uint16) for n in exported})
    # what the publisher does with it: D_1 from the file to the export reproduces the export exactly
    base = load_safetensors(tiny_model / "model.safetensors", writable=True)
    base.version = 0
    target = b.weight_set(version=1)
    key = b"k" * 32
    delta = decode_delta(list(encode_delta(base, target, job="j", version=1, key=key)), key, job="j", version=1)
    assert apply_delta(delta, base)
    for name, arr in target.arrays.items():
        np.testing.assert_array_equal(base.arrays[name], arr)
