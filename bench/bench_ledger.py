"""Job Ledger benchmark: lease-acquire + settle throughput against its store's limit, Submit/GetBatch latency.

    .venv/bin/python -m bench.bench_ledger [--seconds 8] [--clients 1 8 32]

Starts a private redis-server (AOF, appendfsync always: what `rollart up` runs) and a real rollart-ledger
process, then for each client count runs that many concurrent clients (asyncio, one process) that each
loop AcquireLeases(1) + Submit; one "op" is one lease acquired and settled (two RPCs, two Lua scripts).
Right after, redis-benchmark measures SET/GET on the same redis-server with as many connections, so the
ratio shows how close the ledger gets to its store's limit. GetBatch latency is measured on a buffer of
complete groups (B = one group, then AckBatch). Prints a Markdown table; JSON goes to bench/out/ledger.json.
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import grpc
import redis

from rollart.local.processes import ManagedProcess, start_redis
from rollart.runtime.auth import bearer
from rollart.v1 import common_pb2
from rollart.v1 import ledger_pb2 as lp
from rollart.v1 import ledger_pb2_grpc as lg

TOKEN = "bench-token-0123456789abcdef"
MD = [bearer(TOKEN)]
G = 8
HASH0 = hashlib.sha256(b"version-0").digest()


def pct(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    s = sorted(values)
    return s[min(len(s) - 1, int(q * len(s)))]


def cpu_model() -> str:
    try:
        out = subprocess.run(["lscpu"], capture_output=True, text=True, timeout=10).stdout
        for line in out.splitlines():
            if line.startswith("Model name:"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def redis_benchmark(port: int, clients: int, sets: int, gets: int) -> dict[str, float]:
    """SET and GET requests/s on the ledger's redis-server (its db 9), as many connections as clients."""
    exe = shutil.which("redis-benchmark")
    if exe is None:
        return {}
    rates = {}
    for test, n in (("set", sets), ("get", gets)):
        out = subprocess.run(
            [exe, "-h", "127.0.0.1", "-p", str(port), "-t", test, "-n", str(n), "-c", str(clients),
             "--dbnum", "9", "--csv", "-q"],
            capture_output=True, text=True, timeout=120,
        ).stdout  # fmt: skip
        for line in out.splitlines():
            cells = [c.strip('"') for c in line.split(",")]
            if len(cells) >= 2 and cells[0] in ("SET", "GET"):
                rates[cells[0]] = float(cells[1])
    return rates


def trajectory(lease: lp.Lease, n: int) -> common_pb2.Trajectory:
    return common_pb2.Trajectory(
        trajectory_id=f"t{n}-{lease.lease_id}",
        lease_id=lease.lease_id,
        prompt_id=lease.prompt.prompt_id,
        group_id=lease.group_id,
        sample_index=lease.sample_index,
        prompt_token_ids=list(range(64)),
        turns=[common_pb2.Turn(action_token_ids=list(range(128)), action_versions=[lease.version] * 128)],
        lease_version=lease.version,
        version_hashes={lease.version: lease.version_hash},
        status=common_pb2.TRAJECTORY_STATUS_OK,
    )


async def run_clients(address: str, clients: int, seconds: float) -> dict[str, float]:
    channels = [grpc.aio.insecure_channel(address) for _ in range(min(clients, 4))]
    stubs = [lg.LedgerStub(c) for c in channels]
    ops = 0
    submit_ms: list[float] = []
    acquire_ms: list[float] = []
    counter = iter(range(10**9))

    async def client(i: int, stop: float) -> None:
        nonlocal ops
        stub = stubs[i % len(stubs)]
        holder = f"bench/{clients}/{i}"
        while time.monotonic() < stop:
            t0 = time.perf_counter()
            resp = await stub.AcquireLeases(lp.AcquireLeasesRequest(holder=holder), metadata=MD, timeout=30)
            acquire_ms.append((time.perf_counter() - t0) * 1000)
            for lease in resp.leases:
                req = lp.SubmitRequest(
                    trajectory=trajectory(lease, next(counter)),
                    holder=holder,
                    reward=common_pb2.RewardOutcome(reward=1.0),
                )
                t0 = time.perf_counter()
                verdict = await stub.Submit(req, metadata=MD, timeout=30)
                submit_ms.append((time.perf_counter() - t0) * 1000)
                if verdict.admitted:
                    ops += 1

    start = time.monotonic()
    await asyncio.gather(*(client(i, start + seconds) for i in range(clients)))
    elapsed = time.monotonic() - start
    for c in channels:
        await c.close()
    return {
        "ops_per_s": ops / elapsed,
        "submit_p50_ms": pct(submit_ms, 0.5),
        "submit_p99_ms": pct(submit_ms, 0.99),
        "acquire_p50_ms": pct(acquire_ms, 0.5),
        "acquire_p99_ms": pct(acquire_ms, 0.99),
    }


def getbatch_latency(stub: lg.LedgerStub, calls: int, first_step: int) -> dict[str, float]:
    times = []
    for i in range(calls):
        t0 = time.perf_counter()
        batch = stub.GetBatch(lp.GetBatchRequest(step=first_step + i, batch_size=G), metadata=MD, timeout=30)
        times.append((time.perf_counter() - t0) * 1000)
        stub.AckBatch(lp.AckBatchRequest(step=first_step + i, batch_id=batch.batch_id), metadata=MD, timeout=30)
    return {"getbatch_p50_ms": pct(times, 0.5), "getbatch_p99_ms": pct(times, 0.99), "calls": calls}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seconds", type=float, default=8.0, help="measuring time per client count")
    parser.add_argument("--clients", type=int, nargs="+", default=[1, 8, 32])
    # SET fsyncs every write (appendfsync always): fewer requests keep the run short.
    parser.add_argument("--redis-sets", type=int, default=10_000)
    parser.add_argument("--redis-gets", type=int, default=100_000)
    parser.add_argument("--getbatch-calls", type=int, default=300)
    args = parser.parse_args(argv)

    script = Path(sys.executable).parent / "rollart-ledger"
    if not script.exists():
        print("rollart-ledger is not installed (pip install -e services/ledger)", file=sys.stderr)
        return 1
    tmp = Path(tempfile.mkdtemp(prefix="bench-ledger-"))
    redis_proc, url = start_redis(tmp / "redis")  # appendfsync always
    port = int(url.rsplit(":", 1)[1].split("/")[0])
    ready = tmp / "ledger.ready"
    env = {k: v for k, v in os.environ.items() if not k.startswith("ROLLART_")}
    env.update(
        ROLLART_LISTEN="127.0.0.1:0",
        ROLLART_METRICS_LISTEN="none",
        ROLLART_JOB_TOKEN=TOKEN,
        ROLLART_REDIS_URL=url,
        ROLLART_READY_FILE=str(ready),
        ROLLART_LOG_LEVEL="WARNING",
    )
    ledger = ManagedProcess("ledger", [str(script)], log_path=tmp / "ledger.log", env=env, ready_file=ready).start()
    results: dict = {"rows": []}
    try:
        address = ledger.wait_ready(60)["address"]
        ch = grpc.insecure_channel(address)
        stub = lg.LedgerStub(ch)
        stub.SetJobPolicy(
            lp.SetJobPolicyRequest(
                policy=lp.JobPolicy(job_id="bench", group_size=G, buffer_capacity=10_000_000, alpha=1)
            ),
            metadata=MD,
        )
        stub.RegisterVersion(
            lp.RegisterVersionRequest(version=common_pb2.PolicyVersion(version=0, base_version=-1, hash=HASH0)),
            metadata=MD,
        )
        # Enough groups for every run (the pool never runs dry while measuring).
        needed = int(sum(args.clients) * args.seconds * 120 / G) + 2 * args.getbatch_calls
        for start in range(0, needed, 2000):
            prompts = [lp.Prompt(prompt_id=f"p{start + j}", task="math") for j in range(2000)]
            stub.AddPrompts(lp.AddPromptsRequest(prompts=prompts), metadata=MD, timeout=60)
        r = redis.Redis.from_url(url)
        r.config_resetstat()
        for n in args.clients:
            row = {"clients": n, **asyncio.run(run_clients(address, n, args.seconds))}
            rates = redis_benchmark(port, n, args.redis_sets, args.redis_gets)
            row["redis_set_per_s"] = rates.get("SET", float("nan"))
            row["redis_get_per_s"] = rates.get("GET", float("nan"))
            row["ratio_vs_set"] = row["ops_per_s"] / row["redis_set_per_s"] if rates else float("nan")
            results["rows"].append(row)
        stats = r.info("commandstats")
        evalsha = stats.get("cmdstat_evalsha", {})
        results["evalsha_usec_per_call"] = evalsha.get("usec_per_call")
        results.update(getbatch_latency(stub, args.getbatch_calls, 1))
        status = stub.GetStatus(lp.LedgerStatusRequest(), metadata=MD)
        results["admitted_total"] = status.settlement.admitted
        ch.close()
    finally:
        ledger.stop()
        redis_proc.stop()
    results["machine"] = f"{os.cpu_count()} cores, {cpu_model()}"
    results["redis"] = subprocess.run(["redis-server", "--version"], capture_output=True, text=True).stdout.split()[2]

    print(f"\nLedger benchmark — {results['machine']}; redis-server {results['redis']} (AOF, appendfsync always);")
    print(f"client and ledger on the same machine; {args.seconds:.0f} s per row; op = AcquireLeases(1) + Submit\n")
    print(
        "| clients | lease+settle ops/s | Submit p50 ms | Submit p99 ms | Acquire p50 ms | redis SET/s | redis GET/s | ledger ops / SET |"
    )
    print("|---:|---:|---:|---:|---:|---:|---:|---:|")
    for row in results["rows"]:
        print(
            f"| {row['clients']} | {row['ops_per_s']:.0f} | {row['submit_p50_ms']:.2f} | {row['submit_p99_ms']:.2f} | "
            f"{row['acquire_p50_ms']:.2f} | {row['redis_set_per_s']:.0f} | {row['redis_get_per_s']:.0f} | "
            f"{row['ratio_vs_set']:.3f} |"
        )
    print(
        f"\nGetBatch (B = {G}, one complete group, then AckBatch; {results['calls']} calls): "
        f"p50 {results['getbatch_p50_ms']:.2f} ms, p99 {results['getbatch_p99_ms']:.2f} ms"
    )
    if results.get("evalsha_usec_per_call") is not None:
        print(
            f"Redis time per ledger script call (EVALSHA, INFO commandstats): {results['evalsha_usec_per_call']:.1f} µs"
        )
    out = Path(__file__).resolve().parent / "out"
    out.mkdir(exist_ok=True)
    (out / "ledger.json").write_text(json.dumps(results, indent=2))
    shutil.rmtree(tmp, ignore_errors=True)
    print(f"\nadmitted {results['admitted_total']} results; JSON: {out / 'ledger.json'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
