"""Two LoRA jobs on one fleet (issue 29): each job alone on one actor, then both sharing the actors.

    python -m bench lora-fleet --json bench/results/lora-fleet.json

Rows (``config``): ``solo-a`` (examples/frozenlake-lora.yaml, one actor), ``solo-b`` (examples/two-jobs-lora.yaml,
one actor), then ``shared-a`` and ``shared-b``: job A runs on two actors, job B joins it with ``rollart run
--fleet`` (its adapter attached to both actors, its turns routed by job), for ``--steps`` steps each; ``shared1-a``
and ``shared1-b`` are the same on one actor (the hardware of a solo row: on a machine whose actors share its cores,
a second actor is no second engine's worth of compute). Each row: ``actors`` (as started: the run's summary),
``samples_per_second`` (the job's trained samples over its steps' time, steps 3..N, median step), ``step_seconds``,
``reward_first``/``reward_last`` (means of the first and last third of the steps); shared rows add ``shared_ratio``
= their samples/s over the same job's solo row (target: at least 0.8 with two actors) and ``overlap_steps`` (the
job's steps that ran while the other job was stepping too; only those count in a shared row's figures).

Every process of a row shares this machine's cores: the shared rows run two trainers, two envmanagers and two
relays beside the actors, against one of each in a solo row. ``--pin`` gives actor i core i alone (taskset, the
pools' ``cpus``; every other process floats): two actors then have a core each, as actors on their own hardware
would, instead of two engines contending for both cores. Runs go through ``rollart run`` (real services); the base
model is built once (``--out``/model) for every row. ``--shares 3:1 --slots 8`` sets the LLMProxy's job shares (A's
weight, then B's) and fleet turn slots in the shared rows; each shared row has ``fleet_fraction``, its job's share
of the two jobs' samples/s.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
RUN = [str(Path(sys.executable).parent / "rollart"), "run"]  # the venv's entry point
JOB_A, JOB_B = ROOT / "examples" / "frozenlake-lora.yaml", ROOT / "examples" / "two-jobs-lora.yaml"
JOB_B_ID = "frozenlake-lora-b"  # two-jobs-lora.yaml's job.job_id


def steps_of(out: Path) -> list[dict[str, Any]]:
    path = out / "metrics.jsonl"
    if not path.is_file():
        return []
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return sorted((r for r in rows if r.get("kind") != "validation" and "step" in r), key=lambda r: r["step"])


def figures(records: list[dict[str, Any]]) -> dict[str, Any]:
    """samples/s (median step, steps 3..N), step seconds, reward of the first and last third."""
    use = [r for r in records if r["step"] >= 3] or records
    if not use:
        return {"steps": 0, "samples_per_second": None, "step_seconds": None}
    step_s = statistics.median(float(r["step_seconds"]) for r in use)
    samples = statistics.median(float(r.get("samples") or 0) for r in use)
    third = max(1, len(records) // 3)
    return {
        "steps": len(records),
        "step_seconds": step_s,
        "samples_per_second": samples / step_s if step_s > 0 else None,
        "reward_first": statistics.fmean(float(r["reward_mean"]) for r in records[:third]),
        "reward_last": statistics.fmean(float(r["reward_mean"]) for r in records[-third:]),
    }


def overlapping(mine: list[dict[str, Any]], other: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """My steps that ran entirely while the other job was stepping (between its first start and last end)."""
    if not other:
        return []
    lo, hi = min(r["started_at"] for r in other), max(r["finished_at"] for r in other)
    return [r for r in mine if r["started_at"] >= lo and r["finished_at"] <= hi]


def run_job(job: Path, out: Path, steps: int, extra: list[str], log: Path) -> subprocess.Popen:
    shutil.rmtree(out, ignore_errors=True)  # an earlier run's metrics would look like this one's first step
    model = out.parent / "model"  # one build (cached by recipe) for every row
    argv = [*RUN, str(job), "--out", str(out), "--quiet", "--set", f"job.max_steps={steps}", "--set",
            f"model.dir={model}", *extra]  # fmt: skip
    return subprocess.Popen(argv, stdout=log.open("w"), stderr=subprocess.STDOUT, cwd=ROOT)


def actors_started(out: Path) -> int | None:
    """The actors the run really started (its summary's process groups), not the ones asked for."""
    path = out / "summary.json"
    if not path.is_file():
        return None
    groups = json.loads(path.read_text()).get("process_groups") or {}
    return sum(1 for name in groups if name == "actor" or name.startswith("actor-"))


def wait_for_step(out: Path, step: int, proc: subprocess.Popen, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not any(r["step"] >= step for r in steps_of(out)):
        if proc.poll() is not None:
            raise SystemExit(f"lora-fleet: the fleet run ended (exit {proc.returncode}) before step {step}: {out}")
        if time.monotonic() > deadline:
            raise SystemExit(f"lora-fleet: the fleet run did not reach step {step} in {timeout:.0f}s")
        time.sleep(1.0)


def actors_args(n: int, pin: bool) -> list[str]:
    if not pin:
        return ["--actors", str(n)]
    cores = ", ".join(f'"{i}"' for i in range(n))
    return ["--set", f"cluster.actors=[{{count: {n}, cpus: [{cores}]}}]"]


def shares_args(shares: str, slots: int) -> list[str]:
    """The LLMProxy's shares for the fleet's owner (A, the turns naming no job) and job B."""
    if not shares:
        return []
    a, b = (float(w) for w in shares.split(":"))
    weights = json.dumps({"": a, JOB_B_ID: b})
    return ["--set", f"cluster.env.llmproxy={{ROLLART_FLEET_TURN_SLOTS: '{slots}', ROLLART_JOB_SHARES: '{weights}'}}"]


def shared_rows(root: Path, config: str, actors: int, steps: int, pin: bool, shares: list[str]) -> list[dict[str, Any]]:
    """Job A owns ``actors`` actors for longer than B needs (B's steps all run beside A's); B joins with --fleet."""
    out_a, out_b = root / f"{config}-a", root / f"{config}-b"
    fleet = run_job(JOB_A, out_a, steps * 3, actors_args(actors, pin) + shares, root / f"{config}-a.log")
    try:
        wait_for_step(out_a, 1, fleet, 900.0)
        t0 = time.time()
        code_b = run_job(JOB_B, out_b, steps, ["--fleet", str(out_a)], root / f"{config}-b.log").wait()
        wall_b = time.time() - t0
    finally:
        fleet.send_signal(2)  # SIGINT: A stops cleanly (its figures are those of the steps beside B)
        code_a = fleet.wait(timeout=300)
    ra, rb = steps_of(out_a), steps_of(out_b)
    rows = []
    for job, mine, other, code in (("a", ra, rb, code_a), ("b", rb, ra, code_b)):
        beside = overlapping(mine, other)
        row = {"config": f"{config}-{job}", "actors": actors_started(out_a), "pinned": pin, "exit": code,
               "overlap_steps": len(beside), **figures(beside)}  # fmt: skip
        if job == "b":
            row["wall_seconds"] = wall_b
        rows.append(row)
    total = sum(r.get("samples_per_second") or 0.0 for r in rows)
    for row in rows:
        row["fleet_fraction"] = (row.get("samples_per_second") or 0.0) / total if total else None
        print(json.dumps(row), flush=True)
    return rows


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench lora-fleet", description=__doc__.split("\n\n")[0])
    ap.add_argument("--steps", type=int, default=12, help="steps of each job in each row")
    ap.add_argument("--out", type=Path, default=ROOT / "bench" / "out" / "lora-fleet")
    ap.add_argument("--configs", default="solo,shared,shared1", help="any of solo, shared (2 actors), shared1")
    ap.add_argument("--json", type=Path, help="write the rows (one object each) to this file")
    ap.add_argument("--pin", action="store_true", help="actor i on core i alone (taskset)")
    ap.add_argument("--shares", default="", help="A:B job weights in the LLMProxy (with --slots), e.g. 3:1")
    ap.add_argument("--slots", type=int, default=8, help="the LLMProxy's fleet_turn_slots with --shares")
    a = ap.parse_args(argv)
    a.out.mkdir(parents=True, exist_ok=True)
    rows: list[dict[str, Any]] = []
    configs = a.configs.split(",")
    if "solo" in configs:
        for name, job in (("solo-a", JOB_A), ("solo-b", JOB_B)):
            out = a.out / name
            t0 = time.time()
            code = run_job(job, out, a.steps, actors_args(1, a.pin), a.out / f"{name}.log").wait()
            rows.append({"config": name, "actors": actors_started(out), "pinned": a.pin, "exit": code,
                         "wall_seconds": time.time() - t0,
                         **figures(steps_of(out))})  # fmt: skip
            print(json.dumps(rows[-1]), flush=True)
    for config, n in (("shared", 2), ("shared1", 1)):
        if config in configs:
            rows += shared_rows(a.out, config, n, a.steps, a.pin, shares_args(a.shares, a.slots))
    solo = {r["config"].removeprefix("solo-"): r for r in rows if r["config"].startswith("solo-")}
    for r in rows:
        job = r["config"].rsplit("-", 1)[-1]
        if r["config"].startswith("shared") and job in solo and solo[job].get("samples_per_second"):
            mine = r.get("samples_per_second")
            r["shared_ratio"] = mine / solo[job]["samples_per_second"] if mine else None
    cols = ["config", "actors", "steps", "samples_per_second", "step_seconds", "reward_first", "reward_last",
            "shared_ratio"]  # fmt: skip
    print("  ".join(f"{c:>18}" for c in cols))
    for r in rows:
        cells = [r.get(c) for c in cols]
        print(
            "  ".join(
                f"{(f'{v:.3f}' if isinstance(v, float) else str(v if v is not None else '-')):>18}" for v in cells
            )
        )
    if a.json:
        a.json.parent.mkdir(parents=True, exist_ok=True)
        a.json.write_text(json.dumps(rows, indent=1) + "\n")
        print(a.json)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
