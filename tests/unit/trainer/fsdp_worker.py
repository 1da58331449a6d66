"""One rank of the FSDP2 check (run by torchrun from test_fsdp.py): FSDP2 vs the single-device backend."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import torch.distributed as dist

from rollart_trainer.checkpoint import CheckpointManager, TrainerState
from rollart_trainer.fsdp import FSDP2Backend
from rollart_trainer.grpo import GrpoSettings, Sample, TorchBackend, TrainBatch, TurnTokens


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
    if dist.get_rank() == 0:
        out.write_text(json.dumps(result))
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
