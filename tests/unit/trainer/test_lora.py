"""LoRA training on a real tiny Qwen3 with the real peft (docs/lora.md): a step moves only the adapter, the base
stays bit-identical; version 0's policy is the base (lora_B = 0); the KL reference is the base's logprobs with no
second model copy; checkpoints hold the adapter and optimizer only and restore onto the base (not onto another);
a published version is peft's tensor names plus rollart.base_hash = h(v0) of the base. The FSDP2 LoRA backend in a
world of one matches it (two ranks: test_fsdp.py)."""

from __future__ import annotations

import socket
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("peft")

from rollart.delta import WeightSet, load_safetensors, save_safetensors  # noqa: E402
from rollart.delta.identity import weights_digest  # noqa: E402
from rollart.job.spec import model_dir_digest  # noqa: E402
from rollart_trainer.backends import make_backend  # noqa: E402
from rollart_trainer.checkpoint import CheckpointManager, TrainerState  # noqa: E402
from rollart_trainer.grpo import GrpoSettings, Sample, TorchBackend, TrainBatch, TurnTokens  # noqa: E402
from rollart_trainer.lora import BASE_HASH, DEFAULT_TARGETS, LoraSettings  # noqa: E402
from rollart_trainer.lora_backend import AdapterDisabled, LoraBackend  # noqa: E402

LORA = LoraSettings(rank=4, alpha=8.0)


def samples() -> list[Sample]:
    """Two groups of two with unequal rewards (every sample has a non-zero advantage)."""
    acts = [[11, 12, 13], [21, 22, 23], [31, 32, 33], [41, 42, 43]]
    rewards = [1.0, 0.0, 0.0, 1.0]
    return [
        Sample([5, 6, 7], [TurnTokens([], acts[i], [-6.0] * 3, [3, 3, 3])], rewards[i], f"g{i // 2}", f"s{i}")
        for i in range(4)
    ]


def settings(**kw: float) -> GrpoSettings:
    return GrpoSettings(learning_rate=5e-3, micro_batch_size=2, max_grad_norm=0.0, **kw)  # type: ignore[arg-type]


def lora_backend(model: Path, lora: LoraSettings = LORA, seed: int = 0, **kw: float) -> LoraBackend:
    b = make_backend("torch", model, settings(**kw), device="cpu", lora=lora, seed=seed)
    assert isinstance(b, LoraBackend)
    return b


def base_tensors(b: LoraBackend) -> dict[str, torch.Tensor]:
    return {
        n: t.detach().clone()
        for n, t in b.policy.model.state_dict().items()
        if "lora_" not in n and "modules_to_save" not in n
    }


def test_a_step_changes_only_the_adapter_and_the_base_stays_bit_identical(tiny_model: Path) -> None:
    b = lora_backend(tiny_model, weight_decay=0.1)
    before = base_tensors(b)
    adapter0 = {n: t.clone() for n, t in b.adapter_tensors().items()}
    # Only adapter parameters are trained, and only they are in the optimizer.
    trained = [n for n, p in b.policy.model.named_parameters() if p.requires_grad]
    assert trained and all(".lora_A." in n or ".lora_B." in n for n in trained)
    assert len(b.parameters) == len(trained) == 2 * 2 * len(DEFAULT_TARGETS)  # 2 layers x A, B x 7 targets
    st = b.train_step(TrainBatch(samples(), "b1", policy_version=0))
    assert st.optimizer_steps == 1
    after = base_tensors(b)
    assert before.keys() == after.keys()
    for n in before:
        assert torch.equal(before[n], after[n]), n  # bit-identical, weight decay included
    moved = [n for n, t in b.adapter_tensors().items() if not torch.equal(t, adapter0[n])]
    assert any(".lora_B." in n for n in moved)


def test_version_0_policy_is_the_base(tiny_model: Path) -> None:
    b = lora_backend(tiny_model)
    assert all(not t.any() for n, t in b.adapter_tensors().items() if ".lora_B." in n)
    assert any(t.any() for n, t in b.adapter_tensors().items() if ".lora_A." in n)
    full = TorchBackend.from_pretrained(tiny_model, settings(), device="cpu")
    x = samples()
    for got, want in zip(b.action_logprobs(x), full.action_logprobs(x), strict=True):
        np.testing.assert_array_equal(got, want)


def test_kl_reference_is_the_base_without_a_second_copy(tiny_model: Path) -> None:
    b = lora_backend(tiny_model, kl_coef=0.5)
    assert isinstance(b.reference, AdapterDisabled)
    assert not list(b.reference.parameters())  # no model copy behind the reference
    n_params = sum(p.numel() for p in b.policy.model.parameters())
    full = TorchBackend.from_pretrained(tiny_model, settings(), device="cpu")
    for _ in range(2):
        b.train_step(TrainBatch(samples(), "b", policy_version=0))
    x = samples()
    trained = b.action_logprobs(x)
    base = full.action_logprobs(x)
    assert any(not np.array_equal(t, r) for t, r in zip(trained, base, strict=True))  # the adapter moved
    from rollart_trainer.batches import flatten_sample, plan_micro_batches

    s = b.settings
    streams = [flatten_sample(y, s.max_seq_len) for y in x]
    zeros = np.zeros(len(streams), dtype=np.float32)
    for mb in plan_micro_batches(streams, zeros, list(range(4)), 4, s.row_tokens, s.pad_token_id):
        with torch.no_grad():
            ref, _ = b.reference(mb.input_ids, mb.position_ids, mb.pred_rows, mb.pred_cols, mb.targets, 1.0, False)
        want = np.concatenate(base)
        np.testing.assert_allclose(ref.numpy(), want, rtol=0, atol=1e-6)
    assert sum(p.numel() for p in b.policy.model.parameters()) == n_params  # nothing loaded meanwhile


def test_full_weight_jobs_keep_their_reference_copy(tiny_model: Path) -> None:
    full = TorchBackend.from_pretrained(tiny_model, settings(kl_coef=0.5), device="cpu")
    assert full.reference is not None and not isinstance(full.reference, AdapterDisabled)
    assert len(list(full.reference.parameters())) == len(list(full.policy.model.parameters()))


def test_published_version_is_peft_names_plus_the_base_hash(tiny_model: Path, tmp_path: Path) -> None:
    from peft import get_peft_model_state_dict

    b = lora_backend(tiny_model)
    ws = b.weight_set(0)
    names = set(get_peft_model_state_dict(b.peft))
    assert set(ws.arrays) == names | {BASE_HASH}
    assert all(n.startswith("base_model.model.model.layers.") for n in names)
    assert all(ws.dtypes[n] == "F32" and ws.arrays[n].dtype == np.float32 for n in names)
    assert ws.dtypes[BASE_HASH] == "U8" and ws.arrays[BASE_HASH].shape == (32,)
    # The base hash is h(v0) of the base: what a full-weight job publishes first, and the launcher's digest.
    full = TorchBackend.from_pretrained(tiny_model, settings(), device="cpu").weight_set(0)
    h0 = weights_digest(full.arrays, full.dtypes)
    assert ws.arrays[BASE_HASH].tobytes() == h0 == model_dir_digest(tiny_model)
    # A version round-trips through the weight plane's file format.
    save_safetensors(tmp_path / "v0.safetensors", ws)
    back = load_safetensors(tmp_path / "v0.safetensors")
    assert back.dtypes == ws.dtypes and all(np.array_equal(back.arrays[n], ws.arrays[n]) for n in ws.arrays)
    # Same seed, same initial adapter (a restart before the first checkpoint republishes the same v0).
    again = lora_backend(tiny_model).weight_set(0)
    assert weights_digest(again.arrays, again.dtypes) == weights_digest(ws.arrays, ws.dtypes)
    other = lora_backend(tiny_model, seed=1).weight_set(0)
    assert weights_digest(other.arrays, other.dtypes) != weights_digest(ws.arrays, ws.dtypes)


def test_adapter_delta_is_a_small_fraction_of_the_model(tiny_model: Path) -> None:
    b = lora_backend(tiny_model)
    ws: WeightSet = b.weight_set(0)
    full = TorchBackend.from_pretrained(tiny_model, settings(), device="cpu").weight_set(0)
    assert ws.nbytes < full.nbytes / 4


def test_trainable_modules_are_trained_in_full_and_published(tiny_model: Path) -> None:
    b = lora_backend(
        tiny_model, LoraSettings(rank=2, alpha=4.0, target_modules=("q_proj",), trainable_modules=("lm_head",))
    )
    names = set(b.weight_set(1).arrays)
    assert "base_model.model.lm_head.weight" in names
    original = b.policy.model.lm_head.original_module.weight.detach().clone()
    b.train_step(TrainBatch(samples(), "b", policy_version=0))
    assert torch.equal(b.policy.model.lm_head.original_module.weight, original)  # the base's copy stays
    assert not torch.equal(b.adapter_tensors()["base_model.model.lm_head.weight"], original)


def test_checkpoint_holds_adapter_and_optimizer_and_restores_onto_the_base(tiny_model: Path, tmp_path: Path) -> None:
    b = lora_backend(tiny_model, LoraSettings(rank=4, alpha=8.0, dropout=0.1))
    assert len(b._dropouts) == 2 * len(DEFAULT_TARGETS)  # dropout acts in training steps only
    b.train_step(TrainBatch(samples(), "b1", policy_version=0))
    assert not any(m.training for m in b._dropouts)
    mgr = CheckpointManager(tmp_path / "ckpt")
    rec = mgr.save(b, TrainerState(job_id="j", step=1, policy_version=1, last_batch_id="b1"))
    saved = load_safetensors(rec.path / "model.safetensors")
    assert set(saved.arrays) == set(b.adapter_tensors()) | {BASE_HASH}  # no base tensor in the checkpoint
    assert (rec.path / "model.safetensors").stat().st_size < 200_000
    want = b.weight_set(1)

    fresh = lora_backend(tiny_model, LoraSettings(rank=4, alpha=8.0, dropout=0.1), seed=7)
    restored = mgr.restore_latest(fresh)
    assert restored is not None and restored[0].step == 1
    got = fresh.weight_set(1)
    assert weights_digest(got.arrays, got.dtypes) == weights_digest(want.arrays, want.dtypes)
    assert fresh.optimizer_steps == 1
    # The optimizer resumes where it was: the next step of both is the same (same dropout masks: same RNG).
    rng = torch.get_rng_state()
    b.train_step(TrainBatch(samples(), "b2", policy_version=1))
    torch.set_rng_state(rng)
    fresh.train_step(TrainBatch(samples(), "b2", policy_version=1))
    for n, t in b.adapter_tensors().items():
        assert torch.equal(t, fresh.adapter_tensors()[n]), n


def test_restoring_onto_another_base_or_adapter_is_refused(
    tiny_model: Path, tiny_tied_model: Path, tmp_path: Path
) -> None:
    b = lora_backend(tiny_model)
    state = b.model_state()
    other = lora_backend(tiny_tied_model)
    with pytest.raises(ValueError, match="trained on base"):
        other.load_model_state(state)
    smaller = lora_backend(tiny_model, LoraSettings(rank=4, alpha=8.0, target_modules=("q_proj",)))
    with pytest.raises(ValueError, match="not this job's adapter"):
        smaller.load_model_state(state)
    wrong = dict(state)
    name = next(n for n in wrong if ".lora_A." in n)
    wrong[name] = torch.zeros(3, 3)
    with pytest.raises(ValueError, match="shape"):
        b.load_model_state(wrong)


def test_lora_on_megatron_is_refused_naming_spec_lora(tiny_model: Path) -> None:
    with pytest.raises(ValueError, match="spec.lora: .*megatron-core ships no LoRA"):
        make_backend("megatron", tiny_model, settings(), device="cpu", lora=LORA)


@pytest.fixture
def world_of_one(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """torch.distributed as init_distributed makes it outside torchrun (one gloo rank), undone afterwards."""
    import torch.distributed as dist

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    env = {"RANK": "0", "WORLD_SIZE": "1", "LOCAL_RANK": "0", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)}
    for k, val in env.items():
        monkeypatch.setenv(k, val)
    ours = not dist.is_initialized()
    yield
    if ours and dist.is_initialized():
        dist.destroy_process_group()


def test_fsdp2_lora_in_a_world_of_one_is_the_torch_lora_backend(world_of_one: None, tiny_model: Path) -> None:
    """The two-rank comparison is tests/unit/trainer/test_fsdp.py (opt-in); this is the cheap one-rank check."""
    from torch.distributed.tensor import DTensor

    from rollart_trainer.fsdp_lora import FSDP2LoraBackend

    f = make_backend("fsdp2", tiny_model, settings(kl_coef=0.5), device="cpu", lora=LORA, mixed_precision=False)
    assert isinstance(f, FSDP2LoraBackend) and f.is_writer and f.world == 1
    assert isinstance(f.reference, AdapterDisabled) and not list(f.reference.parameters())
    trained = [n for n, p in f.policy.model.named_parameters() if p.requires_grad]
    assert all(".lora_A." in n or ".lora_B." in n for n in trained)
    assert len(f.parameters) == len(trained) == 2 * 2 * len(DEFAULT_TARGETS)
    assert all(isinstance(p, DTensor) for p in f.policy.model.parameters())  # base and adapter sharded
    b = lora_backend(tiny_model, kl_coef=0.5)
    assert f.export()[BASE_HASH].tobytes() == b.base_hash == model_dir_digest(tiny_model)
    for _ in range(2):
        got, want = f.train_step(TrainBatch(samples(), "b", 0)), b.train_step(TrainBatch(samples(), "b", 0))
        assert got.loss == pytest.approx(want.loss, rel=1e-6)
    ws, ref = f.weight_set(2), b.weight_set(2)
    assert ws.dtypes == ref.dtypes
    for n in ref.arrays:
        np.testing.assert_allclose(ws.arrays[n], ref.arrays[n], rtol=0, atol=1e-7, err_msg=n)
    # model_state is the adapter alone; loading scatters it into the shards (and refuses another base's).
    state = b.model_state()
    assert set(f.model_state()) == set(state)
    b.train_step(TrainBatch(samples(), "b", 0))
    f.load_model_state(b.model_state())
    assert all(np.array_equal(f.export()[n], b.export()[n]) for n in ref.arrays)
    with pytest.raises(ValueError, match="trained on base"):
        f.load_model_state({**state, BASE_HASH: torch.zeros(32, dtype=torch.uint8)})
