"""What a fault costs a real run: `rollart run` of the FrozenLake example (scaled down) with faults injected
(redis SIGKILL, envmanager SIGKILL, an actor hung by SIGSTOP) against unfaulted runs with the same seeds.

    python -m bench faults --json bench/out/faults.json                 # one run per fault + baselines, 3 each
    python -m bench faults --runs 1 --together                           # all faults in one run (the chaos test's)

Per fault: the extra wall time the run paid (its first-step-start to last-step-end time minus the unfaulted
runs' median) and the time from the fault to the next completed step; medians over ``--runs``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
from pathlib import Path

from tests.faults import chaos

DEFAULT = "redis@2,envmanager@4,hang-actor@6"


def parse(schedule: str) -> list[tuple[int, str]]:
    out = []
    for item in schedule.split(","):
        fault, _, step = item.partition("@")
        out.append((int(step), fault.strip()))
    return out


def one(tmp: Path, schedule: list[tuple[int, str]], steps: int, seed: int) -> dict:
    res = chaos.run(tmp, schedule, steps=steps, seed=seed)
    ok = res["code"] == 0 and len(res["records"]) == steps
    return {
        "ok": ok,
        "schedule": [f"{f}@{s}" for s, f in schedule],
        "steps_seconds": res["steps_seconds"],
        "wall_seconds": round(res["wall_seconds"], 1),
        "recovery": chaos.recovery(res),
        "events": res["summary"].get("events", []),
        "step_seconds": [round(r.get("step_seconds", 0.0), 2) for r in res["records"]],
    }


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench faults", description=__doc__.splitlines()[0])
    ap.add_argument("--faults", default=DEFAULT, help=f"FAULT@STEP,... (default {DEFAULT})")
    ap.add_argument("--together", action="store_true", help="all faults in one run (else one run per fault)")
    ap.add_argument("--runs", type=int, default=3, help="runs of each configuration (medians)")
    ap.add_argument("--steps", type=int, default=9)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", type=Path, help="write the figures here")
    args = ap.parse_args(argv)
    schedule = parse(args.faults)
    configs = [schedule] if args.together else [[x] for x in schedule]
    root = Path(tempfile.mkdtemp(prefix="bench-faults-"))
    baseline = [one(root / f"base-{i}", [], args.steps, args.seed) for i in range(args.runs)]
    base = statistics.median([b["steps_seconds"] for b in baseline if b["ok"]] or [float("nan")])
    results = []
    for cfg in configs:
        runs = [one(root / f"{'-'.join(f for _, f in cfg)}-{i}", cfg, args.steps, args.seed) for i in range(args.runs)]
        good = [r for r in runs if r["ok"]]
        entry = {
            "faults": [f"{f}@{s}" for s, f in cfg],
            "runs": len(runs),
            "completed": len(good),
            "extra_wall_seconds": round(statistics.median([r["steps_seconds"] for r in good]) - base, 1)
            if good
            else None,
            "to_next_step_seconds": {
                f: statistics.median(
                    [
                        x["to_next_step_seconds"]
                        for r in good
                        for x in r["recovery"]
                        if x["fault"] == f and x["to_next_step_seconds"] is not None
                    ]
                    or [float("nan")]
                )
                for _, f in cfg
            },
            "detail": runs,
        }
        results.append(entry)
    report = {
        "steps": args.steps,
        "seed": args.seed,
        "baseline_steps_seconds": base,
        "baseline": baseline,
        "faults": results,
    }
    print(f"baseline: {base:.1f} s for {args.steps} steps (median of {len(baseline)})")
    print("| faults | extra wall time (s) | fault -> next completed step (s) | runs completed |")
    print("|---|---|---|---|")
    for e in results:
        nxt = ", ".join(f"{k} {v:.1f}" for k, v in e["to_next_step_seconds"].items())
        print(f"| {', '.join(e['faults'])} | {e['extra_wall_seconds']} | {nxt} | {e['completed']}/{e['runs']} |")
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(report, indent=2, default=str) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
