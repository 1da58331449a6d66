"""LoRA on the weight plane (issue 29): wire bytes per version of adapter deltas against full-weight deltas of the
same model and the same kind of training step, and the actor's pause to switch adapter versions against a full-weight
update of the same base.

    python -m bench lora --json bench/results/lora-tiny.json            # both parts
    python -m bench lora --no-pause                                     # bytes only (no engine)

*Bytes* (``bytes-*`` rows): a Qwen3-shaped model (transformers, random init) takes ``--steps`` GRPO-like steps
(policy gradient with group-normalised rewards on seeded random rollouts, AdamW) twice from the same start: in full
(fp32 master weights, each version exported in bf16, as the trainer publishes) and as a LoRA adapter on the frozen
base (rank ``--rank``, alpha 2x rank, lora_B = 0 at start, on the 7 projections; each version the fp32 adapter +
``rollart.base_hash``, as a LoRA job publishes). Each version is coded as the publisher codes it
(``DeltaEncoder``, the current format) against the previous version; ``bytes_ratio`` = adapter bytes per version /
full-weight bytes per version (mean over the steps). Learning rates: ``--full-lr`` and ``--lora-lr`` (each mode's
usual range; the FrozenLake examples use 5e-4 for both).

*Pause* (``pause-*`` row): two real ``rollart-actor`` processes on the tiny test model, one full-weight, one in LoRA
mode, each with ``--streams`` requests generating; each commits ``--updates`` versions (full: a delta touching every
projection of every layer; LoRA: an adapter delta) and ``bench/_support/actor_pause.PauseProbe`` times them.
``server_ms`` is the actor's ``pause_window`` (full: engine paused -> resumed; LoRA: admissions closed while the
adapter registers, generation never paused) and ``gap_ms`` the longest silence the streams saw around it
(``pause_ratio`` and ``gap_ratio``: LoRA / full, medians).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "libs"))
sys.path.insert(0, str(ROOT / "services" / "actor"))
sys.path.insert(0, str(ROOT))

from rollart.delta import DeltaEncoder, WeightSet  # noqa: E402
from rollart.delta.identity import weights_digest  # noqa: E402

JOB, KEY = "actor-test", b"actor-test-job-key-0123456789abcdef"
TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
BASE_HASH = "rollart.base_hash"
#: name -> (hidden, layers, heads, kv heads, intermediate, vocab, tied)
SHAPES = {
    "frozenlake": (128, 2, 2, 1, 384, 512, False),  # the FrozenLake examples' warm-started model
    "tiny": (256, 4, 4, 2, 768, 1024, False),  # rollart-devtools tiny-model's default
    "qwen3-0.6b-4l": (1024, 4, 16, 8, 3072, 151936, True),  # Qwen3-0.6B's shapes, 4 of its 28 layers
}


# ------------------------------------------------------------------------------------------------- bytes


def _model(shape: str, seed: int) -> Any:
    import torch
    from transformers import Qwen3Config, Qwen3ForCausalLM

    hidden, layers, heads, kv, inter, vocab, tied = SHAPES[shape]
    torch.manual_seed(seed)
    cfg = Qwen3Config(
        hidden_size=hidden,
        intermediate_size=inter,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=kv,
        head_dim=hidden // heads,
        vocab_size=vocab,
        tie_word_embeddings=tied,
        max_position_embeddings=1024,
    )
    model = Qwen3ForCausalLM(cfg)
    with torch.no_grad():  # start from bf16 values, as a checkpoint would hold them
        for p in model.parameters():
            p.copy_(p.to(torch.bfloat16).float())
    return model


def _batches(steps: int, vocab: int, seed: int, groups: int = 4, group: int = 4, prompt: int = 24, action: int = 16):
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(steps):
        ids = rng.integers(10, vocab, (groups * group, prompt + action))
        rewards = rng.integers(0, 2, (groups, group)).astype(np.float32)
        adv = (rewards - rewards.mean(1, keepdims=True)) / (rewards.std(1, keepdims=True) + 1e-6)
        out.append((ids, adv.reshape(-1), prompt))
    return out


def _pg_loss(model: Any, batch: Any) -> Any:
    import torch

    ids, adv, prompt = batch
    x = torch.as_tensor(ids)
    logits = model(x).logits[:, prompt - 1 : -1].float()
    lp = torch.log_softmax(logits, -1).gather(-1, x[:, prompt:, None]).squeeze(-1)
    return -(torch.as_tensor(adv)[:, None] * lp).mean()


def _bf16(model: Any) -> WeightSet:
    import torch

    arrays = {
        n: p.detach().to(torch.bfloat16).contiguous().view(torch.uint16).numpy().copy()
        for n, p in model.state_dict().items()
        if not n.endswith("lm_head.weight") or not model.config.tie_word_embeddings
    }
    return WeightSet(arrays, dict.fromkeys(arrays, "BF16"))


class _Lora:
    """The adapter on every target projection (y = W x + alpha/r * B A x), peft's names and init."""

    def __init__(self, model: Any, rank: int, alpha: float) -> None:
        import torch

        self.params: dict[str, Any] = {}
        scale = alpha / rank
        for name, mod in list(model.named_modules()):
            if name.rpartition(".")[2] not in TARGETS:
                continue
            a = torch.nn.Parameter(torch.empty(rank, mod.in_features))
            torch.nn.init.kaiming_uniform_(a, a=5**0.5)
            b = torch.nn.Parameter(torch.zeros(mod.out_features, rank))
            self.params[f"base_model.model.{name}.lora_A.weight"] = a
            self.params[f"base_model.model.{name}.lora_B.weight"] = b
            mod.forward = self._forward(mod, a, b, scale)

    @staticmethod
    def _forward(mod: Any, a: Any, b: Any, scale: float) -> Any:
        import torch.nn.functional as F

        def fwd(x: Any) -> Any:
            return F.linear(x, mod.weight, mod.bias) + scale * F.linear(F.linear(x, a), b)

        return fwd

    def weights(self, base_hash: bytes) -> WeightSet:
        arrays = {n: p.detach().numpy().astype(np.float32, copy=True) for n, p in self.params.items()}
        arrays[BASE_HASH] = np.frombuffer(base_hash, np.uint8).copy()
        return WeightSet(arrays, {n: ("U8" if n == BASE_HASH else "F32") for n in arrays})


def _wire_bytes(prev: WeightSet, cur: WeightSet, version: int) -> int:
    enc = DeltaEncoder(prev, cur, job=JOB, version=version, key=KEY)
    return sum(len(s) for s in enc.segments())


def _versions(mode: str, shape: str, steps: int, lr: float, rank: int, seed: int) -> tuple[list[int], int, int]:
    """Wire bytes of each version's delta, the bytes of a whole version, and the trained parameter count."""
    import torch

    torch.set_num_threads(max(1, os.cpu_count() or 1))
    model = _model(shape, seed)
    base = _bf16(model)
    base_hash = weights_digest(base.arrays, base.dtypes)
    if mode == "full":
        params = list(model.parameters())
        export = lambda: _bf16(model)  # noqa: E731
    else:
        for p in model.parameters():
            p.requires_grad_(False)
        lora = _Lora(model, rank, 2.0 * rank)
        params = list(lora.params.values())
        export = lambda: lora.weights(base_hash)  # noqa: E731
    opt = torch.optim.AdamW(params, lr=lr, betas=(0.9, 0.999), weight_decay=0.0)
    prev = export()
    prev.applied_hash = weights_digest(prev.arrays, prev.dtypes)
    sizes = []
    for v, batch in enumerate(_batches(steps, SHAPES[shape][5], seed + 1), start=1):
        opt.zero_grad()
        _pg_loss(model, batch).backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        cur = export()
        sizes.append(_wire_bytes(prev, cur, v))
        prev = cur
        prev.applied_hash = None
        prev.applied_hash = weights_digest(prev.arrays, prev.dtypes)
    whole = int(sum(a.nbytes for a in prev.arrays.values()))
    return sizes, whole, int(sum(p.numel() for p in params))


def bytes_row(shape: str, steps: int, full_lr: float, lora_lr: float, rank: int, seed: int) -> dict[str, Any]:
    t0 = time.perf_counter()
    full, full_whole, full_params = _versions("full", shape, steps, full_lr, rank, seed)
    lora, lora_whole, lora_params = _versions("lora", shape, steps, lora_lr, rank, seed)
    fm, lm = statistics.mean(full), statistics.mean(lora)
    return {
        "config": f"bytes-{shape}-r{rank}-full{full_lr:g}-lora{lora_lr:g}",
        "shape": shape,
        "rank": rank,
        "steps": steps,
        "full_lr": full_lr,
        "lora_lr": lora_lr,
        "full_params": full_params,
        "adapter_params": lora_params,
        "full_version_bytes": full_whole,
        "adapter_version_bytes": lora_whole,
        "full_delta_bytes": round(fm),
        "adapter_delta_bytes": round(lm),
        "full_delta_bytes_each": full,
        "adapter_delta_bytes_each": lora,
        "bytes_ratio": round(lm / fm, 5),
        "target_bytes_ratio": 1 / 20,
        "seconds": round(time.perf_counter() - t0, 1),
    }


# ------------------------------------------------------------------------------------------------- pause


def _start(model: Path, work: Path, cache: Path, **extra: str) -> tuple[Any, str]:
    from bench._support.actor_pause import actor_env
    from rollart.local.processes import ManagedProcess

    work.mkdir(parents=True, exist_ok=True)
    env = actor_env(model, work, cache)
    env.update(extra)
    proc = ManagedProcess(
        "actor",
        [str(Path(sys.executable).parent / "rollart-actor")],
        log_path=work / "actor.log",
        env=env,
        ready_file=work / "actor.ready",
    ).start()
    try:
        info = proc.wait_ready(900)
    except BaseException:
        proc.stop()
        raise
    return proc, info["address"]


async def _updates(address: str, versions: list[WeightSet], streams: int) -> list[dict[str, float]]:
    import grpc.aio

    from bench._support.actor_pause import TOKEN, PauseProbe, aiter_of, commit_delta, segment_messages
    from rollart.runtime.auth import bearer
    from rollart.v1 import actor_pb2_grpc

    ch = grpc.aio.insecure_channel(address, options=[("grpc.max_send_message_length", 64 << 20)])
    stub = actor_pb2_grpc.ActorStub(ch)
    md = [bearer(TOKEN)]
    probe = PauseProbe(stub, md, streams, max_tokens=400)
    await probe.start()
    out = []
    try:
        for v in range(1, len(versions)):
            raws = list(DeltaEncoder(versions[v - 1], versions[v], job=JOB, version=v, key=KEY).segments())
            msgs, h = segment_messages(raws, KEY, JOB)
            versions[v].applied_hash = h
            await stub.StageDelta(aiter_of(msgs), metadata=md, timeout=300)
            out.append(await probe.measure(commit_delta(stub, md, v, h, f"bench-lora-{v}-{time.time_ns()}")))
    finally:
        await probe.stop()
        await ch.close()
    return out


def pause_row(updates: int, streams: int, rank: int) -> dict[str, Any]:
    from rollart.delta import load_safetensors, save_safetensors
    from rollart_devtools.tiny_model import build_tiny_model
    from tests.unit.actor.actor_testlib import perturb

    tmp = Path(tempfile.mkdtemp(prefix="bench-lora-"))
    cache = Path.home() / ".cache" / "rollart" / "vllm"
    model = tmp / "tiny"
    build_tiny_model(model, seed=0, pretrain_steps=0)
    base = load_safetensors(model / "model.safetensors")
    base.applied_hash = weights_digest(base.arrays, base.dtypes)
    # Full weights: every projection of every layer changes (what a full-weight step does).
    projections = sorted(n for n in base.arrays if n.endswith("_proj.weight"))
    full = [base]
    for v in range(1, updates + 1):
        full.append(perturb(full[-1], projections, seed=v, scale=0.01))
    # LoRA: version 0 as the trainer makes it (lora_B = 0), then every A and B changes.
    rng = np.random.default_rng(0)
    a0: dict[str, np.ndarray] = {}
    for n in projections:
        rows, cols = base.arrays[n].shape
        p = "base_model.model." + n[: -len(".weight")]
        a0[f"{p}.lora_A.weight"] = (rng.standard_normal((rank, cols)) * 0.05).astype(np.float32)
        a0[f"{p}.lora_B.weight"] = np.zeros((rows, rank), np.float32)
    a0[BASE_HASH] = np.frombuffer(base.applied_hash, np.uint8).copy()
    adapter = [WeightSet(a0, {n: ("U8" if n == BASE_HASH else "F32") for n in a0}, version=0)]
    adapter[0].applied_hash = weights_digest(adapter[0].arrays, adapter[0].dtypes)
    save_safetensors(tmp / "adapter-v0.safetensors", adapter[0])
    for _ in range(updates):
        nxt = adapter[-1].copy()
        for n, arr in nxt.arrays.items():
            if n != BASE_HASH:
                nxt.arrays[n] = arr + (rng.standard_normal(arr.shape) * 0.01).astype(np.float32)
        adapter.append(nxt)
    results: dict[str, list[dict[str, float]]] = {}
    for mode, versions, extra in (
        ("full", full, {"ROLLART_WEIGHT_HASH": base.applied_hash.hex()}),
        (
            "lora",
            adapter,
            {
                "ROLLART_WEIGHT_HASH": adapter[0].applied_hash.hex(),
                "ROLLART_LORA__RANK": str(rank),
                "ROLLART_LORA__ALPHA": str(2 * rank),
                "ROLLART_LORA__ADAPTER": str(tmp / "adapter-v0.safetensors"),
            },
        ),
    ):
        proc, address = _start(model, tmp / mode, cache, **extra)
        try:
            results[mode] = asyncio.run(_updates(address, versions, streams))
        finally:
            proc.stop()
    med = {
        m: {k: statistics.median(r[k] for r in rows) for k in ("server_ms", "gap_ms", "rpc_ms")}
        for m, rows in results.items()
    }
    return {
        "config": f"pause-tiny-r{rank}-{streams}streams",
        "updates": updates,
        "streams": streams,
        "full_server_ms": round(med["full"]["server_ms"], 2),
        "lora_server_ms": round(med["lora"]["server_ms"], 2),
        "pause_ratio": round(med["lora"]["server_ms"] / med["full"]["server_ms"], 4),
        "full_gap_ms": round(med["full"]["gap_ms"], 2),
        "lora_gap_ms": round(med["lora"]["gap_ms"], 2),
        "gap_ratio": round(med["lora"]["gap_ms"] / med["full"]["gap_ms"], 4),
        "full_rpc_ms": round(med["full"]["rpc_ms"], 2),
        "lora_rpc_ms": round(med["lora"]["rpc_ms"], 2),
        "target_pause_ratio": 1 / 5,
        "each": results,
    }


# -------------------------------------------------------------------------------------------------- main


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench lora", description=__doc__.split("\n\n")[0])
    ap.add_argument("--shapes", default="frozenlake,tiny,qwen3-0.6b-4l", help=f"of {', '.join(SHAPES)}")
    ap.add_argument("--steps", type=int, default=4, help="training steps (versions) per mode")
    ap.add_argument("--rank", type=int, default=8)
    ap.add_argument("--full-lr", type=float, default=5e-4)
    ap.add_argument("--lora-lr", type=float, default=5e-4)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--no-pause", action="store_true", help="skip the actor part (no engine started)")
    ap.add_argument("--updates", type=int, default=5, help="versions each actor commits")
    ap.add_argument("--streams", type=int, default=8, help="requests generating on each actor")
    ap.add_argument("--json", type=Path, help="write the rows (one object each) to this file")
    a = ap.parse_args(argv)
    rows = []
    for shape in a.shapes.split(","):
        row = bytes_row(shape.strip(), a.steps, a.full_lr, a.lora_lr, a.rank, a.seed)
        rows.append(row)
        print(
            f"{row['config']:<48} full {row['full_delta_bytes'] / 1e6:9.3f} MB/version  adapter "
            f"{row['adapter_delta_bytes'] / 1e6:8.3f} MB/version  bytes_ratio {row['bytes_ratio']:.4f} "
            f"(target <= {1 / 20:.3f}; {row['seconds']} s)",
            flush=True,
        )
    if not a.no_pause:
        row = pause_row(a.updates, a.streams, a.rank)
        rows.append(row)
        print(
            f"{row['config']:<48} pause full {row['full_server_ms']:8.1f} ms  lora {row['lora_server_ms']:8.1f} ms  "
            f"pause_ratio {row['pause_ratio']:.4f} (target <= 0.2); streams' gap full {row['full_gap_ms']:.1f} ms "
            f"lora {row['lora_gap_ms']:.1f} ms (gap_ratio {row['gap_ratio']:.4f})",
            flush=True,
        )
    if a.json:
        a.json.parent.mkdir(parents=True, exist_ok=True)
        a.json.write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
