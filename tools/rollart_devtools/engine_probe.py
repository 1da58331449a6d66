"""How the actor runs vLLM in-process, and a probe that checks every piece of it on a real engine.

`rollart-devtools engine-probe --model DIR` starts an engine on a checkpoint and checks streaming with logprobs,
abort, pause(keep)/resume with a request in flight, prefix-cache reset, an in-place partial weight update (output
equals a fresh engine on the updated checkpoint), refusal of a partial fused group, an update mid-generation and
throughput; it prints one JSON object. The engine facts this rests on are docs/platform.md ("vLLM on CPU"); rerun
the probe when vLLM changes.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import os
import shutil
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

# The actor's worker extension, by the name vLLM imports it under in its engine process (the probe checks
# the actor's in-place reload; it does not import the actor).
EXTENSION = "rollart_actor.vllm_ext.WeightUpdateExtension"


def vllm_env(
    workdir: str | os.PathLike[str],
    *,
    kv_cache_gib: int | None = 1,
    cache_root: str | os.PathLike[str] | None = None,
) -> dict[str, str]:
    """Environment for an in-process CPU engine whose files stay under workdir. Set before importing vllm.

    cache_root (default workdir/cache) holds vLLM's model-inspection cache ("modelinfos"): when it is cold,
    the first engine start in a process spends ~9 s inspecting the model class in a subprocess. Point it
    at a persistent folder (one per machine, e.g. under ~/.cache) to start in ~8 s instead of ~17 s.
    kv_cache_gib=None leaves VLLM_CPU_KVCACHE_SPACE out (then `kv_cache_memory_bytes=` in the engine args
    decides); remove it from os.environ too if it is set there.
    """
    work = Path(workdir)
    cache = Path(cache_root) if cache_root is not None else work / "cache"
    (work / "rpc").mkdir(parents=True, exist_ok=True)
    cache.mkdir(parents=True, exist_ok=True)
    env = {
        "VLLM_ENABLE_V1_MULTIPROCESSING": "0",
        "HF_HUB_OFFLINE": "1",
        "TRANSFORMERS_OFFLINE": "1",
        "VLLM_CACHE_ROOT": str(cache),
        "VLLM_RPC_BASE_PATH": str(work / "rpc"),
        "VLLM_NO_USAGE_STATS": "1",
        "VLLM_DO_NOT_TRACK": "1",
        "TMPDIR": str(work),
    }
    if kv_cache_gib is not None:
        env["VLLM_CPU_KVCACHE_SPACE"] = str(int(kv_cache_gib))
    return env


def engine_args(model: str | os.PathLike[str], **overrides: Any) -> Any:
    """AsyncEngineArgs that work for the tiny model on CPU (any HF checkpoint dir works the same way)."""
    from vllm.engine.arg_utils import AsyncEngineArgs

    kwargs: dict[str, Any] = {
        "model": str(model),
        "enforce_eager": True,  # no torch.compile: start in seconds
        "dtype": "bfloat16",
        "max_model_len": 1024,
        "max_num_seqs": 64,
        "seed": 0,
        "enable_prefix_caching": True,
        "worker_extension_cls": EXTENSION,
        "disable_log_stats": True,
    }
    kwargs.update(overrides)
    return AsyncEngineArgs(**kwargs)


async def update_weights_in_place(engine: Any, payload: bytes | str) -> dict[str, Any]:
    """The actor's safe point: pause keeping requests, reload, drop stale KV, resume. Returns timings."""
    t0 = time.perf_counter()
    await engine.pause_generation(mode="keep")
    t1 = time.perf_counter()
    try:
        [result] = await engine.collective_rpc("rollart_update_weights", args=(payload,))
        t2 = time.perf_counter()
        if not await engine.reset_prefix_cache(reset_running_requests=True):
            raise RuntimeError("prefix cache reset failed after a weight update")
    finally:
        await engine.resume_generation()
    t3 = time.perf_counter()
    return {**result, "pause_s": t1 - t0, "rpc_s": t2 - t1, "reset_resume_s": t3 - t2, "window_s": t3 - t0}


async def collect(engine: Any, prompt_ids: Sequence[int], params: Any, request_id: str) -> dict[str, Any]:
    """Run one request to the end (DELTA outputs): token ids, logprobs, chunk count, finish reason."""
    tokens: list[int] = []
    logprobs: list[float] = []
    chunks = 0
    reason = None
    async for out in engine.generate({"prompt_token_ids": list(prompt_ids)}, params, request_id=request_id):
        comp = out.outputs[0]
        chunks += 1
        tokens.extend(comp.token_ids)
        if comp.logprobs:
            logprobs.extend(lp[t].logprob for t, lp in zip(comp.token_ids, comp.logprobs, strict=True))
        if out.finished:
            reason = comp.finish_reason
    return {"tokens": tokens, "logprobs": logprobs, "chunks": chunks, "finish_reason": reason}


def perturbed_subset(weights: dict[str, Any], layer: int, seed: int, scale: float = 0.05) -> dict[str, Any]:
    """Every projection of one layer (whole fused groups), shifted by seeded noise: a realistic delta."""
    import torch

    g = torch.Generator().manual_seed(seed)
    out = {}
    for name in sorted(weights):
        if f".layers.{layer}." in name and name.endswith("_proj.weight"):
            t = weights[name]
            out[name] = (t.float() + scale * torch.randn(t.shape, generator=g)).to(t.dtype)
    return out


FUSED_GROUPS = {"qkv_proj": ("q_proj", "k_proj", "v_proj"), "gate_up_proj": ("gate_proj", "up_proj")}


def fuse_like_engine(tensors: dict[str, Any]) -> dict[str, Any]:
    """HF names -> the engine's fused names (qkv_proj, gate_up_proj) where a whole group is present."""
    import torch

    out = dict(tensors)
    for name in sorted(tensors):
        module, _, param = name.rpartition(".")
        parent, _, leaf = module.rpartition(".")
        for fused, members in FUSED_GROUPS.items():
            if leaf != members[0]:
                continue
            names = [f"{parent}.{m}.{param}" for m in members]
            if all(n in tensors for n in names):
                out[f"{parent}.{fused}.{param}"] = torch.cat([tensors[n] for n in names], dim=0)
                for n in names:
                    del out[n]
    return out


async def run_probe(
    model_dir: str,
    workdir: str,
    *,
    throughput_seqs: int = 64,
    throughput_tokens: int = 128,
    fresh_engine_check: bool = True,
) -> dict[str, Any]:
    from safetensors.torch import load_file, save, save_file
    from vllm import SamplingParams
    from vllm.sampling_params import RequestOutputKind
    from vllm.v1.engine.async_llm import AsyncLLM

    report: dict[str, Any] = {}
    delta = RequestOutputKind.DELTA
    greedy = SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True, logprobs=1, output_kind=delta)
    prompts = [[5, 6, 7, 8, 9, 10], [100, 200, 300, 400], list(range(30, 90))]

    async def greedy_all(engine: Any, tag: str) -> list[list[int]]:
        return [(await collect(engine, p, greedy, f"{tag}-{i}"))["tokens"] for i, p in enumerate(prompts)]

    # Checkpoint B = A with layer 1's projections changed (written for the fresh-engine comparison).
    base = load_file(str(Path(model_dir) / "model.safetensors"))
    update = perturbed_subset(base, layer=1, seed=123)
    updated_dir = Path(workdir) / "updated"
    shutil.copytree(model_dir, updated_dir, dirs_exist_ok=True)
    save_file({**base, **update}, str(updated_dir / "model.safetensors"), metadata={"format": "pt"})

    t = time.perf_counter()
    engine = AsyncLLM.from_engine_args(engine_args(model_dir))
    report["engine_start_s"] = time.perf_counter() - t
    try:
        out_a = await greedy_all(engine, "a")
        report["greedy_deterministic"] = out_a == await greedy_all(engine, "a-again")

        sampled = SamplingParams(temperature=1.0, max_tokens=16, logprobs=2, seed=7, output_kind=delta)
        s = await collect(engine, prompts[0], sampled, "stream")
        report["stream"] = {
            "chunks": s["chunks"],
            "tokens": len(s["tokens"]),
            "finish": s["finish_reason"],
            "logprobs_ok": len(s["logprobs"]) == 16 and all(lp <= 0 for lp in s["logprobs"]),
        }

        long = SamplingParams(temperature=0.0, max_tokens=160, ignore_eos=True, output_kind=delta)
        report["abort"] = await _check_abort(engine, prompts[1], long)
        report["pause_keep"] = await _check_pause_keep(engine, prompts[1], long)
        report["reset_prefix_cache"] = await engine.reset_prefix_cache()

        lone_q = {k: v for k, v in update.items() if "q_proj" in k}
        try:
            await engine.collective_rpc("rollart_update_weights", args=(save(lone_q),))
            report["lone_q_rejected"] = False
        except Exception as e:  # vLLM re-raises worker errors as a plain Exception carrying the message
            report["lone_q_rejected"] = "partial fused group" in str(e)
        report["unchanged_after_rejection"] = await greedy_all(engine, "a-rej") == out_a

        upd = await update_weights_in_place(engine, save(update))
        report["update"] = {k: (round(v, 4) if isinstance(v, float) else v) for k, v in upd.items()}
        out_b = await greedy_all(engine, "b")
        report["output_changed"] = out_b != out_a

        # Update in the middle of a generation: tokens before the switch follow A, the rest follow B.
        report["mid_generation"] = await _check_mid_generation(
            engine, prompts[2], base, update, workdir, out_a[2]
        )

        report["throughput"] = await _throughput(engine, throughput_seqs, throughput_tokens)
    finally:
        t = time.perf_counter()
        engine.shutdown()
        report["shutdown_s"] = time.perf_counter() - t
        # AsyncLLM.__del__ calls shutdown() again; collected at interpreter exit it raises (ignored) noise.
        del engine
        gc.collect()

    if fresh_engine_check:
        t = time.perf_counter()
        fresh = AsyncLLM.from_engine_args(engine_args(str(updated_dir)))
        report["fresh_engine_start_s"] = time.perf_counter() - t
        try:
            report["inplace_equals_fresh"] = await greedy_all(fresh, "fresh") == out_b
        finally:
            fresh.shutdown()
            del fresh
            gc.collect()
    return report


async def _check_abort(engine: Any, prompt: list[int], params: Any) -> dict[str, Any]:
    seen: list[Any] = []

    async def consume() -> None:
        async for out in engine.generate({"prompt_token_ids": prompt}, params, request_id="abort-me"):
            seen.append(out)

    task = asyncio.create_task(consume())
    while sum(len(o.outputs[0].token_ids) for o in seen) < 5:
        await asyncio.sleep(0.005)
    await engine.abort("abort-me")
    await asyncio.wait_for(task, 10)
    n = sum(len(o.outputs[0].token_ids) for o in seen)
    return {"tokens": n, "finished": seen[-1].finished, "finish_reason": seen[-1].outputs[0].finish_reason}


async def _check_pause_keep(engine: Any, prompt: list[int], params: Any) -> dict[str, Any]:
    counts: list[int] = []

    async def consume() -> None:
        async for out in engine.generate({"prompt_token_ids": prompt}, params, request_id="pause-me"):
            counts.append(len(out.outputs[0].token_ids))

    task = asyncio.create_task(consume())
    while sum(counts) < 10:
        await asyncio.sleep(0.005)
    t = time.perf_counter()
    await engine.pause_generation(mode="keep")
    pause_s = time.perf_counter() - t
    at_pause = sum(counts)
    paused = await engine.is_paused()
    await asyncio.sleep(0.5)
    during = sum(counts) - at_pause
    await engine.resume_generation()
    await asyncio.wait_for(task, 60)
    return {
        "pause_s": round(pause_s, 4),
        "is_paused": paused,
        "tokens_during_pause": during,
        "final_tokens": sum(counts),
        "expected": params.max_tokens,
    }


async def _check_mid_generation(
    engine: Any,
    prompt: list[int],
    base: dict[str, Any],
    update: dict[str, Any],
    workdir: str,
    reference_a: list[int],
) -> dict[str, Any]:
    from safetensors.torch import save, save_file
    from vllm import SamplingParams
    from vllm.sampling_params import RequestOutputKind

    delta = RequestOutputKind.DELTA
    n_total = 48
    params = SamplingParams(temperature=0.0, max_tokens=n_total, ignore_eos=True, output_kind=delta)
    # Back to A first (the engine holds B now): as a file path, in the engine's fused names.
    restore_path = Path(workdir) / "restore_fused.safetensors"
    save_file(fuse_like_engine({k: base[k] for k in update}), str(restore_path))
    restored = await update_weights_in_place(engine, str(restore_path))
    ref_a = (await collect(engine, prompt, params, "mid-ref-a"))["tokens"]

    tokens: list[int] = []

    async def consume() -> None:
        async for out in engine.generate({"prompt_token_ids": prompt}, params, request_id="mid"):
            tokens.extend(out.outputs[0].token_ids)

    task = asyncio.create_task(consume())
    while len(tokens) < 12:
        await asyncio.sleep(0.002)
    await engine.pause_generation(mode="keep")
    switch_at = len(tokens)  # pause(keep) returns after every produced token was delivered
    [res] = await engine.collective_rpc("rollart_update_weights", args=(save(update),))
    await engine.reset_prefix_cache(reset_running_requests=True)
    await engine.resume_generation()
    await asyncio.wait_for(task, 60)
    rest = n_total - switch_at
    # What B alone continues from the same prefix (prompt + tokens generated under A).
    cont_params = SamplingParams(temperature=0.0, max_tokens=rest, ignore_eos=True, output_kind=delta)
    cont_b = (await collect(engine, prompt + tokens[:switch_at], cont_params, "mid-ref-b"))["tokens"]
    return {
        "switch_at": switch_at,
        "prefix_matches_a": tokens[:switch_at] == ref_a[:switch_at],
        "suffix_matches_b": tokens[switch_at:] == cont_b,
        "suffix_differs_from_a": tokens[switch_at:] != ref_a[switch_at:],
        "reload_s": res["reload_s"],
        "restored_from_fused_file": restored["tensors"],
        "a_after_restore_matches_start": ref_a[:24] == reference_a,
    }


async def _throughput(engine: Any, n_seqs: int, n_tokens: int) -> dict[str, Any]:
    from vllm import SamplingParams
    from vllm.sampling_params import RequestOutputKind

    params = SamplingParams(
        temperature=1.0,
        max_tokens=n_tokens,
        ignore_eos=True,
        output_kind=RequestOutputKind.FINAL_ONLY,
        seed=0,
    )

    async def one(i: int) -> int:
        n = 0
        async for out in engine.generate(
            {"prompt_token_ids": [3 + i % 500] * 16}, params, request_id=f"tp-{i}"
        ):
            n = len(out.outputs[0].token_ids)
        return n

    single_t = time.perf_counter()
    single = await one(10_000)
    single_s = time.perf_counter() - single_t
    t = time.perf_counter()
    counts = await asyncio.gather(*(one(i) for i in range(n_seqs)))
    dt = time.perf_counter() - t
    return {
        "seqs": n_seqs,
        "tokens": sum(counts),
        "seconds": round(dt, 3),
        "tokens_per_s": round(sum(counts) / dt, 1),
        "single_seq_tokens_per_s": round(single / single_s, 1),
    }


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The ``rollart-devtools engine-probe`` arguments."""
    parser.add_argument(
        "--model", required=True, help="HF checkpoint directory (e.g. from `rollart-devtools tiny-model`)"
    )
    parser.add_argument(
        "--workdir", default=None, help="folder for vLLM's files (default: a temp dir, removed)"
    )
    parser.add_argument("--kv-cache-gib", type=int, default=1)
    parser.add_argument("--seqs", type=int, default=64)
    parser.add_argument("--tokens", type=int, default=128)
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    workdir = args.workdir or tempfile.mkdtemp(prefix="rollart-vllm-")
    os.environ.update(vllm_env(workdir, kv_cache_gib=args.kv_cache_gib))
    try:
        report = asyncio.run(
            run_probe(args.model, workdir, throughput_seqs=args.seqs, throughput_tokens=args.tokens)
        )
    finally:
        if args.workdir is None:
            shutil.rmtree(workdir, ignore_errors=True)
    print(json.dumps(report, indent=2, sort_keys=True, default=str))
    return 0
