"""One rank of the FSDP2 check (run by torchrun from test_fsdp.py): FSDP2 vs the single-device backend, for full
weights and for a LoRA adapter."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist
from safetensors.torch import load_file

from rollart_trainer.backends import make_backend
from rollart_trainer.checkpoint import MODEL_FILE, CheckpointManager, TrainerState
from rollart_trainer.fsdp import FSDP2Backend
from rollart_trainer.fsdp_lora import FSDP2LoraBackend
from rollart_trainer.grpo import GrpoSettings, Sample, TorchBackend, TrainBatch, TurnTokens
from rollart_trainer.lora import BASE_HASH, LoraSettings
from rollart_trainer.lora_backend import AdapterDisabled, LoraBackend


def batch(seed: int = 0) -> TrainBatch:
    rng = np.random.default_rng(seed)
    samples = []
    for g in range(3):
        prompt = rng.integers(3, 500, 6).tolist()
        for k in range(5):  # 15 samples: ranks get unequal shares and micro-batch counts
            turns = []
            for _ in range(2):
                n = int(rng.integers(1, 6))
                turns.append(
                    TurnTokens(
                        rng.integers(3, 500, int(rng.integers(0, 5))).tolist(),
                        rng.integers(3, 500, n).tolist(),
                        (-6.0 + rng.random(n)).tolist(),
                        [0] * n,
                    )
                )
            samples.append(Sample(prompt, turns, float(rng.random()), f"g{g}", f"s{g}-{k}"))
    return TrainBatch(samples, "b1", 1)


def reference_logprobs(b: LoraBackend, samples: list[Sample]) -> list[np.ndarray]:
    """The KL reference's logprobs of the samples (``action_logprobs`` run through ``b.reference``)."""
    net, b.net = b.net, b.reference  # type: ignore[assignment]
    try:
        return b.action_logprobs(samples)
    finally:
        b.net = net


def base_weights(b: FSDP2LoraBackend) -> dict[str, torch.Tensor]:
    """The frozen base's whole tensors (gathered on every rank: a collective)."""
    return {n: b._full(p.detach()).clone() for n, p in sorted(b.policy.model.named_parameters()) if not p.requires_grad}


def lora_case(model: Path, other_base: Path, out: Path, device: str) -> dict[str, object] | None:
    """Two steps of the FSDP2 LoRA backend (fp32 compute, KL term on) vs the single-device LoRA backend."""
    lora = LoraSettings(rank=4, alpha=8.0)

    def build(path: Path, seed: int = 3) -> FSDP2LoraBackend:
        s = GrpoSettings(learning_rate=1e-3, micro_batch_size=3, kl_coef=0.1)
        b = make_backend("fsdp2", path, s, device=device, lora=lora, seed=seed, mixed_precision=False)
        assert isinstance(b, FSDP2LoraBackend)
        return b

    f = build(model)
    b = f.share_batch(batch() if f.rank == 0 else None)
    base0 = base_weights(f)
    stats = [f.train_step(b) for _ in range(2)]
    exported = f.export()
    base_same = all(torch.equal(t, base0[n]) for n, t in base_weights(f).items())
    ref_lp = reference_logprobs(f, b.samples)
    mgr = CheckpointManager(out.parent / "ckpt-lora")
    mgr.save(f, TrainerState(step=2, policy_version=2))
    dist.barrier()
    next_loss = f.train_step(b).loss
    after_next = f.export()
    fresh = build(model, seed=4)
    record = mgr.latest()
    assert record is not None
    mgr.load(record, fresh)
    restored = fresh.export()
    again = fresh.train_step(b).loss
    after_again = fresh.export()
    try:
        build(other_base).load_model_state(load_file(str(record.path / MODEL_FILE)))
        refused = ""
    except ValueError as exc:
        refused = str(exc)
    if f.rank != 0:
        return None
    s = GrpoSettings(learning_rate=1e-3, micro_batch_size=3, kl_coef=0.1)
    ref = make_backend("torch", model, s, device=str(f.policy.device), lora=lora, seed=3)
    ref_stats = [ref.train_step(b) for _ in range(2)]
    ref_exp = ref.export()
    base_lp = TorchBackend.from_pretrained(model, s, device=f.policy.device).action_logprobs(b.samples)
    adapter = [n for n in ref_exp if n != BASE_HASH]
    return {
        "loss": [st.loss for st in stats],
        "ref_loss": [st.loss for st in ref_stats],
        "grad_norm": [st.grad_norm for st in stats],
        "ref_grad_norm": [st.grad_norm for st in ref_stats],
        "names_equal": sorted(exported) == sorted(ref_exp),
        "base_hash_equal": exported[BASE_HASH].tobytes() == ref_exp[BASE_HASH].tobytes(),
        "max_abs_diff": max(float(np.abs(exported[n] - ref_exp[n]).max()) for n in adapter),
        "adapter_moved": any(".lora_B." in n and bool(ref_exp[n].any()) for n in adapter),
        "base_bit_identical": base_same,
        "reference_is_adapter_disabled": isinstance(f.reference, AdapterDisabled),
        "reference_vs_base": max(float(np.abs(a - c).max(initial=0)) for a, c in zip(ref_lp, base_lp, strict=True)),
        "restored_equal": all(np.array_equal(restored[n], exported[n]) for n in exported),
        "resume_loss": [next_loss, again],
        "resume_equal": all(np.array_equal(after_next[n], after_again[n]) for n in after_next),
        "other_base_refused": refused,
    }


def main() -> None:
    model, out, device = Path(sys.argv[1]), Path(sys.argv[2]), sys.argv[3]
    settings = GrpoSettings(learning_rate=1e-3, micro_batch_size=3)
    result: dict[str, object] = {}
    for mixed in (False, True):
        f = FSDP2Backend.from_pretrained(model, GrpoSettings(**vars(settings)), device=device, mixed_precision=mixed)
        b = f.share_batch(batch() if f.rank == 0 else None)
        stats = [f.train_step(b) for _ in range(2)]
        exported = f.export()
        mgr = CheckpointManager(out.parent / f"ckpt-{int(mixed)}")
        mgr.save(f, TrainerState(step=2, policy_version=2))
        dist.barrier()
        next_loss = f.train_step(b).loss
        mgr.load(mgr.latest(), f)  # type: ignore[arg-type]
        again = f.train_step(b).loss
        if f.rank == 0:
            ref = TorchBackend.from_pretrained(model, GrpoSettings(**vars(settings)), device=f.policy.device)
            ref_stats = [ref.train_step(b) for _ in range(2)]
            ref_exp = ref.export()
            ulps = max(int(np.abs(exported[k].astype(np.int32) - ref_exp[k].astype(np.int32)).max()) for k in ref_exp)
            result[f"mixed={mixed}"] = {
                "loss": [s.loss for s in stats],
                "ref_loss": [s.loss for s in ref_stats],
                "grad_norm": [s.grad_norm for s in stats],
                "ref_grad_norm": [s.grad_norm for s in ref_stats],
                "tokens": [s.tokens_trained for s in stats],
                "ref_tokens": [s.tokens_trained for s in ref_stats],
                "names_equal": sorted(exported) == sorted(ref_exp),
                "max_ulps": ulps,
                "resume_loss": [next_loss, again],
                "world": f.world,
            }
        dist.barrier()
    if len(sys.argv) > 4:  # the LoRA case, with a second base to refuse a checkpoint of the first
        result["lora"] = lora_case(model, Path(sys.argv[4]), out, device)
        dist.barrier()
    if dist.get_rank() == 0:
        out.write_text(json.dumps(result))
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
