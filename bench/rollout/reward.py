"""Reward overlap: step time with rewards computed as trajectories finish vs after the whole batch.

    python -m bench reward                         # B=64, completion ~ lognormal(mean 4 s, sigma/mu 0.5)
    python -m bench reward --batch 128 --repeats 3 --workers 2

Starts a real reward service (``rollart-reward``, with its own elastic pool of ``--workers`` worker processes),
simulates rollout batches whose trajectories finish at times drawn from a lognormal distribution, and scores
real math answers through the service's ScoreMany stream with math-verify (the gold answer is a product of
linear factors, the answer its expansion in LaTeX, a quarter of them with a coefficient changed: real sympy
equivalence checks, ~0.1-0.2 s each on this machine).

- batch:   wait until the whole batch has finished, then stream it to the reward service (reward after rollout);
- overlap: stream each trajectory to the reward service the moment it finishes (RollArt's EnvManager);
- overlap, cold pool: as overlap, but the pool starts the step scaled to zero (workers start on demand).

Step time runs from the start of the batch to the last reward; "tail" is the part after the last trajectory
finished. The same completion times are used for every mode of a repeat; modes alternate order across repeats; every step
scores freshly generated problems (math-verify and sympy cache what they parsed before).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path

import grpc
import numpy as np

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "libs"))

from rollart.local.processes import ManagedProcess  # noqa: E402
from rollart.v1 import common_pb2 as c  # noqa: E402
from rollart.v1 import reward_pb2 as r  # noqa: E402
from rollart.v1 import reward_pb2_grpc  # noqa: E402

TOKEN = "bench-reward-token-0123456789"


def problems(n: int, seed: int) -> list[tuple[str, str, bool]]:
    """(gold, answer, answer_is_right): a product of 3-4 linear factors and its expansion."""
    import sympy as sp

    x = sp.Symbol("x")
    rng = np.random.default_rng(seed)
    out = []
    for i in range(n):
        roots = [int(v) for v in rng.integers(-9, 10, size=3 + i % 2)]
        gold = "".join(f"(x{v:+d})" for v in roots)
        expanded = sp.expand(sp.prod([x + v for v in roots]))
        right = i % 4 != 3
        if not right:
            expanded += 1  # a wrong constant term
        out.append((f"${gold}$", f"Expanding the product gives \\boxed{{{sp.latex(expanded)}}}.", right))
    return out


def start_service(tmp: Path, workers: int) -> tuple[ManagedProcess, str]:
    ready = tmp / "reward.ready"
    env = {k: v for k, v in os.environ.items() if not k.startswith("ROLLART_")}
    env.update(
        ROLLART_LISTEN="127.0.0.1:0",
        ROLLART_METRICS_LISTEN="127.0.0.1:0",
        ROLLART_JOB_TOKEN=TOKEN,
        ROLLART_READY_FILE=str(ready),
        ROLLART_LOG_LEVEL="INFO",
        ROLLART_POOL__MAX_WORKERS=str(workers),
        ROLLART_POOL__MIN_WORKERS=str(workers),
        ROLLART_POOL__IDLE_TIMEOUT_SECONDS="1",
    )
    proc = ManagedProcess(
        "reward",
        [str(Path(sys.executable).parent / "rollart-reward")],
        log_path=tmp / "reward.log",
        env=env,
        ready_file=ready,
    ).start()
    return proc, proc.wait_ready(60)["address"]


def set_pool(stub, md, min_workers: int, max_workers: int) -> None:
    stub.ConfigurePool(r.ConfigureRewardPoolRequest(min_workers=min_workers, max_workers=max_workers), metadata=md)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        st = stub.GetPoolStatus(r.RewardPoolStatusRequest(), metadata=md)
        idle = sum(w.state == r.REWARD_WORKER_STATE_IDLE for w in st.workers)
        if len(st.workers) == min_workers and idle == min_workers:
            return
        time.sleep(0.05)
    raise RuntimeError(f"pool did not settle at {min_workers} workers")


def run_step(stub, md, finish: np.ndarray, items, overlap: bool, tag: str) -> dict:
    """One rollout batch; returns step time, tail, rewards and statuses."""
    order = np.argsort(finish)
    t0 = time.monotonic()

    def requests():
        if not overlap:
            time.sleep(max(0.0, t0 + float(finish.max()) - time.monotonic()))
        for i in order:
            if overlap:
                time.sleep(max(0.0, t0 + float(finish[i]) - time.monotonic()))
            gold, answer, _ = items[i]
            yield r.ScoreRequest(
                trajectory=c.Trajectory(
                    trajectory_id=f"{tag}-{i}",
                    task="math",
                    turns=[c.Turn(observation="Expand the product.", action=answer)],
                    metadata={"answer": gold},
                    status=c.TRAJECTORY_STATUS_OK,
                )
            )

    results = {}
    for res in stub.ScoreMany(requests(), metadata=md, timeout=600):
        results[res.trajectory_id] = res
    end = time.monotonic() - t0
    ok = sum(res.status == r.SCORE_STATUS_OK for res in results.values())
    right = sum(
        results[f"{tag}-{i}"].status == r.SCORE_STATUS_OK
        and results[f"{tag}-{i}"].outcome.reward == (1.0 if items[i][2] else 0.0)
        for i in range(len(items))
    )
    causes = sorted({res.cause for res in results.values() if res.status != r.SCORE_STATUS_OK})
    return {
        "step": end,
        "tail": end - float(finish.max()),
        "ok": ok,
        "correct_rewards": right,
        "not_ok_causes": causes,
        "max_queue": max(res.queue_time.ToNanoseconds() / 1e9 for res in results.values()),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--mean", type=float, default=4.0, help="mean trajectory completion time, seconds")
    ap.add_argument("--cv", type=float, default=0.5, help="sigma/mu of the completion times")
    ap.add_argument("--workers", type=int, default=max(1, os.cpu_count() or 1))
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", help="also write the raw measurements here")
    ap.add_argument("--log-dir", help="keep the reward service's log here (worker start and stop times)")
    args = ap.parse_args()

    rng = np.random.default_rng(args.seed)
    sigma = float(np.sqrt(np.log(1 + args.cv**2)))
    mu = float(np.log(args.mean) - sigma**2 / 2)
    # Fresh problems for every step: math-verify and sympy cache what they parsed, and a step that re-scored
    # the previous step's answers would look cheaper than it is.
    step_seeds = iter(range(args.seed * 100_000 + 1, args.seed * 100_000 + 100_000))
    md = [("authorization", f"Bearer {TOKEN}")]
    modes = ["batch", "overlap"]
    rows: dict[str, list[dict]] = {"batch": [], "overlap": [], "overlap-cold": []}
    with tempfile.TemporaryDirectory(prefix="bench-reward-") as tmp_:
        tmp = args.log_dir or tmp_
        Path(tmp).mkdir(parents=True, exist_ok=True)
        proc, address = start_service(Path(tmp), args.workers)
        try:
            with grpc.insecure_channel(address) as ch:
                stub = reward_pb2_grpc.RewardStub(ch)
                set_pool(stub, md, args.workers, args.workers)
                # Warm-up: every worker runs a few comparisons once.
                warm = problems(2 * args.workers, next(step_seeds))
                run_step(stub, md, np.zeros(len(warm)), warm, False, f"warm-{uuid.uuid4().hex[:6]}")
                for rep in range(args.repeats):
                    finish = rng.lognormal(mu, sigma, size=args.batch)
                    for mode in modes if rep % 2 == 0 else modes[::-1]:
                        items = problems(args.batch, next(step_seeds))
                        res = run_step(
                            stub, md, finish, items, mode == "overlap", f"{mode}-{rep}-{uuid.uuid4().hex[:6]}"
                        )
                        rows[mode].append({**res, "rollout": float(finish.max())})
                        print(
                            f"  repeat {rep} {mode:<8} step {res['step']:.2f}s tail {res['tail']:.2f}s {res['not_ok_causes']}",
                            file=sys.stderr,
                        )
                    # Cold pool: scaled to zero at the start of the step, workers start as trajectories finish.
                    set_pool(stub, md, 0, args.workers)
                    items = problems(args.batch, next(step_seeds))
                    res = run_step(stub, md, finish, items, True, f"cold-{rep}-{uuid.uuid4().hex[:6]}")
                    rows["overlap-cold"].append({**res, "rollout": float(finish.max())})
                    print(
                        f"  repeat {rep} cold     step {res['step']:.2f}s tail {res['tail']:.2f}s {res['not_ok_causes']}",
                        file=sys.stderr,
                    )
                    set_pool(stub, md, args.workers, args.workers)
        finally:
            proc.stop()

    base = statistics.median(x["step"] for x in rows["batch"])
    print(
        f"\nReward overlap: B={args.batch}, completion ~ lognormal(mean {args.mean}s, sigma/mu {args.cv}), "
        f"{args.workers} reward workers, {args.repeats} repeats (medians), math-verify on real answers"
    )
    print(
        f"{'mode':<34}{'step s':>9}{'rollout s':>11}{'reward tail s':>15}{'speed-up':>10}{'scored OK':>11}{'right':>8}"
    )
    labels = {
        "batch": "reward after the whole batch",
        "overlap": "reward as trajectories finish",
        "overlap-cold": "  same, pool scaled from zero",
    }
    for mode, label in labels.items():
        xs = rows[mode]
        step = statistics.median(x["step"] for x in xs)
        print(
            f"{label:<34}{step:>9.2f}{statistics.median(x['rollout'] for x in xs):>11.2f}"
            f"{statistics.median(x['tail'] for x in xs):>15.2f}{base / step:>9.2f}x"
            f"{min(x['ok'] for x in xs):>7}/{args.batch}{min(x['correct_rewards'] for x in xs):>5}/{args.batch}"
        )
    print("(scored OK: fewest OK statuses over the repeats; right: fewest rewards equal to the known truth;")
    print(" a TIMEOUT/FAILED result is counted as not OK and not right, never as a zero reward)")
    print(f"\nmachine: {platform.machine()}, {os.cpu_count()} CPUs, Python {platform.python_version()}")
    if args.json:
        Path(args.json).write_text(json.dumps({"args": vars(args), "rows": rows}, indent=2))


if __name__ == "__main__":
    main()
