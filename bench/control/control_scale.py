"""Control plane at scale (issue 17): the proxy with 16-1,024 concurrent trajectories, the ledger's rows, and
one envmanager with 16-1,024 environment loops; ops/s, p50/p99 latency, CPU per op; PNG curves.

    python -m bench control-scale --json PATH [--quick] [--profile DIR]

(a) Proxy: one real ``rollart-llmproxy`` process in front of simulated actors (``bench/_support/sim_actor.py``: real
    gRPC servers speaking the actor protocol with a fixed timing model, in a process of their own; a fake inside
    a benchmark of the proxy, which is allowed, because real vLLM actors do not fit on the benchmark machine beyond
    a few dozen trajectories: the real-actor figures are ``bench llmproxy``'s). For each concurrency C, C
    trajectories run turns back to back (``--think-ms`` between turns, like an environment step), first directly
    against the simulated actors, then through the proxy; "added" is the proxy's percentile minus the direct one
    at the same C. CPU per op is the proxy process's user+system CPU (from /proc) per turn and per chunk.
(b) Ledger: the rows of ``bench/control/control_scale_ledger.py`` ``rows(args)`` when that module is present (part A of
    the issue); the table says so when it is not.
(c) EnvManager: one envmanager process (``bench/_support/envmanager_harness.py``) running N concurrent loops of a cheap
    environment against a scripted proxy; per-turn overhead = envmanager CPU per turn, and turn latency.

``--profile DIR`` runs the proxy under cProfile (one profile per concurrency) and prints its top functions.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib
import json
import os
import platform
import shutil
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
from rollart.v1 import actor_pb2, actor_pb2_grpc, common_pb2  # noqa: E402
from rollart.v1 import llmproxy_pb2 as pp  # noqa: E402
from rollart.v1 import llmproxy_pb2_grpc as lg  # noqa: E402

# ------------------------------------------------------------------------------------------------ (a) proxy


async def drive(call, concurrency: int, seconds: float, think_s: float, prompt: list[int]) -> dict:
    """``concurrency`` trajectories doing turns back to back for ``seconds``; per-turn TTFT and total time."""
    ttft: list[float] = []
    total: list[float] = []
    errors: dict[str, int] = {}
    chunks = 0
    stop_at = time.monotonic() + seconds

    async def trajectory(t: int) -> None:
        nonlocal chunks
        turn = 0
        await asyncio.sleep(think_s * (t / max(concurrency, 1)))  # spread the starts
        while time.monotonic() < stop_at:
            begin = time.perf_counter()
            first = None
            try:
                async for _ in call(t, turn, prompt):
                    chunks += 1
                    if first is None:
                        first = time.perf_counter() - begin
            except aio.AioRpcError as exc:  # counted, not fatal: a failed turn is a figure of the point
                errors[exc.code().name] = errors.get(exc.code().name, 0) + 1
                turn += 1
                continue
            total.append(time.perf_counter() - begin)
            ttft.append(first if first is not None else float("nan"))
            turn += 1
            if think_s:
                await asyncio.sleep(think_s)

    begin = time.monotonic()
    await asyncio.gather(*(trajectory(t) for t in range(concurrency)))
    wall = time.monotonic() - begin
    return {"turns": len(total), "chunks": chunks, "wall_s": wall, "ttft": ttft, "total": total, "errors": errors}


async def proxy_point(args, c: int, proxy_addr: str, actors: dict[str, str], proxy_pid: int) -> dict:
    prompt = list(range(10, 10 + args.prompt_tokens))
    actor_ids = sorted(actors)
    options = [("grpc.use_local_subchannel_pool", 1)]
    direct_chs = {a: aio.insecure_channel(addr, options=options) for a, addr in actors.items()}
    direct = {a: actor_pb2_grpc.ActorStub(ch) for a, ch in direct_chs.items()}
    proxy_ch = aio.insecure_channel(proxy_addr, options=options)
    proxy = lg.LLMProxyStub(proxy_ch)
    samp = sampling(args.gen_tokens)

    def direct_call(t: int, turn: int, p: list[int]):
        stub = direct[actor_ids[t % len(actor_ids)]]
        return stub.Generate(
            actor_pb2.ActorGenerateRequest(
                request_id=f"d{c}-{t}-{turn}",
                trajectory_id=f"d{c}-{t}",
                input=common_pb2.ModelInput(token_ids=p),
                sampling=samp,
            ),
            metadata=MD,
            timeout=120,
        )

    def proxy_call(t: int, turn: int, p: list[int]):
        return proxy.Generate(
            pp.TrajectoryGenerateRequest(
                trajectory_id=f"p{c}-{t}", turn=turn, input=common_pb2.ModelInput(token_ids=p), sampling=samp
            ),
            metadata=MD,
            timeout=120,
        )

    await drive(proxy_call, min(c, 16), 0.5, 0.0, prompt)  # warm the channels and the proxy's path
    d = await drive(direct_call, c, args.seconds, args.think_ms / 1e3, prompt)
    spy = None
    if args.profile and shutil.which("py-spy", path=str(BIN)):
        # Sampling profile of the proxy process while it serves (native frames too: gRPC's core is C).
        spy = await asyncio.create_subprocess_exec(
            str(BIN / "py-spy"),
            "record",
            "--pid",
            str(proxy_pid),
            "--duration",
            str(int(args.seconds)),
            "--rate",
            "200",
            "--format",
            "raw",
            "--nonblocking",
            "-o",
            str(args.profile / f"proxy-{c}.txt"),
            stdout=asyncio.subprocess.DEVNULL,
            stderr=asyncio.subprocess.DEVNULL,
        )
    cpu0 = cpu_seconds(proxy_pid)
    p = await drive(proxy_call, c, args.seconds, args.think_ms / 1e3, prompt)
    cpu = cpu_seconds(proxy_pid) - cpu0
    if spy is not None:
        await spy.wait()
    for ch in [*direct_chs.values(), proxy_ch]:
        await ch.close()
    row = {
        "component": "llmproxy",
        "dimension": "concurrent trajectories",
        "n": c,
        "actors": len(actors),
        "ops_per_second": p["turns"] / p["wall_s"],
        "direct_ops_per_second": d["turns"] / d["wall_s"],
        "chunks_per_second": p["chunks"] / p["wall_s"],
        "p50_ms": pct(p["ttft"], 50) * 1e3,
        "p99_ms": pct(p["ttft"], 99) * 1e3,
        "direct_p50_ms": pct(d["ttft"], 50) * 1e3,
        "direct_p99_ms": pct(d["ttft"], 99) * 1e3,
        "added_p50_ms": (pct(p["ttft"], 50) - pct(d["ttft"], 50)) * 1e3,
        "added_p99_ms": (pct(p["ttft"], 99) - pct(d["ttft"], 99)) * 1e3,
        "added_turn_p50_ms": (pct(p["total"], 50) - pct(d["total"], 50)) * 1e3,
        "cpu_ms_per_op": cpu / max(p["turns"], 1) * 1e3,
        "cpu_ms_per_chunk": cpu / max(p["chunks"], 1) * 1e3,
        "proxy_cpu_util": cpu / p["wall_s"],
        "turns": p["turns"],
        "failed_turns": p["errors"],
        "direct_failed_turns": d["errors"],
    }
    return row


def proxy_rows(args, tmp: Path) -> list[dict]:
    rows = []
    for c in args.concurrency:
        n_actors = max(1, min(args.max_actors, c // args.trajectories_per_actor))
        sim, actors = start_sim(tmp, n_actors, args.ttft_ms, args.token_ms)
        try:
            listed = json.dumps([{"actor_id": a, "endpoint": addr, "pool": "sim"} for a, addr in actors.items()])
            argv = [str(BIN / "rollart-llmproxy")]
            if args.profile:
                args.profile.mkdir(parents=True, exist_ok=True)
            proc, info = start(f"llmproxy-{c}", argv, tmp, 60, ROLLART_ACTORS=listed, ROLLART_HTTP_LISTEN="none")
            try:
                time.sleep(1.0)  # the first status polls
                row = asyncio.run(proxy_point(args, c, info["address"], actors, proc.pid))
            finally:
                proc.stop(timeout=20)
        finally:
            sim.stop(timeout=10)
        row["load_avg"] = os.getloadavg()[0]
        rows.append(row)
        print(
            f"proxy C={c}: {row['ops_per_second']:.0f} turns/s, added TTFT p50 {row['added_p50_ms']:.2f} ms "
            f"p99 {row['added_p99_ms']:.2f} ms, {row['cpu_ms_per_op']:.3f} CPU ms/turn "
            f"{row['cpu_ms_per_chunk']:.3f} CPU ms/chunk, failed turns {row['failed_turns'] or 0} "
            f"(direct {row['direct_failed_turns'] or 0}) (load {row['load_avg']:.1f})",
            flush=True,
        )
        if args.profile and (args.profile / f"proxy-{c}.txt").exists():
            print(profile_summary(args.profile / f"proxy-{c}.txt"))
    return rows


def profile_summary(path: Path, top: int = 20) -> str:
    """Self and inclusive share of samples by function, from py-spy's collapsed stacks ("a;b;c N" lines)."""
    own: dict[str, int] = {}
    incl: dict[str, int] = {}
    total = 0
    for line in path.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack:
            continue
        n = int(count)
        total += n
        frames = [
            f.split(" (")[0] + " (" + f.split(" (")[-1].split(":")[0].rsplit("/", 1)[-1] for f in stack.split(";")[1:]
        ]  # the first frame is the process/thread
        if frames:
            own[frames[-1]] = own.get(frames[-1], 0) + n
        for f in set(frames):
            incl[f] = incl.get(f, 0) + n
    lines = [f"{path.name}: {total} samples; self% / inclusive% by function"]
    for f, n in sorted(own.items(), key=lambda kv: -kv[1])[:top]:
        lines.append(f"  {100 * n / max(total, 1):5.1f}% {100 * incl[f] / max(total, 1):5.1f}%  {f}")
    return "\n".join(lines)


# ------------------------------------------------------------------------------------------------ (b) ledger


def ledger_rows(args) -> tuple[list[dict], str]:
    try:
        mod = importlib.import_module("bench.control.control_scale_ledger")
    except ModuleNotFoundError:
        return [], "bench/control/control_scale_ledger.py is not present (issue 17 part A): no ledger rows"
    return list(mod.rows(args)), ""


# ------------------------------------------------------------------------------------------------ (c) envmanager


def envmanager_rows(args, tmp: Path) -> list[dict]:
    from bench.control import envmanager_scale

    return envmanager_scale.rows(args, tmp)


# ------------------------------------------------------------------------------------------------ output


COLUMNS = (
    ("component", "{}"),
    ("dimension", "{}"),
    ("n", "{}"),
    ("ops_per_second", "{:.0f}"),
    ("p50_ms", "{:.2f}"),
    ("p99_ms", "{:.2f}"),
    ("cpu_ms_per_op", "{:.3f}"),
    ("added_p50_ms", "{:.2f}"),
    ("added_p99_ms", "{:.2f}"),
    ("cpu_ms_per_chunk", "{:.3f}"),
    ("vs_first", "{:.2f}x"),
    ("load_avg", "{:.1f}"),
)


def table(rows: list[dict], notes: list[str]) -> str:
    first: dict[str, float] = {}
    for r in rows:
        key = r["component"] + "/" + r["dimension"]
        if r.get("cpu_ms_per_op") is not None:
            first.setdefault(key, r["cpu_ms_per_op"])
            r["vs_first"] = r["cpu_ms_per_op"] / first[key] if first[key] else float("nan")
    lines = [
        "| " + " | ".join(name for name, _ in COLUMNS) + " |",
        "|" + "|".join("---" if i < 2 else "---:" for i in range(len(COLUMNS))) + "|",
    ]
    for r in rows:
        cells = []
        for name, fmt in COLUMNS:
            v = r.get(name)
            cells.append("-" if v is None or (isinstance(v, float) and np.isnan(v)) else fmt.format(v))
        lines.append("| " + " | ".join(cells) + " |")
    lines += [f"\n{n}" for n in notes if n]
    lines.append("vs_first: CPU per op relative to the smallest n of the same component and dimension.")
    return "\n".join(lines)


def plot(rows: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    groups: dict[str, list[dict]] = {}
    for r in rows:
        groups.setdefault(f"{r['component']}: {r['dimension']}", []).append(r)
    fig, axes = plt.subplots(len(groups), 3, figsize=(15, 3.6 * max(len(groups), 1)), squeeze=False)
    for (name, rs), ax in zip(groups.items(), axes):
        rs = sorted(rs, key=lambda r: r["n"])
        n = [r["n"] for r in rs]
        ax[0].plot(n, [r["ops_per_second"] for r in rs], "o-")
        ax[0].set_ylabel("ops/s")
        ax[1].plot(n, [r["p50_ms"] for r in rs], "o-", label="p50")
        ax[1].plot(n, [r["p99_ms"] for r in rs], "s--", label="p99")
        if "added_p50_ms" in rs[0]:
            ax[1].plot(n, [r["added_p50_ms"] for r in rs], "^-", label="added p50")
            ax[1].plot(n, [r["added_p99_ms"] for r in rs], "v--", label="added p99")
        ax[1].set_ylabel("latency ms")
        ax[1].legend(fontsize=7)
        ax[2].plot(n, [r["cpu_ms_per_op"] for r in rs], "o-")
        ax[2].set_ylabel("CPU ms / op")
        for a in ax:
            a.set_xscale("log", base=2)
            a.set_xlabel(name)
            a.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)


def save(args, rows: list[dict]) -> None:
    """Writes the rows so far (one JSON object per line) to ``--json``."""
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text("".join(json.dumps(r) + "\n" for r in rows))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--json", type=Path, help="write the rows here (one object per row)")
    p.add_argument("--png", type=Path, default=REPO / "bench" / "results" / "control-scale-16-1024.png")
    p.add_argument("--quick", action="store_true", help="short run: fewer points, shorter measurements")
    p.add_argument("--only", choices=("proxy", "ledger", "envmanager"), action="append")
    p.add_argument("--concurrency", type=int, nargs="+", default=[16, 64, 256, 1024])
    p.add_argument("--seconds", type=float, default=8.0, help="measured seconds per proxy point and path")
    p.add_argument("--think-ms", type=float, default=100.0, help="pause between a trajectory's turns")
    p.add_argument("--gen-tokens", type=int, default=8)
    p.add_argument("--prompt-tokens", type=int, default=64)
    p.add_argument("--ttft-ms", type=float, default=10.0, help="simulated actor: time to the first chunk")
    p.add_argument("--token-ms", type=float, default=5.0, help="simulated actor: time per further token")
    p.add_argument("--trajectories-per-actor", type=int, default=64)
    p.add_argument("--max-actors", type=int, default=16)
    p.add_argument("--loops", type=int, nargs="+", default=[16, 64, 256, 1024], help="envmanager loops")
    p.add_argument("--env-turns", type=int, default=4, help="envmanager: turns per trajectory")
    p.add_argument("--env-gen-ms", type=float, default=20.0, help="envmanager: generation time per turn")
    p.add_argument("--env-min-turns", type=int, default=1024, help="envmanager: turns measured per point at least")
    p.add_argument("--env-threads", type=int, default=0, help="envmanager env_threads (0: the service default)")
    p.add_argument("--profile", type=Path, help="run the proxy (and envmanager) under cProfile, profiles here")
    args = p.parse_args(argv)
    if args.quick:
        args.seconds = min(args.seconds, 3.0)
        args.concurrency = [c for c in args.concurrency if c in (16, 256, 1024)] or args.concurrency
        args.loops = [n for n in args.loops if n in (16, 256, 1024)] or args.loops
    only = set(args.only or ("proxy", "ledger", "envmanager"))
    tmp = Path(tempfile.mkdtemp(prefix="bench-control-scale-"))
    rows: list[dict] = []
    notes: list[str] = []
    if "proxy" in only:
        rows += proxy_rows(args, tmp)
        save(args, rows)
        notes.append(
            f"llmproxy: simulated actors (bench/_support/sim_actor.py, TTFT {args.ttft_ms} ms, {args.token_ms} ms/token, "
            f"one per {args.trajectories_per_actor} trajectories, at most {args.max_actors}); {args.gen_tokens} "
            f"tokens per turn in chunks of 1, {args.think_ms} ms between turns; p50/p99 = time to first token "
            "through the proxy, added = minus direct at the same n; CPU = the proxy process's."
        )
    if "ledger" in only:
        lrows, note = ledger_rows(args)
        rows += lrows
        notes.append(note)
        save(args, rows)
    if "envmanager" in only:
        rows += envmanager_rows(args, tmp)
        notes.append(
            "envmanager: one process, N concurrent loops of a cheap environment against a scripted proxy; "
            "ops = turns, p50/p99 = gap between the end of a trajectory's generation and its next Generate call (the "
            "loop's own per-turn time, queueing for CPU included), CPU = the envmanager process's per turn."
        )
    print()
    print(
        f"machine: {platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}; "
        f"load average {os.getloadavg()[0]:.1f} at the end"
    )
    print(table(rows, notes))
    save(args, rows)
    if rows:
        args.png.parent.mkdir(parents=True, exist_ok=True)
        plot(rows, args.png)
        print(f"curves: {args.png}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
