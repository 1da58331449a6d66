"""The FrozenLake job with its regions apart (examples/geo.yaml) against the same job in one region: samples/s,
step time and weight transfer exposed per step, one row per mode.

Each row is a real `rollart run` of examples/geo.yaml for ``--steps`` steps: ``ideal`` with ``cluster.regions``
removed (one loopback region, no link), ``rollart`` as the file says (deltas through the relay across the
emulated link; ``--rate-mbps`` overrides the link's rate both ways). Medians over steps 3..N:
``step_seconds``; ``samples_per_second`` = batch size / step_seconds; ``transfer_exposed_seconds`` = the step's
update phase (the trainer waits for the actors to stage and commit the new version: what the weight transfer
adds to the step). The full-checkpoint baselines are not rows: ``weight_sync: full_checkpoint`` loads
checkpoints from the shared file system here, not through the link (docs/regions.md).

    python -m bench geo --steps 6 --json bench/results/geo-smoke.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parents[2]
JOB = REPO / "examples" / "geo.yaml"


def medians(metrics: Path, first: int = 3) -> dict[str, float]:
    rows = [json.loads(line) for line in metrics.read_text().splitlines() if line.strip()]
    steps = [r for r in rows if "step_seconds" in r and r.get("kind", "step") == "step"]
    late = [r for r in steps if r["step"] >= first] or steps
    if not late:
        raise RuntimeError(f"no step in {metrics}")
    return {
        "steps": len(steps),
        "step_seconds": statistics.median(r["step_seconds"] for r in late),
        "get_batch_seconds": statistics.median(r.get("get_batch_seconds", 0.0) for r in late),
        "train_seconds": statistics.median(r.get("train_seconds", 0.0) for r in late),
        "transfer_exposed_seconds": statistics.median(r.get("update_seconds", 0.0) for r in late),
    }


def run_mode(
    config: str, out: Path, steps: int, model_dir: str | None, rate_mbps: float | None, timeout: float
) -> dict[str, Any]:
    sets = [f"job.max_steps={steps}", "eval.every=0", "eval.at_start=false"]
    if model_dir:
        sets.append(f"model.dir={model_dir}")
    job = yaml.safe_load(JOB.read_text())
    links = job["cluster"]["regions"]["links"]
    link_mbps: float | None = min(float(v["rate_mbps"]) for v in links.values())
    if config == "ideal":
        sets.append("cluster.regions=null")
        link_mbps = None
    elif rate_mbps:
        sets += [f"cluster.regions.links.{k}.rate_mbps={rate_mbps}" for k in links]
        link_mbps = rate_mbps
    argv = [str(Path(sys.executable).parent / "rollart"), "run", str(JOB), "--out", str(out), "--quiet"]
    argv += ["--timeout", str(timeout)]
    for s in sets:
        argv += ["--set", s]
    t0 = time.monotonic()
    proc = subprocess.run(argv, capture_output=True, text=True)
    wall = time.monotonic() - t0
    summary = json.loads((out / "summary.json").read_text()) if (out / "summary.json").exists() else {}
    metrics = out / "metrics.jsonl"
    if not metrics.exists() or summary.get("steps", 0) < 1:
        raise RuntimeError(f"{config}: rollart run exited {proc.returncode}:\n{proc.stderr[-3000:]}")
    m = medians(metrics)  # a run stopped by --timeout still gives the steps it made (its state says so)
    batch = int(job["job"]["batch_size"])
    row: dict[str, Any] = {
        "config": config,
        "link_mbps": link_mbps,
        "samples_per_second": batch / m["step_seconds"],
        "step_seconds": m["step_seconds"],
        "transfer_exposed_seconds": m["transfer_exposed_seconds"],
        "generation_seconds": m["get_batch_seconds"],
        "train_seconds": m["train_seconds"],
        "steps": m["steps"],
        "wall_seconds": wall,
        "reward_last10": summary.get("reward_last10"),
        "state": summary.get("state"),
    }
    links_seen = summary.get("links")
    if links_seen:
        row["link_bytes"] = {k: v["bytes"] for k, v in links_seen["links"].items()}
        row["forwarder_bytes"] = {
            k: {"up": v["bytes_up"], "down": v["bytes_down"]}
            for k, v in links_seen["forwarders"].items()
            if v["bytes_up"] or v["bytes_down"]
        }
    return row


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench geo", description=__doc__.split("\n\n")[0])
    ap.add_argument("--steps", type=int, default=6, help="steps per run (medians over steps 3..N)")
    ap.add_argument("--configs", default="ideal,rollart", help="rows to run, comma-separated: ideal, rollart")
    ap.add_argument("--rate-mbps", type=float, help="the link's rate both ways (default: examples/geo.yaml's)")
    ap.add_argument("--model-dir", help="model.dir for every run (a built warm start is reused by recipe)")
    ap.add_argument("--timeout", type=float, default=600.0, help="seconds per run before it is stopped")
    ap.add_argument("--out", type=Path, default=Path("runs/bench-geo"), help="run folders (one per config)")
    ap.add_argument("--json", type=Path, help="write the rows here")
    a = ap.parse_args(argv)
    rows = []
    for config in a.configs.split(","):
        if config not in ("ideal", "rollart"):
            ap.error(f"--configs: unknown config {config!r} (ideal, rollart)")
        row = run_mode(config, a.out.resolve() / config, a.steps, a.model_dir, a.rate_mbps, a.timeout)
        print(json.dumps(row), flush=True)
        rows.append(row)
    if a.json:
        a.json.parent.mkdir(parents=True, exist_ok=True)
        a.json.write_text(json.dumps(rows, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
