"""Real GRPO deltas for bench weights-scale: the trainer's TorchBackend takes GRPO steps at RL-like learning
rates on a randomly initialised model with Qwen3-0.6B's layer shapes; each step's bf16 export is compared with
the previous one (changed-entry fraction) and coded with delta v2 and XOR + zstd-1 (bench_codec).

    python -m bench grpo-deltas --layers 4 --lrs 1e-6,1e-5 --steps 2 --json out.json

``--layers``: the 0.6B model has 28; fp32 master weights + AdamW state + gradients cost ~16 bytes per
parameter, so on a shared 24 GiB machine this runs fewer layers of the same shapes (the full vocabulary and
tied embedding kept). The changed fraction is a per-tensor property of the shapes, the learning rate and
AdamW, not of the depth. A bench may import services (the rule "no service imports another" is for
services).
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "libs"))
sys.path.insert(0, str(ROOT / "services" / "trainer"))
sys.path.insert(0, str(ROOT))

from bench.weights import codec as bench_codec  # noqa: E402
from rollart.delta import WeightSet, save_safetensors  # noqa: E402


def build_model(out: Path, layers: int, seed: int = 0) -> None:
    import torch
    from transformers import Qwen3Config, Qwen3ForCausalLM

    torch.manual_seed(seed)
    cfg = Qwen3Config(
        hidden_size=1024, intermediate_size=3072, num_hidden_layers=layers, num_attention_heads=16,
        num_key_value_heads=8, head_dim=128, vocab_size=151936, tie_word_embeddings=True,
        max_position_embeddings=4096, rope_theta=1000000.0, rms_norm_eps=1e-6,
    )
    model = Qwen3ForCausalLM(cfg).to(torch.bfloat16)
    model.save_pretrained(out, safe_serialization=True)
    del model
    gc.collect()


def batch(rng: np.random.Generator, groups: int, group_size: int, prompt: int, action: int, vocab: int):  # type: ignore[no-untyped-def]
    from rollart_trainer.grpo import Sample, TrainBatch, TurnTokens

    samples = []
    for g in range(groups):
        p = rng.integers(10, vocab, prompt).tolist()
        rewards = rng.permutation([1.0] * (group_size // 2) + [0.0] * (group_size - group_size // 2))
        for i in range(group_size):
            a = rng.integers(10, vocab, action).tolist()
            turn = TurnTokens([], a, [-float(np.log(vocab))] * action)
            samples.append(Sample(p, [turn], float(rewards[i]), f"g{g}", f"g{g}-{i}"))
    return TrainBatch(samples)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--lrs", default="1e-6,1e-5")
    ap.add_argument("--steps", type=int, default=2)
    ap.add_argument("--groups", type=int, default=2)
    ap.add_argument("--group-size", type=int, default=4)
    ap.add_argument("--tokens", type=int, default=32, help="prompt and action tokens per sample")
    ap.add_argument("--json", type=Path)
    ap.add_argument("--save", type=Path, help="also write each lr's bf16 checkpoints (lr<lr>-step<k>.safetensors) "
                    "here, for bench_codec --real with repeats")
    a = ap.parse_args(argv)
    from rollart_trainer.grpo import GrpoSettings, TorchBackend

    result: dict = {"args": vars(a) | {"json": str(a.json)}, "loadavg_start": os.getloadavg(), "rows": []}
    with tempfile.TemporaryDirectory(prefix="grpo-deltas-") as d:
        model_dir = Path(d) / "model"
        build_model(model_dir, a.layers)
        for lr in [float(x) for x in a.lrs.split(",")]:
            backend = TorchBackend.from_pretrained(model_dir, GrpoSettings(learning_rate=lr))
            rng = np.random.default_rng(0)
            prev = backend.weight_set(0)
            if a.save:
                a.save.mkdir(parents=True, exist_ok=True)
                save_safetensors(a.save / f"lr{lr:g}-step0.safetensors", prev)
            for step in range(1, a.steps + 1):
                t0 = time.process_time()
                stats = backend.train_step(batch(rng, a.groups, a.group_size, a.tokens, a.tokens, 151936))
                train_cpu = time.process_time() - t0
                cur = backend.weight_set(step)
                if a.save:
                    save_safetensors(a.save / f"lr{lr:g}-step{step}.safetensors", cur)
                base = WeightSet(prev.arrays, prev.dtypes, 0, bench_codec.BASE_HASH)
                rows = bench_codec.run_case(f"lr {lr:g} step {step}", None, base, cur, repeat=1)
                entries = sum(a_.size for a_ in cur.arrays.values())
                row = {"lr": lr, "step": step, "train_cpu_s": train_cpu, "params": entries,
                       "grad_norm": float(getattr(stats, "grad_norm", float("nan"))),
                       "changed_fraction": rows[0]["entries"] / entries,
                       "codec": {r["method"]: {k: r[k] for k in ("bytes", "bytes_per_entry", "encode_cpu_s",
                                                                  "decode_cpu_s", "vs_dense")}
                                 for r in rows if r["method"] in ("delta v2", bench_codec.XOR, "dense")}}
                v2, xz = row["codec"]["delta v2"], row["codec"][bench_codec.XOR]
                print(f"lr {lr:g} step {step}: changed {row['changed_fraction']:.2%}; v2 {v2['bytes'] / 1e6:.2f} MB "
                      f"({v2['bytes_per_entry']:.2f} B/entry, enc {v2['encode_cpu_s']:.2f} s CPU) vs XOR+zstd-1 "
                      f"{xz['bytes'] / 1e6:.2f} MB ({xz['bytes_per_entry']:.2f} B/entry, enc {xz['encode_cpu_s']:.2f} s): "
                      f"v2/XOR {v2['bytes'] / xz['bytes']:.2f}, enc speed {xz['encode_cpu_s'] / v2['encode_cpu_s']:.2f}x; "
                      f"train {train_cpu:.0f} s CPU", flush=True)
                result["rows"].append(row)
                prev = cur
            del backend, prev, cur
            gc.collect()
    result["loadavg_end"] = os.getloadavg()
    if a.json:
        a.json.write_text(json.dumps(result, indent=1, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
