"""Job Ledger benchmark: lease + settle throughput, single-item RPCs against the batched ones, both against their
store's limit (redis-benchmark SET on the same redis-server), with CPU per op; GetBatch latency.

    .venv/bin/python -m bench ledger [--seconds 8] [--clients 1 8 32] [--modes single batched]
                                           [--json PATH] [--py-spy PATH] [--baseline PATH]
    .venv/bin/python -m bench ledger --script-costs 4000 [--script-batch 16] [--json PATH]

Starts a private redis-server (AOF, appendfsync always: what `rollart up` runs) and a real rollart-ledger
process. For each client count, each mode runs that many concurrent environment loops (asyncio, one process),
each its own holder, each looping "take one lease, settle it":

* ``single``: AcquireLeases(max 1) + Submit per op, two RPCs and two fsync'ed scripts per op (issue 17's
  baseline);
* ``batched``: the envmanager's own client (rollart_envmanager.ledger_batch.LedgerBatcher): the loops' calls
  made while a batch is in flight leave together as one AcquireLeasesBatch / SubmitBatch, which the ledger runs
  as one script each (acquire_batch.lua, submit_batch.lua: one round trip to Redis and one fsync per batch).

One op is one lease acquired and its result admitted (with its reward). Right after each client count,
redis-benchmark measures SET on the same redis-server with as many connections, so ``ops / SET`` shows how
close the ledger gets to its store's limit. CPU per op is measured for the ledger process, redis-server and the
client process (the three share the machine). With ``--py-spy`` (a py-spy binary; `pip install py-spy`) the
ledger is sampled during the last batched row and its hottest functions are printed. GetBatch latency is
measured on a buffer of complete groups (B = one group, then AckBatch). JSON (one object per row) goes to
``--json`` (default bench/out/ledger.json). ``--baseline`` (the JSON of an earlier run, e.g. of an older commit
run from a git worktree just before) adds a table of this run beside it, row by row. ``--script-costs N`` measures
only Redis's own cost per lease and per result of the scripts, single-item against batched (no gRPC, no ledger
process; with PYTHONPATH on an older commit's services/ledger it measures that commit's scripts).
"""

from __future__ import annotations

import argparse
import asyncio
import collections
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
MODES = ("single", "batched")


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


def proc_cpu_s(pid: int) -> float:
    """User + system CPU seconds of a process (Linux /proc)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def redis_cpu_s(r: redis.Redis) -> float:
    info = r.info("cpu")
    return float(info["used_cpu_user"]) + float(info["used_cpu_sys"])


def redis_set_rate(port: int, clients: int, n: int) -> float:
    """SET requests/s on the ledger's redis-server (its db 9), as many connections as clients."""
    exe = shutil.which("redis-benchmark")
    if exe is None:
        return float("nan")
    out = subprocess.run(
        [exe, "-h", "127.0.0.1", "-p", str(port), "-t", "set", "-n", str(n), "-c", str(clients),
         "--dbnum", "9", "--csv", "-q"],
        capture_output=True, text=True, timeout=300,
    ).stdout  # fmt: skip
    for line in out.splitlines():
        cells = [c.strip('"') for c in line.split(",")]
        if len(cells) >= 2 and cells[0] == "SET":
            return float(cells[1])
    return float("nan")


TEMPLATE = common_pb2.Trajectory(
    prompt_token_ids=list(range(64)),
    turns=[common_pb2.Turn(action_token_ids=list(range(128)), action_versions=[0] * 128)],
    version_hashes={0: HASH0},
    status=common_pb2.TRAJECTORY_STATUS_OK,
)


def submission(lease: lp.Lease, holder: str, n: int) -> lp.SubmitRequest:
    t = common_pb2.Trajectory()
    t.CopyFrom(TEMPLATE)
    t.trajectory_id = f"t{n}-{lease.lease_id}"
    t.lease_id = lease.lease_id
    t.prompt_id = lease.prompt.prompt_id
    t.group_id = lease.group_id
    t.sample_index = lease.sample_index
    t.lease_version = lease.version
    return lp.SubmitRequest(trajectory=t, holder=holder, reward=common_pb2.RewardOutcome(reward=1.0))


class Meter:
    """Ops and per-call latencies of one row."""

    def __init__(self) -> None:
        self.ops = 0
        self.acquire_ms: list[float] = []
        self.submit_ms: list[float] = []
        self.op_ms: list[float] = []


async def run_single(address: str, clients: int, seconds: float, tag: str) -> Meter:
    channels = [grpc.aio.insecure_channel(address) for _ in range(min(clients, 4))]
    stubs = [lg.LedgerStub(c) for c in channels]
    m = Meter()
    counter = iter(range(10**9))

    async def loop(i: int, stop: float) -> None:
        stub = stubs[i % len(stubs)]
        holder = f"bench/{tag}/{i}"
        while time.monotonic() < stop:
            t0 = time.perf_counter()
            resp = await stub.AcquireLeases(lp.AcquireLeasesRequest(holder=holder), metadata=MD, timeout=30)
            t1 = time.perf_counter()
            m.acquire_ms.append((t1 - t0) * 1000)
            for lease in resp.leases:
                t2 = time.perf_counter()
                verdict = await stub.Submit(submission(lease, holder, next(counter)), metadata=MD, timeout=30)
                t3 = time.perf_counter()
                m.submit_ms.append((t3 - t2) * 1000)
                m.op_ms.append((t3 - t0) * 1000)
                m.ops += verdict.admitted

    start = time.monotonic()
    await asyncio.gather(*(loop(i, start + seconds) for i in range(clients)))
    for c in channels:
        await c.close()
    return m


async def run_batched(address: str, clients: int, seconds: float, tag: str, max_in_flight: int) -> Meter:
    from rollart_envmanager.ledger_batch import LedgerBatcher

    ch = grpc.aio.insecure_channel(address)
    stub = lg.LedgerStub(ch)

    class Authed:  # the envmanager's channel adds the token itself; this bench's plain channel needs it per call
        def __getattr__(self, name: str):
            method = getattr(stub, name)
            return lambda req, **kw: method(req, metadata=MD, **kw)

    async def source():
        return Authed()

    batcher = LedgerBatcher(source, max_in_flight=max_in_flight)
    m = Meter()
    counter = iter(range(10**9))

    async def loop(i: int, stop: float) -> None:
        holder = f"bench/{tag}/{i}"
        while time.monotonic() < stop:
            t0 = time.perf_counter()
            resp = await batcher.acquire(lp.AcquireLeasesRequest(holder=holder), wait=0.0, timeout=30)
            t1 = time.perf_counter()
            m.acquire_ms.append((t1 - t0) * 1000)
            for lease in resp.leases:
                t2 = time.perf_counter()
                verdict = await batcher.submit(submission(lease, holder, next(counter)), timeout=30)
                t3 = time.perf_counter()
                m.submit_ms.append((t3 - t2) * 1000)
                m.op_ms.append((t3 - t0) * 1000)
                m.ops += verdict.admitted

    start = time.monotonic()
    await asyncio.gather(*(loop(i, start + seconds) for i in range(clients)))
    m.rpcs = batcher.acquires.batches + batcher.submits.batches  # type: ignore[attr-defined]
    await batcher.close()
    await ch.close()
    return m


def getbatch_latency(stub: lg.LedgerStub, calls: int, first_step: int) -> dict[str, float]:
    times = []
    for i in range(calls):
        t0 = time.perf_counter()
        batch = stub.GetBatch(lp.GetBatchRequest(step=first_step + i, batch_size=G), metadata=MD, timeout=30)
        times.append((time.perf_counter() - t0) * 1000)
        stub.AckBatch(lp.AckBatchRequest(step=first_step + i, batch_id=batch.batch_id), metadata=MD, timeout=30)
    return {"getbatch_p50_ms": pct(times, 0.5), "getbatch_p99_ms": pct(times, 0.99), "calls": calls}


def py_spy_top(raw: Path, top: int = 15) -> list[tuple[str, float, float]]:
    """(function, self %, inclusive %) of py-spy's collapsed stacks (``--format raw``), hottest self first."""
    selft: collections.Counter[str] = collections.Counter()
    incl: collections.Counter[str] = collections.Counter()
    total = 0
    for line in raw.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack or not count.isdigit():
            continue
        n = int(count)
        total += n
        frames = [f.split(" (")[0] + " (" + f.split(" (")[1].split(":")[0].rsplit("/", 1)[-1] + ")"
                  if " (" in f else f for f in stack.split(";")]
        selft[frames[-1]] += n
        for f in set(frames):
            incl[f] += n
    return [(f, 100 * n / max(total, 1), 100 * incl[f] / max(total, 1)) for f, n in selft.most_common(top)]


def print_beside(baseline: Path, rows: list[dict]) -> None:
    """This run's rows beside a baseline's (same clients and mode): ops/s, ratio to SET, CPU per op."""
    old = {(r["clients"], r["mode"]): r for r in map(json.loads, baseline.read_text().splitlines()) if r}

    def cpu(r: dict) -> float:
        return r["ledger_cpu_ms_per_op"] + r["redis_cpu_ms_per_op"] + r["client_cpu_ms_per_op"]

    print(f"\nBeside {baseline}:")
    print("| clients | mode | ops/s before | ops/s now | now / before | ops/SET before | ops/SET now |"
          " CPU ms/op before (ledger+Redis+client) | now | Redis CPU ms/op before | now |")
    print("|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        b = old.get((r["clients"], r["mode"]))
        if b is None:
            continue
        print(f"| {r['clients']} | {r['mode']} | {b['ops_per_s']:.0f} | {r['ops_per_s']:.0f} | "
              f"{r['ops_per_s'] / b['ops_per_s']:.2f}x | {b['ratio_vs_set']:.3f} | {r['ratio_vs_set']:.3f} | "
              f"{cpu(b):.3f} | {cpu(r):.3f} | {b['redis_cpu_ms_per_op']:.3f} | {r['redis_cpu_ms_per_op']:.3f} |")


async def script_costs(n_ops: int, batch: int) -> list[dict]:
    """Redis's own cost of the lease + settle scripts, per item: the single-item scripts (one EVALSHA per lease or
    result) against the batch scripts (batches of ``batch``), driven in-process (rollart_ledger.scripts) on a
    private redis-server with AOF but no fsync, so what is left is script work. Redis CPU from INFO cpu (CPU
    seconds: steadier than EVALSHA's wall-clock usec on a loaded machine), both per item."""
    import redis.asyncio as aioredis

    from rollart_ledger import policy as pol
    from rollart_ledger.scripts import AcquireArgs, LedgerScripts, NewGroup, Submission

    traj = TEMPLATE.SerializeToString()
    tmp = Path(tempfile.mkdtemp(prefix="bench-ledger-scripts-"))
    proc, url = start_redis(tmp, appendfsync="no")
    r = aioredis.from_url(url)

    async def cpu_us() -> float:
        info = await r.info("cpu")
        return (float(info["used_cpu_user"]) + float(info["used_cpu_sys"])) * 1e6

    async def evalsha_us() -> float:
        return float((await r.info("commandstats")).get("cmdstat_evalsha", {}).get("usec", 0))

    out: list[dict] = []
    try:
        for mode in ("single", "batched"):
            s = LedgerScripts(r, f"costs:{mode}:")
            await s.load()
            await s.ensure_policy(pol.defaults(""))
            await s.set_policy(pol.fill(lp.JobPolicy(job_id="j", group_size=G, buffer_capacity=10**7, alpha=1), ""))
            await s.register_version(common_pb2.PolicyVersion(version=0, base_version=-1, hash=HASH0))
            for st in range(0, n_ops // G + 2 * G, 1000):
                groups = [NewGroup("", f"p{st + j}", "math", lp.Prompt(prompt_id=f"p{st + j}").SerializeToString())
                          for j in range(1000)]  # fmt: skip
                await s.add_prompts(group_size=G, redundancy=0, step=0, priority=0, groups=groups)
            acquire_many = getattr(s, "acquire_batch", None) or s.acquire_many  # (an older commit's name)
            submit_many = getattr(s, "submit_batch", None) or s.submit_many
            leases: list[lp.Lease] = []
            c0, e0 = await cpu_us(), await evalsha_us()
            for _ in range(0, n_ops, batch):
                if mode == "single":
                    for j in range(batch):
                        got = await s.acquire(holder=f"h{j}", max_leases=1, region="", group_id="", tasks=())
                        leases += got.leases
                else:
                    for g in await acquire_many([AcquireArgs(f"h{j}", 1) for j in range(batch)]):
                        leases += g.leases  # type: ignore[union-attr]
            c1, e1 = await cpu_us(), await evalsha_us()
            subs = [Submission(lease_id=le.lease_id, trajectory_id=f"t-{le.lease_id}", holder=le.holder,
                               lease_version=0, ok=True, token_versions=(0, 0), scored=True, reward=1.0,
                               trajectory=traj, tau_window_ms=5000, version_hashes={0: HASH0}, work=(),
                               generated_tokens=128) for le in leases]  # fmt: skip
            for i in range(0, len(subs), batch):
                if mode == "single":
                    verdicts = [await s.settle(x) for x in subs[i : i + batch]]
                else:
                    verdicts = await submit_many(subs[i : i + batch])
                assert all(getattr(v, "admitted", False) for v in verdicts), verdicts[:1]
            c2, e2 = await cpu_us(), await evalsha_us()
            n = len(leases)
            out.append({
                "mode": mode, "items": n, "batch": 1 if mode == "single" else batch,
                "acquire_redis_cpu_us": (c1 - c0) / n, "submit_redis_cpu_us": (c2 - c1) / n,
                "acquire_script_us": (e1 - e0) / n, "submit_script_us": (e2 - e1) / n,
                "load_avg": os.getloadavg()[0],
            })  # fmt: skip
    finally:
        await r.aclose()
        proc.stop()
        shutil.rmtree(tmp, ignore_errors=True)
    return out


def print_script_costs(rows: list[dict]) -> None:
    print("\nRedis's own cost per item (in-process driver, private redis-server, AOF without fsync):")
    print("| mode | items | Redis CPU µs per lease (acquire) | per result (submit) | script µs per lease | per result |"
          " load |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    for c in rows:
        print(f"| {c['mode']} (batch {c['batch']}) | {c['items']} | {c['acquire_redis_cpu_us']:.1f} | "
              f"{c['submit_redis_cpu_us']:.1f} | {c['acquire_script_us']:.1f} | {c['submit_script_us']:.1f} | "
              f"{c['load_avg']:.1f} |")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seconds", type=float, default=8.0, help="measuring time per row")
    parser.add_argument("--clients", type=int, nargs="+", default=[1, 8, 32])
    parser.add_argument("--modes", nargs="+", choices=MODES, default=list(MODES))
    parser.add_argument("--max-in-flight", type=int, default=None,
                        help="batched: batches of each kind in flight (default: the envmanager's)")
    # SET fsyncs every write (appendfsync always): 20,000 requests keep the run short.
    parser.add_argument("--redis-sets", type=int, default=20_000)
    parser.add_argument("--getbatch-calls", type=int, default=300)
    parser.add_argument("--json", type=Path, default=Path(__file__).resolve().parents[1] / "out" / "ledger.json")
    parser.add_argument("--py-spy", type=Path, help="py-spy binary: sample the ledger during the last batched row")
    parser.add_argument("--baseline", type=Path, help="JSON rows of an earlier run: print this run beside them")
    parser.add_argument("--script-costs", type=int, metavar="N",
                        help="only measure Redis's cost per item of N leases and results, single vs batched")
    parser.add_argument("--script-batch", type=int, default=16, help="--script-costs: items per batch")
    args = parser.parse_args(argv)
    if args.script_costs:
        costs = asyncio.run(script_costs(args.script_costs, args.script_batch))
        print_script_costs(costs)
        if args.json:
            args.json.parent.mkdir(parents=True, exist_ok=True)
            args.json.write_text("".join(json.dumps(c) + "\n" for c in costs))
        return 0
    from rollart_envmanager.ledger_batch import MAX_IN_FLIGHT

    max_in_flight = args.max_in_flight or MAX_IN_FLIGHT

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
    rows: list[dict] = []
    extra: dict = {}
    profile: list[tuple[str, float, float]] = []
    try:
        address = ledger.wait_ready(60)["address"]
        ledger_pid = ledger.pid
        assert ledger_pid is not None
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
        # Enough groups for every row (the pool never runs dry while measuring): up to ~3,000 ops/s per row.
        needed = int(len(args.clients) * len(args.modes) * args.seconds * 3000 / G) + 2 * args.getbatch_calls
        for start in range(0, needed, 2000):
            prompts = [lp.Prompt(prompt_id=f"p{start + j}", task="math") for j in range(2000)]
            stub.AddPrompts(lp.AddPromptsRequest(prompts=prompts), metadata=MD, timeout=120)
        r = redis.Redis.from_url(url)
        r.config_resetstat()  # EVALSHA's time per call below: the rows' scripts, not the setup's AddPrompts
        me = os.getpid()
        for n in args.clients:
            for mode in args.modes:
                spy = None
                last = n == args.clients[-1] and mode == "batched"
                if args.py_spy and last:
                    raw = tmp / "ledger.pyspy.txt"
                    spy = subprocess.Popen(
                        [str(args.py_spy), "record", "--pid", str(ledger_pid), "--format", "raw", "--rate", "200",
                         "--duration", str(int(args.seconds)), "--output", str(raw), "--nonblocking"],
                        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                    )  # fmt: skip
                c0 = (proc_cpu_s(ledger_pid), redis_cpu_s(r), proc_cpu_s(me), time.monotonic())
                if mode == "single":
                    m = asyncio.run(run_single(address, n, args.seconds, f"s{n}"))
                else:
                    m = asyncio.run(run_batched(address, n, args.seconds, f"b{n}", max_in_flight))
                c1 = (proc_cpu_s(ledger_pid), redis_cpu_s(r), proc_cpu_s(me), time.monotonic())
                if spy is not None:
                    spy.wait(timeout=args.seconds + 30)
                    if raw.exists():
                        profile = py_spy_top(raw)
                ops = max(m.ops, 1)
                rows.append({
                    "clients": n,
                    "mode": mode,
                    "ops": m.ops,
                    "ops_per_s": m.ops / (c1[3] - c0[3]),
                    "op_p50_ms": pct(m.op_ms, 0.5),
                    "op_p99_ms": pct(m.op_ms, 0.99),
                    "acquire_p50_ms": pct(m.acquire_ms, 0.5),
                    "submit_p50_ms": pct(m.submit_ms, 0.5),
                    "submit_p99_ms": pct(m.submit_ms, 0.99),
                    "rpcs_per_op": getattr(m, "rpcs", len(m.acquire_ms) + len(m.submit_ms)) / ops,
                    "ledger_cpu_ms_per_op": (c1[0] - c0[0]) * 1000 / ops,
                    "redis_cpu_ms_per_op": (c1[1] - c0[1]) * 1000 / ops,
                    "client_cpu_ms_per_op": (c1[2] - c0[2]) * 1000 / ops,
                    "load_avg": os.getloadavg()[0],
                })  # fmt: skip
            set_rate = redis_set_rate(port, n, args.redis_sets)
            for row in rows:
                if row["clients"] == n:
                    row["redis_set_per_s"] = set_rate
                    row["ratio_vs_set"] = row["ops_per_s"] / set_rate
        stats = r.info("commandstats").get("cmdstat_evalsha", {})
        extra["evalsha_usec_per_call"] = stats.get("usec_per_call")  # one call: one item, or a whole batch
        ops_total = sum(row["ops"] for row in rows)
        extra["script_usec_per_op"] = stats.get("usec", 0) / ops_total if ops_total else None
        extra.update(getbatch_latency(stub, args.getbatch_calls, 1))
        extra["admitted_total"] = stub.GetStatus(lp.LedgerStatusRequest(), metadata=MD).settlement.admitted
        ch.close()
    finally:
        ledger.stop()
        redis_proc.stop()
    machine = f"{os.cpu_count()} cores, {cpu_model()}"
    redis_version = subprocess.run(["redis-server", "--version"], capture_output=True, text=True).stdout.split()[2]

    print(f"\nLedger benchmark — {machine}; redis-server {redis_version} (AOF, appendfsync always); client, ledger")
    print(f"and Redis on the same machine; {args.seconds:.0f} s per row; op = one lease acquired and settled;")
    print(f"batched: the envmanager's LedgerBatcher, {max_in_flight} batches of each kind in flight\n")
    print("| clients | mode | ops/s | op p50 ms | op p99 ms | RPCs/op | ledger CPU ms/op | Redis CPU ms/op |"
          " client CPU ms/op | SET/s | ops / SET | load |")
    print("|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for row in rows:
        print(
            f"| {row['clients']} | {row['mode']} | {row['ops_per_s']:.0f} | {row['op_p50_ms']:.2f} | "
            f"{row['op_p99_ms']:.2f} | {row['rpcs_per_op']:.2f} | {row['ledger_cpu_ms_per_op']:.3f} | "
            f"{row['redis_cpu_ms_per_op']:.3f} | {row['client_cpu_ms_per_op']:.3f} | {row['redis_set_per_s']:.0f} | "
            f"{row['ratio_vs_set']:.3f} | {row['load_avg']:.1f} |"
        )
    by = {(row["clients"], row["mode"]): row for row in rows}
    if set(args.modes) == set(MODES):
        print("\n| clients | single / SET | batched / SET | batched / single (ops/s) | single / batched (CPU per op) |")
        print("|---:|---:|---:|---:|---:|")
        for n in args.clients:
            s, b = by[(n, "single")], by[(n, "batched")]
            cpu = [x["ledger_cpu_ms_per_op"] + x["redis_cpu_ms_per_op"] + x["client_cpu_ms_per_op"] for x in (s, b)]
            print(f"| {n} | {s['ratio_vs_set']:.3f} | {b['ratio_vs_set']:.3f} | {b['ops_per_s'] / s['ops_per_s']:.2f}x"
                  f" | {cpu[0] / cpu[1]:.2f}x |")
    print(
        f"\nGetBatch (B = {G}, one complete group, then AckBatch; {extra['calls']} calls): "
        f"p50 {extra['getbatch_p50_ms']:.2f} ms, p99 {extra['getbatch_p99_ms']:.2f} ms"
    )
    if extra.get("script_usec_per_op") is not None:
        print(f"Redis time in scripts per op over all rows (EVALSHA, INFO commandstats): "
              f"{extra['script_usec_per_op']:.1f} µs ({extra['evalsha_usec_per_call']:.1f} µs per script run)")
    if profile:
        print(f"\nledger process, py-spy during the last batched row ({args.clients[-1]} clients): hottest functions")
        print("| function | self % | inclusive % |\n|---|---:|---:|")
        for f, sp, ip in profile:
            print(f"| `{f}` | {sp:.1f} | {ip:.1f} |")
    if args.baseline is not None and args.baseline.exists():
        print_beside(args.baseline, rows)
    args.json.parent.mkdir(parents=True, exist_ok=True)
    with args.json.open("w") as fh:
        for row in rows:
            fh.write(json.dumps({"machine": machine, "redis": redis_version, **row}) + "\n")
    (args.json.with_suffix(".extra.json")).write_text(json.dumps({**extra, "profile": profile}, indent=2))
    shutil.rmtree(tmp, ignore_errors=True)
    print(f"\nadmitted {extra['admitted_total']} results; JSON: {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
