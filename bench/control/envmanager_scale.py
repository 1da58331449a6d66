"""EnvManager loops at scale (issue 17, ``python -m bench control-scale`` part c): one real ``rollart-envmanager``
process runs N concurrent environment loops (N = 16 ... 1,024) of a cheap environment (``bench:fixed-turns``: no
latency, a string per step) against real redis, ledger and reward processes and a fixed-latency generation
server in the benchmark process (``envmanager_harness``).

Per point: N loops, N trajectories (groups of 8) of ``--env-turns`` turns; the envmanager process's user+system
CPU (from /proc) over the step, divided by the turns it ran = its per-turn overhead (the figure that must not grow
more than 2x from 16 to 1,024 loops); turns/s over the step; and the per-turn gap the generation server sees
(time from the end of a trajectory's generation to its next Generate call: the loop's own work per turn, env
step, chat frame, tokenize call, bookkeeping), p50/p99.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

from bench._support.envmanager_harness import Cluster, Driver, FixedLatencyGenerator, GeneratorThread
from rollart.v1 import common_pb2 as c
from rollart.v1 import envmanager_pb2 as em

TICKS = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / TICKS


class GapRecorder(FixedLatencyGenerator):
    """The harness's fixed-latency generator, also recording each trajectory's gap between the end of one
    generation and its next Generate call."""

    def __init__(self, gen_s: float, tokens: int = 16) -> None:
        super().__init__(gen_s, tokens)
        self.ended: dict[str, float] = {}
        self.gaps: list[float] = []

    async def Generate(self, request, context):
        now = time.monotonic()
        last = self.ended.pop(request.trajectory_id, None)
        if last is not None:
            self.gaps.append(now - last)
        async for item in super().Generate(request, context):
            yield item
        self.ended[request.trajectory_id] = time.monotonic()


def pct(values: list[float], q: float) -> float:
    return float(np.percentile(np.asarray(values), q)) if values else float("nan")


def env_spec(task: str, turns: int) -> em.EnvironmentSpec:
    return em.EnvironmentSpec(
        environment="bench:fixed-turns",
        task=task,
        options={"turns": str(turns)},
        sampling=c.SamplingParams(max_tokens=16),
        reward=c.RewardSpec(kind=c.SCORER_KIND_GAME),
    )


def rows(args, tmp: Path) -> list[dict]:
    gen = GapRecorder(args.env_gen_ms / 1e3)
    server = GeneratorThread(gen)
    out: list[dict] = []
    extra = {"ROLLART_ENV_THREADS": str(args.env_threads)} if args.env_threads else {}
    cluster = Cluster(
        tmp / f"envmanager-{args.env_threads or 'default'}", server.address, ROLLART_MAX_LOOPS="4096", **extra
    )
    em_proc = next(p for p in cluster.procs if p.name == "envmanager")
    driver = Driver(cluster)
    try:
        driver.setup()
        driver.warm_up(env_spec("warm-up", args.env_turns), 8)
        for n in args.loops:
            task = f"scale-{n}"
            driver.start_loops(task, env_spec(task, args.env_turns), n)
            gen.gaps.clear()
            gen.ended.clear()
            spy = None
            if args.profile and shutil.which("py-spy", path=str(Path(sys.executable).parent)):
                args.profile.mkdir(parents=True, exist_ok=True)
                spy = subprocess.Popen(
                    [str(Path(sys.executable).parent / "py-spy"), "record", "--pid", str(em_proc.pid), "--rate",
                     "200", "--format", "raw", "--nonblocking", "-o", str(args.profile / f"envmanager-{n}.txt")],
                    stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                )  # fmt: skip
            others = {p.name: p.pid for p in cluster.procs if p.name != "envmanager"}
            others["redis"] = cluster.redis.pid
            others["bench (generator)"] = os.getpid()
            pids = {"envmanager": em_proc.pid, **others}
            used = dict.fromkeys(pids, 0.0)  # CPU seconds during the measured rollouts only
            seconds = 0.0
            t0 = time.monotonic()
            repeats = 0
            # Small N: several rollouts, so that every point measures at least --env-min-turns turns (CPU is
            # counted in 10 ms ticks).
            while True:
                before = {k: cpu_seconds(pid) for k, pid in pids.items()}
                seconds += driver.rollout(task, n // 8, 8, 0, seed=n + repeats)
                for k, pid in pids.items():
                    used[k] += cpu_seconds(pid) - before[k]
                repeats += 1
                if repeats * n * args.env_turns >= args.env_min_turns:
                    break
                driver.stop_loops(task)
                task = f"scale-{n}-r{repeats}"
                driver.start_loops(task, env_spec(task, args.env_turns), n)
            cpu = used["envmanager"]
            # The other processes of the chain: which one bounds turns/s when the envmanager does not.
            others_util = {k: used[k] / seconds for k in others}
            if spy is not None:
                spy.send_signal(2)  # SIGINT: py-spy writes what it sampled
                spy.wait(30)
            counts = driver.stop_loops(task)
            turns = n * args.env_turns * repeats
            row = {
                "component": "envmanager",
                "dimension": "concurrent loops",
                "n": n,
                "ops_per_second": turns / seconds,
                "p50_ms": pct(gen.gaps, 50) * 1e3,
                "p99_ms": pct(gen.gaps, 99) * 1e3,
                "cpu_ms_per_op": cpu / turns * 1e3,
                "step_s": seconds,
                "turns": turns,
                "envmanager_cpu_util": cpu / seconds,
                "rollouts": repeats,
                "wall_s": time.monotonic() - t0,
                "failures": counts["failures"],
                "cpu_util_of": {"envmanager": cpu / seconds, **others_util},
                "load_avg": os.getloadavg()[0],
            }
            out.append(row)
            print(
                f"envmanager N={n}: {row['ops_per_second']:.0f} turns/s, {row['cpu_ms_per_op']:.3f} CPU ms/turn, "
                f"turn gap p50 {row['p50_ms']:.1f} ms p99 {row['p99_ms']:.1f} ms, step {seconds:.1f} s, "
                f"{counts} (load {row['load_avg']:.1f}); CPU utilisation "
                + ", ".join(f"{k} {v:.2f}" for k, v in row["cpu_util_of"].items()),
                flush=True,
            )
            if args.profile and (args.profile / f"envmanager-{n}.txt").exists():
                from bench.control.control_scale import profile_summary

                print(profile_summary(args.profile / f"envmanager-{n}.txt"))
    finally:
        driver.close()
        cluster.stop()
        server.stop()
    return out
