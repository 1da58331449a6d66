"""Trajectory-level vs batch-level environment interaction, with per-turn environment latency ~ N(mu, sigma).

    .venv/bin/python -m bench env-interaction                      # B=64, 5 turns, mu=0.5 s, gen 0.2 s
    .venv/bin/python -m bench env-interaction --cvs 0.1,0.5,1.0 --repeats 1

Real rollart-ledger, rollart-reward and rollart-envmanager processes; B environment loops (one per trajectory)
run a fixed-turns environment whose every step sleeps a latency drawn from N(mu, sigma) (clipped at 0, the
loop's latency injection); generation is a fixed-latency server in this process (``--gen`` s per turn).

- trajectory-level (RollArt): every loop goes on with its next generation as soon as its own step finished;
- batch-level (the baseline): the generation server holds turn k of every trajectory until all B environments
  have finished turn k-1 (every environment waits for all before the next generation).

Same batch, same run: both modes draw the same latencies (the loops' latency streams are seeded per loop
index), and alternate order across repeats. Step time = AddPrompts until the ledger holds the B trajectories
admitted and scored (GetBatch). "model" columns are the ideal times from the same draws
(batch: sum over turns of the slowest step, plus generation; trajectory: the slowest sum), with no overheads.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
from pathlib import Path

from bench._support.envmanager_harness import (
    Cluster,
    Driver,
    FixedLatencyGenerator,
    GeneratorThread,
    machine,
)
from rollart.v1 import common_pb2 as c
from rollart.v1 import envmanager_pb2 as em
from rollart_envmanager.latency import LatencySpec

REFERENCE = {0.1: 1.23, 1.0: 2.27}  # RollArt's reported step-time ratios at the ends of the range


def duration(seconds: float):
    from google.protobuf.duration_pb2 import Duration

    d = Duration()
    d.FromNanoseconds(int(seconds * 1e9))
    return d


def spec(task: str, turns: int, mu: float, sigma: float, seed: int) -> em.EnvironmentSpec:
    latency = em.LatencyDistribution(kind=em.DISTRIBUTION_KIND_NORMAL, mean=duration(mu), stddev=duration(sigma),
                                     seed=seed)
    return em.EnvironmentSpec(environment="bench:fixed-turns", task=task, options={"turns": str(turns)},
                              sampling=c.SamplingParams(max_tokens=32), latency=latency,
                              reward=c.RewardSpec(kind=c.SCORER_KIND_GAME))


def model(batch: int, turns: int, mu: float, sigma: float, seed: int, gen: float) -> tuple[float, float]:
    """Ideal (batch-level, trajectory-level) step times from the very draws the loops make."""
    s = LatencySpec("normal", mean=mu, stddev=sigma, seed=seed)
    draws = []
    for i in range(batch):
        sampler = s.sampler(str(i))
        draws.append([sampler.sample() for _ in range(turns)])
    batch_level = sum(max(d[t] for d in draws) + gen for t in range(turns))
    traj_level = max(sum(d) + gen * turns for d in draws)
    return batch_level, traj_level


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--batch", type=int, default=64, help="trajectories per step (B)")
    ap.add_argument("--group-size", type=int, default=8)
    ap.add_argument("--turns", type=int, default=5)
    ap.add_argument("--mu", type=float, default=0.5, help="mean environment latency per turn, seconds")
    ap.add_argument("--gen", type=float, default=0.2, help="generation latency per turn, seconds")
    ap.add_argument("--cvs", default="0.1,0.25,0.5,0.75,1.0", help="sigma/mu values")
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--json", help="also write the raw measurements here")
    args = ap.parse_args()
    cvs = [float(x) for x in args.cvs.split(",")]
    if args.batch % args.group_size:
        sys.exit("--batch must be a multiple of --group-size")

    print(f"machine: {machine()}", file=sys.stderr)
    gen = FixedLatencyGenerator(args.gen)
    server = GeneratorThread(gen)
    rows: dict[float, dict[str, list[float]]] = {cv: {"trajectory": [], "batch": []} for cv in cvs}
    models: dict[float, list[tuple[float, float]]] = {cv: [] for cv in cvs}
    with tempfile.TemporaryDirectory(prefix="bench-envint-") as tmp:
        cluster = Cluster(Path(tmp), server.address)
        driver = Driver(cluster)
        try:
            driver.setup()
            driver.warm_up(spec("warm-up", args.turns, args.mu, 0.0, args.seed), args.group_size)
            for rep in range(args.repeats):
                for cv in cvs:
                    seed = args.seed + 1000 * rep + int(cv * 100)
                    models[cv].append(model(args.batch, args.turns, args.mu, cv * args.mu, seed, args.gen))
                    modes = ["trajectory", "batch"] if rep % 2 == 0 else ["batch", "trajectory"]
                    for mode in modes:
                        task = f"{mode}-cv{cv:g}-r{rep}"
                        if mode == "batch":
                            gen.barrier[task] = args.batch
                        driver.start_loops(task, spec(task, args.turns, args.mu, cv * args.mu, seed), args.batch)
                        t = driver.rollout(task, args.batch // args.group_size, args.group_size, 0, seed)
                        counts = driver.stop_loops(task)
                        rows[cv][mode].append(t)
                        print(f"  repeat {rep} cv {cv:g} {mode:<10} step {t:6.2f}s  {counts}", file=sys.stderr)
        finally:
            driver.close()
            cluster.stop()
            server.stop()

    print(f"\nB={args.batch} trajectories (groups of {args.group_size}), {args.turns} turns, env latency "
          f"N({args.mu:g} s, sigma) per turn, generation {args.gen:g} s per turn, {args.repeats} repeat(s), medians\n")
    print("| sigma/mu | batch-level step s | trajectory-level step s | speed-up | model batch s | model traj s "
          "| model speed-up | RollArt reference |")
    print("|---:|---:|---:|---:|---:|---:|---:|---:|")
    for cv in cvs:
        b = statistics.median(rows[cv]["batch"])
        t = statistics.median(rows[cv]["trajectory"])
        mb = statistics.median(m[0] for m in models[cv])
        mt = statistics.median(m[1] for m in models[cv])
        ref = f"{REFERENCE[cv]:.2f}x" if cv in REFERENCE else ""
        print(f"| {cv:g} | {b:.2f} | {t:.2f} | {b / t:.2f}x | {mb:.2f} | {mt:.2f} | {mb / mt:.2f}x | {ref} |")
    if args.json:
        Path(args.json).write_text(json.dumps({"args": vars(args), "rows": {str(k): v for k, v in rows.items()},
                                               "model": {str(k): v for k, v in models.items()}}, indent=2))


if __name__ == "__main__":
    main()
