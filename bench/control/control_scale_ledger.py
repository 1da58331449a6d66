"""Control plane at scale, the ledger's rows (issue 17 part A): the ledger as environment loops and actors grow.

    .venv/bin/python -m bench control-scale-ledger [--quick] [--json PATH]
    (and through `python -m bench control-scale`, which calls ``rows(args)``, prints the table, draws the PNG)

A real rollart-ledger over a real redis-server (AOF, appendfsync always) and, in this process, simulated holders
and actors:

* ``env_loops``, E = 16, 256, 1,024, 4,096 concurrent environment loops: each takes a lease, holds it for an
  episode (``--episode-s``, uniform 0.5-1.5x), settles it and starts again, through the envmanager's own batched
  client (AcquireLeasesBatch / SubmitBatch, one client for all loops, like one envmanager process). The offered
  rate is E / episode; where ops/s stops following it and the latency climbs, the ledger (or its machine) is
  saturated. Midway, a step is planned (new version, 4 actors on it) and timed.
* ``actors``, 1 to 256 registered actors heartbeating every second (each its own ActorHeartbeat, as actors
  do) while 64 loops settle work attributed to them (feeds each actor's tau); the step plan splits B over all of
  them and is timed.

Row fields: component "ledger", dimension, n, ops_per_second (env_loops: leases acquired and settled; actors:
those plus heartbeats), p50_ms / p99_ms (one lease's acquire + settle calls as its loop saw them, think time
excluded), cpu_ms_per_op (ledger process + redis-server CPU per op; the client's is apart), and specific fields:
offered_per_second, ledger/redis/client CPU per op, redis_kb_per_1000_leases (growth of Redis's used_memory
per 1,000 leases issued, samples kept in the buffer), plan_step_ms, heartbeat p50/p99, load_avg.
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import json
import os
import random
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import grpc
import redis

from bench.control.ledger import MD, TOKEN, pct, proc_cpu_s, redis_cpu_s
from rollart.local.processes import ManagedProcess, start_redis
from rollart.runtime.timeutil import duration as dur
from rollart.v1 import common_pb2
from rollart.v1 import ledger_pb2 as lp
from rollart.v1 import ledger_pb2_grpc as lg

G = 8
ENV_LOOPS = (16, 256, 1024, 4096)
ACTORS = (1, 4, 16, 64, 256)
ACTOR_LOOPS = 64
PLAN_B = 64


def h(v: int) -> bytes:
    return hashlib.sha256(f"version-{v}".encode()).digest()


TEMPLATE = common_pb2.Trajectory(
    prompt_token_ids=list(range(64)),
    turns=[common_pb2.Turn(action_token_ids=list(range(128)))],
    status=common_pb2.TRAJECTORY_STATUS_OK,
)


def submission(lease: lp.Lease, holder: str, n: int, actor: str = "") -> lp.SubmitRequest:
    t = common_pb2.Trajectory()
    t.CopyFrom(TEMPLATE)
    t.turns[0].action_versions.extend([lease.version] * 128)
    t.version_hashes[lease.version] = lease.version_hash
    t.trajectory_id = f"t{n}-{lease.lease_id}"
    t.lease_id = lease.lease_id
    t.prompt_id = lease.prompt.prompt_id
    t.group_id = lease.group_id
    t.sample_index = lease.sample_index
    t.lease_version = lease.version
    req = lp.SubmitRequest(trajectory=t, holder=holder, reward=common_pb2.RewardOutcome(reward=1.0))
    if actor:
        req.work.append(lp.ActorWork(actor_id=actor, tokens=128, generation_time=dur(0.5)))
    return req


class Cluster:
    """A redis-server and a rollart-ledger for one dimension (a fresh store per dimension)."""

    def __init__(self, tmp: Path) -> None:
        self.redis_proc, self.url = start_redis(tmp / "redis")
        ready = tmp / "ledger.ready"
        env = {k: v for k, v in os.environ.items() if not k.startswith("ROLLART_")}
        env.update(ROLLART_LISTEN="127.0.0.1:0", ROLLART_METRICS_LISTEN="none", ROLLART_JOB_TOKEN=TOKEN,
                   ROLLART_REDIS_URL=self.url, ROLLART_READY_FILE=str(ready), ROLLART_LOG_LEVEL="WARNING")
        script = Path(sys.executable).parent / "rollart-ledger"
        self.ledger = ManagedProcess("ledger", [str(script)], log_path=tmp / "ledger.log", env=env,
                                     ready_file=ready).start()
        self.address = self.ledger.wait_ready(60)["address"]
        self.redis = redis.Redis.from_url(self.url)
        self.version = 0
        self.step = 0
        ch = grpc.insecure_channel(self.address)
        self.stub = lg.LedgerStub(ch)
        self.stub.SetJobPolicy(lp.SetJobPolicyRequest(policy=lp.JobPolicy(
            job_id="scale", group_size=G, buffer_capacity=10_000_000, alpha=1000,
            initial_lease_ttl=dur(120), min_lease_ttl=dur(60), max_lease_ttl=dur(600), actor_timeout=dur(600),
        )), metadata=MD)
        self.stub.RegisterVersion(lp.RegisterVersionRequest(
            version=common_pb2.PolicyVersion(version=0, base_version=-1, hash=h(0))), metadata=MD)
        self.prompts = 0

    def add_samples(self, samples: int) -> None:
        groups = samples // G + 1
        for start in range(0, groups, 2000):
            n = min(2000, groups - start)
            ps = [lp.Prompt(prompt_id=f"p{self.prompts + j}", task="math") for j in range(n)]
            self.prompts += n
            self.stub.AddPrompts(lp.AddPromptsRequest(prompts=ps), metadata=MD, timeout=300)

    def cpu(self) -> tuple[float, float]:
        pid = self.ledger.pid
        assert pid is not None
        return proc_cpu_s(pid), redis_cpu_s(self.redis)

    def memory(self) -> int:
        return int(self.redis.info("memory")["used_memory"])

    def stop(self) -> None:
        self.ledger.stop()
        self.redis_proc.stop()


def weights(v: int) -> common_pb2.ActorWeightState:
    return common_pb2.ActorWeightState(loaded=True, active_version=v, active_hash=h(v))


async def plan_next(stub: Any, cluster: Cluster, actors: list[str]) -> float:
    """Registers the next version, moves the actors onto it, plans its step; returns PlanStep's milliseconds."""
    v = cluster.version + 1
    cluster.version = v  # heartbeats report it from now on
    await stub.RegisterVersion(lp.RegisterVersionRequest(
        version=common_pb2.PolicyVersion(version=v, base_version=v - 1, hash=h(v))), metadata=MD)
    await asyncio.gather(*(stub.ActorHeartbeat(lp.ActorHeartbeatRequest(actor_id=a, weights=weights(v)), metadata=MD)
                           for a in actors))
    t0 = time.perf_counter()
    await stub.PlanStep(lp.PlanStepRequest(step=v, version=v, batch_size=PLAN_B), metadata=MD, timeout=60)
    return (time.perf_counter() - t0) * 1000


async def drive(cluster: Cluster, loops: int, seconds: float, episode_s: float, actors: list[str],
                heartbeat_s: float | None) -> dict:
    """``loops`` simulated environment loops for ``seconds`` (after a ramp), plus heartbeating ``actors``."""
    from rollart_envmanager.ledger_batch import LedgerBatcher

    ch = grpc.aio.insecure_channel(cluster.address, options=[("grpc.max_receive_message_length", 64 << 20)])
    stub = lg.LedgerStub(ch)

    class Authed:  # the envmanager's channel adds the token itself
        def __getattr__(self, name: str) -> Any:
            method = getattr(stub, name)
            return lambda req, **kw: method(req, metadata=MD, **kw)

    async def source() -> Any:
        return Authed()

    batcher = LedgerBatcher(source)
    # The window opens once the loops are past their first cycle (every loop settled once on average: with
    # thousands of loops the first wave of acquires alone takes seconds), so it sees the steady state.
    inf = float("inf")
    window = {"start": inf, "stop": inf}
    completed = 0

    def measuring() -> bool:
        return window["start"] <= time.monotonic() <= window["stop"]

    def running() -> bool:
        return time.monotonic() < window["stop"]
    op_ms: list[float] = []
    hb_ms: list[float] = []
    counter = iter(range(10**9))
    ops = heartbeats = 0

    async def loop(i: int) -> None:
        nonlocal ops, completed
        holder = f"em/{loops}/{i}"
        rng = random.Random(i)
        await asyncio.sleep(rng.uniform(0, episode_s))  # loops do not start in lockstep
        while running():
            t0 = time.perf_counter()
            try:
                resp = await batcher.acquire(lp.AcquireLeasesRequest(holder=holder), wait=1.0, timeout=60)
            except grpc.aio.AioRpcError:
                continue
            t1 = time.perf_counter()
            if not resp.leases:
                continue
            lease = resp.leases[0]
            await asyncio.sleep(episode_s * rng.uniform(0.5, 1.5))  # the episode
            actor = actors[i % len(actors)] if actors else ""
            t2 = time.perf_counter()
            try:
                verdict = await batcher.submit(submission(lease, holder, next(counter), actor), timeout=60)
            except grpc.aio.AioRpcError:
                continue
            t3 = time.perf_counter()
            completed += verdict.admitted
            if measuring() and verdict.admitted:
                ops += 1
                op_ms.append((t1 - t0 + t3 - t2) * 1000)

    async def actor_beats(a: str, rng: random.Random) -> None:
        nonlocal heartbeats
        assert heartbeat_s is not None
        await asyncio.sleep(rng.uniform(0, heartbeat_s))
        while running():
            t0 = time.perf_counter()
            await stub.ActorHeartbeat(lp.ActorHeartbeatRequest(actor_id=a, weights=weights(cluster.version),
                                                                observed_tokens_per_s=100.0), metadata=MD)
            if measuring():
                heartbeats += 1
                hb_ms.append((time.perf_counter() - t0) * 1000)
            await asyncio.sleep(heartbeat_s)

    plans: list[float] = []

    async def planner() -> None:
        while window["start"] == inf:
            await asyncio.sleep(0.1)
        await asyncio.sleep(seconds / 2)
        for _ in range(2):
            try:
                plans.append(await plan_next(stub, cluster, actors))
            except grpc.aio.AioRpcError as exc:
                print(f"PlanStep failed: {exc.code().name}: {exc.details()}", file=sys.stderr)

    rng = random.Random(7)
    tasks = [asyncio.create_task(loop(i)) for i in range(loops)]
    if heartbeat_s is not None:
        tasks += [asyncio.create_task(actor_beats(a, rng)) for a in actors]
    tasks.append(asyncio.create_task(planner()))
    t_ramp = time.monotonic()
    await asyncio.sleep(min(episode_s * 1.5, 3.0))
    while completed < loops and time.monotonic() - t_ramp < 120:
        await asyncio.sleep(0.1)
    ramp_s = time.monotonic() - t_ramp
    window["start"] = time.monotonic()
    c0, m0, me0 = cluster.cpu(), cluster.memory(), proc_cpu_s(os.getpid())
    seq0 = int(cluster.redis.get(b"rollart:ledger:lease:seq") or 0)
    await asyncio.sleep(seconds)
    c1, m1, me1 = cluster.cpu(), cluster.memory(), proc_cpu_s(os.getpid())
    seq1 = int(cluster.redis.get(b"rollart:ledger:lease:seq") or 0)
    window["stop"] = time.monotonic()
    await asyncio.gather(*tasks, return_exceptions=True)
    rpcs = batcher.acquires.batches + batcher.submits.batches
    await batcher.close()
    await ch.close()
    served = ops + heartbeats
    return {
        "ops": ops, "heartbeats": heartbeats, "served": served, "seconds": seconds,
        "op_ms": op_ms, "hb_ms": hb_ms, "plans": plans, "rpcs": rpcs,
        "ledger_cpu": c1[0] - c0[0], "redis_cpu": c1[1] - c0[1], "client_cpu": me1 - me0,
        "mem": m1 - m0, "leases": seq1 - seq0, "ramp_s": ramp_s,
    }  # fmt: skip


def row(dimension: str, n: int, r: dict, offered: float | None) -> dict:
    served = max(r["served"], 1)
    out = {
        "component": "ledger",
        "dimension": dimension,
        "n": n,
        "ops_per_second": r["served"] / r["seconds"],
        "p50_ms": pct(r["op_ms"], 0.5),
        "p99_ms": pct(r["op_ms"], 0.99),
        "cpu_ms_per_op": (r["ledger_cpu"] + r["redis_cpu"]) * 1000 / served,
        "settle_ops_per_second": r["ops"] / r["seconds"],
        "ledger_cpu_ms_per_op": r["ledger_cpu"] * 1000 / served,
        "redis_cpu_ms_per_op": r["redis_cpu"] * 1000 / served,
        "client_cpu_ms_per_op": r["client_cpu"] * 1000 / served,
        "rpcs_per_settle_op": r["rpcs"] / max(r["ops"], 1),
        "redis_kb_per_1000_leases": r["mem"] / 1024 / max(r["leases"], 1) * 1000,
        "plan_step_ms": min(r["plans"]) if r["plans"] else float("nan"),
        "ramp_seconds": r["ramp_s"],
        "load_avg": os.getloadavg()[0],
    }
    if offered is not None:
        out["offered_per_second"] = offered
    if r["hb_ms"]:
        out["heartbeats_per_second"] = r["heartbeats"] / r["seconds"]
        out["heartbeat_p50_ms"] = pct(r["hb_ms"], 0.5)
        out["heartbeat_p99_ms"] = pct(r["hb_ms"], 0.99)
    return out


def rows(args: argparse.Namespace) -> list[dict]:
    quick = bool(getattr(args, "quick", False))
    seconds = float(getattr(args, "ledger_seconds", None) or (4.0 if quick else 10.0))
    episode_s = float(getattr(args, "episode_s", None) or 2.0)
    env_loops = list(getattr(args, "env_loops", None) or ENV_LOOPS)
    actor_counts = list(getattr(args, "actors", None) or ((1, 16, 256) if quick else ACTORS))
    out: list[dict] = []
    tmp = Path(tempfile.mkdtemp(prefix="bench-scale-ledger-"))

    cluster = Cluster(tmp / "loops")
    try:
        planners = [f"a{i}" for i in range(4)]
        for a in planners:
            cluster.stub.RegisterActor(lp.RegisterActorRequest(actor=lp.LedgerActor(
                actor_id=a, endpoint=f"127.0.0.1:{9000 + int(a[1:])}", weights=weights(0))), metadata=MD)
        for e in env_loops:
            cluster.add_samples(int((e / episode_s) * (seconds + 6) * 1.2) + 2 * e)
            r = asyncio.run(drive(cluster, e, seconds, episode_s, planners, None))
            out.append(row("env_loops", e, r, e / episode_s))
            print(json.dumps(out[-1]), flush=True)
    finally:
        cluster.stop()

    cluster = Cluster(tmp / "actors")
    try:
        registered: list[str] = []
        for n in actor_counts:
            for i in range(len(registered), n):
                a = f"actor-{i}"
                cluster.stub.RegisterActor(lp.RegisterActorRequest(actor=lp.LedgerActor(
                    actor_id=a, endpoint=f"127.0.0.1:{10000 + i}", weights=weights(cluster.version))), metadata=MD)
                registered.append(a)
            cluster.add_samples(int(ACTOR_LOOPS / episode_s * (seconds + 6) * 1.2) + 2 * ACTOR_LOOPS)
            r = asyncio.run(drive(cluster, ACTOR_LOOPS, seconds, episode_s, registered, 1.0))
            out.append(row("actors", n, r, None))
            print(json.dumps(out[-1]), flush=True)
    finally:
        cluster.stop()
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true")
    p.add_argument("--ledger-seconds", type=float, help="measured seconds per point (default 10, quick 4)")
    p.add_argument("--episode-s", type=float, help="mean episode length of a simulated loop (default 2 s)")
    p.add_argument("--env-loops", type=int, nargs="+")
    p.add_argument("--actors", type=int, nargs="+")
    p.add_argument("--json", type=Path, help="rows here, one JSON object per line")
    args = p.parse_args(argv)
    out = rows(args)
    if args.json:
        args.json.write_text("".join(json.dumps(r) + "\n" for r in out))
    keys = ("dimension", "n", "ops_per_second", "p50_ms", "p99_ms", "cpu_ms_per_op", "client_cpu_ms_per_op",
            "redis_kb_per_1000_leases", "plan_step_ms", "heartbeat_p99_ms", "load_avg")
    print("| " + " | ".join(keys) + " |\n|" + "---|" * len(keys))
    for r in out:
        print("| " + " | ".join(f"{r[k]:.2f}" if isinstance(r.get(k), float) else str(r.get(k, "-")) for k in keys)
              + " |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
