"""Redundant rollouts: rollout time for GRPO groups of 8 with 0, 1, 2 and 4 extra members, under straggling
environments.

    .venv/bin/python -m bench redundant                  # 8 groups of 8, lognormal steps (mean 0.5 s, cv 1)
    .venv/bin/python -m bench redundant --extras 0,2 --repeats 2

Real rollart-ledger, rollart-reward and rollart-envmanager processes. Each prompt is a group of 8 samples plus R
extra leases (the ledger's redundancy); one environment loop per lease runs a fixed-turns environment whose
every step sleeps a heavy-tailed latency (lognormal, the loops' latency injection); generation is a fixed-latency
server in this process. When a group has its 8 admitted samples the ledger cancels its other leases and the
envmanager aborts those trajectories at once (the stragglers). Rollout time = AddPrompts until every group is
complete and scored in the ledger (GetBatch). Speed-up = rollout time without extras / with R extras; every
repeat uses new latency draws, shared by all R of that repeat (streams seeded per loop index).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
from pathlib import Path

from bench._support.envmanager_harness import Cluster, Driver, FixedLatencyGenerator, GeneratorThread, machine
from bench.rollout.env_interaction import duration
from rollart.v1 import common_pb2 as c
from rollart.v1 import envmanager_pb2 as em

REFERENCE = 1.62  # RollArt: up to 1.62x


def spec(task: str, turns: int, mean: float, std: float, seed: int) -> em.EnvironmentSpec:
    latency = em.LatencyDistribution(kind=em.DISTRIBUTION_KIND_LOGNORMAL, mean=duration(mean),
                                     stddev=duration(std), seed=seed)
    return em.EnvironmentSpec(environment="bench:fixed-turns", task=task, options={"turns": str(turns)},
                              sampling=c.SamplingParams(max_tokens=32), latency=latency,
                              reward=c.RewardSpec(kind=c.SCORER_KIND_GAME))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--groups", type=int, default=8)
    ap.add_argument("--group-size", type=int, default=8)
    ap.add_argument("--extras", default="0,1,2,4")
    ap.add_argument("--turns", type=int, default=3)
    ap.add_argument("--mean", type=float, default=0.5, help="mean environment latency per turn, seconds")
    ap.add_argument("--cv", type=float, default=1.0, help="sigma/mu of the per-turn latency (lognormal)")
    ap.add_argument("--gen", type=float, default=0.1, help="generation latency per turn, seconds")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--seed", type=int, default=11)
    ap.add_argument("--json", help="also write the raw measurements here")
    args = ap.parse_args()
    extras = [int(x) for x in args.extras.split(",")]

    print(f"machine: {machine()}", file=sys.stderr)
    server = GeneratorThread(FixedLatencyGenerator(args.gen))
    rows: dict[int, list[dict]] = {r: [] for r in extras}
    with tempfile.TemporaryDirectory(prefix="bench-redundant-") as tmp:
        cluster = Cluster(Path(tmp), server.address)
        driver = Driver(cluster)
        try:
            driver.setup()
            driver.warm_up(spec("warm-up", args.turns, args.mean, args.mean, args.seed), args.group_size)
            for rep in range(args.repeats):
                seed = args.seed + 1000 * rep
                for extra in extras if rep % 2 == 0 else extras[::-1]:
                    task = f"r{extra}-rep{rep}"
                    loops = args.groups * (args.group_size + extra)
                    driver.start_loops(task, spec(task, args.turns, args.mean, args.cv * args.mean, seed), loops)
                    t = driver.rollout(task, args.groups, args.group_size, extra, seed)
                    counts = driver.stop_loops(task)
                    rows[extra].append({"rollout": t, **counts})
                    print(f"  repeat {rep} extra {extra}: rollout {t:6.2f}s  {counts}", file=sys.stderr)
        finally:
            driver.close()
            cluster.stop()
            server.stop()

    base = statistics.median(r["rollout"] for r in rows[extras[0]]) if extras[0] == 0 else None
    print(f"\n{args.groups} groups of {args.group_size}, {args.turns} turns, env latency lognormal(mean "
          f"{args.mean:g} s, sigma/mu {args.cv:g}) per turn, generation {args.gen:g} s per turn, "
          f"{args.repeats} repeat(s), medians\n")
    print("| extra members | leases | rollout s | speed-up vs 0 | stragglers cut (cancelled + late) | RollArt reference |")
    print("|---:|---:|---:|---:|---:|---:|")
    for extra in extras:
        t = statistics.median(r["rollout"] for r in rows[extra])
        cancelled = statistics.median(r["cancelled"] + r["rejected"] for r in rows[extra])
        speed = f"{base / t:.2f}x" if base else ""
        ref = f"up to {REFERENCE:.2f}x" if extra == max(extras) else ""
        print(f"| {extra} | {args.groups * (args.group_size + extra)} | {t:.2f} | {speed} | {cancelled:g} | {ref} |")
    if args.json:
        Path(args.json).write_text(json.dumps({"args": vars(args), "rows": {str(k): v for k, v in rows.items()}},
                                              indent=2))


if __name__ == "__main__":
    main()
