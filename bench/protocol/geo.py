"""The FrozenLake job with its regions apart (examples/geo.yaml) against the same job in one region and against
full-weight broadcast through the same link: samples/s, step time and weight transfer exposed per step, one row
per mode, with ratios side by side.

Each row is a real `rollart run` of examples/geo.yaml for ``--steps`` steps:

- ``ideal``: ``cluster.regions`` removed (one loopback region, no link);
- ``rollart``: as the file says (sparse deltas through the relay across the emulated link);
- ``full-lag1/2/4``: ``weight_sync: full_checkpoint`` with ``alpha`` 1/2/4: every actor GETs the whole checkpoint
  of each version from the file server in the trainer's region, through the link (docs/regions.md).

``--rate-mbps`` overrides the link's rate both ways (rows then carry ``reference: false``). Medians over steps
3..N: ``step_seconds``; ``samples_per_second`` = batch size / step_seconds; ``transfer_exposed_seconds`` = the
step's update phase (the trainer waits for the actors to stage/load and commit the new version: what the weight
transfer adds to the step); ``generation_seconds``, ``train_seconds``. ``ratio_to_ideal`` = samples/s over the
ideal row's; ``rollart_speedup`` (on full rows) = the rollart row's samples/s over the row's.

The regime (the seed's ratio, issue 26): full weights take ~2.8x a step's generation window (16 GB at 1 Gbit/s =
128 s against 45 s). Here the tiny model's full weights are 1,052,984 bytes (bf16 safetensors) and a step's
generation window on this 2-core machine is ~5 s, so the link runs at 0.6 Mbit/s: 1,052,984 x 8 / 0.6e6 = 14.0 s
= 2.8 x 5 s. Each row also reports what it measured: ``full_bytes``, ``full_transfer_seconds`` (full_bytes at the
link's rate) over the ideal row's ``step_seconds`` (``window_ratio``: async rollout overlaps training, so a
step of the ideal run is the time the actors take to generate one batch), and for the rollart row the per-step
delta density ``delta_bytes_per_step`` / ``full_bytes`` (``delta_density``, from the trainer's "version
published" log lines). The learning rate is examples/geo.yaml's (5e-4, a tiny model on a narrow task): its
updates touch far more bf16 entries than the seed's 1.3%; the density is reported, not tuned.

What the full rows are: each of the region's two actors GETs its own copy (no relay for full weights), so a
version costs the link 2 x 14 s; and the trainer loads full weights inside every step's UPDATE phase whatever
``alpha`` is (alpha bounds admission only), so full-lag2/4 differ from full-lag1 by admission, not by overlap.

    python -m bench geo --steps 6 --configs ideal,rollart,full-lag1,full-lag4 --json bench/results/geo-smoke.json
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


CONFIGS = ("ideal", "rollart", "full-lag1", "full-lag2", "full-lag4")


def config_sets(config: str, links: dict[str, Any], rate_mbps: float | None) -> tuple[list[str], float | None]:
    """The job file's overrides of one row, and its link rate (None: no link)."""
    if config not in CONFIGS:
        raise ValueError(f"unknown config {config!r} ({', '.join(CONFIGS)})")
    if config == "ideal":
        return ["cluster.regions=null"], None
    sets: list[str] = []
    link_mbps = min(float(v["rate_mbps"]) for v in links.values())
    if rate_mbps:
        sets += [f"cluster.regions.links.{k}.rate_mbps={rate_mbps}" for k in links]
        link_mbps = rate_mbps
    if config.startswith("full-lag"):
        sets += ["job.publish.weight_sync=full_checkpoint", f"job.alpha={int(config.removeprefix('full-lag'))}"]
    return sets, link_mbps


def published_delta_bytes(out: Path) -> list[int]:
    """delta_bytes of each version after v0 the trainer published (its JSON log's "version published" lines)."""
    log = out / "cluster" / "logs" / "trainer.log"
    sizes = []
    for line in log.read_text(errors="replace").splitlines() if log.exists() else []:
        if '"version published"' in line:
            try:
                doc = json.loads(line)
                if int(doc.get("version", 1)) > 0:  # v0 is the base: no delta
                    sizes.append(int(doc["delta_bytes"]))
            except (ValueError, KeyError, TypeError):
                continue
    return sizes


def full_bytes(out: Path, model_dir: str | None) -> int | None:
    """Bytes of the full weights: a checkpoint the run committed, else the model's safetensors."""
    for manifest in sorted((out / "cluster" / "weights").glob("v*/manifest.json")):
        return int(json.loads(manifest.read_text())["size"])
    for root in [Path(model_dir)] if model_dir else [out]:
        for f in sorted(root.rglob("model.safetensors")):
            return f.stat().st_size
    return None


def run_mode(
    config: str, out: Path, steps: int, model_dir: str | None, rate_mbps: float | None, timeout: float
) -> dict[str, Any]:
    sets = [f"job.max_steps={steps}", "eval.every=0", "eval.at_start=false"]
    if model_dir:
        sets.append(f"model.dir={model_dir}")
    job = yaml.safe_load(JOB.read_text())
    more, link_mbps = config_sets(config, job["cluster"]["regions"]["links"], rate_mbps)
    sets += more
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
        "reference": not rate_mbps,  # run at the seed's ratio (examples/geo.yaml's link)
    }
    size = full_bytes(out, model_dir)
    row["full_bytes"] = size
    if size and link_mbps:
        row["full_transfer_seconds"] = size * 8 / (link_mbps * 1e6)
    deltas = published_delta_bytes(out)
    if config != "ideal" and not config.startswith("full") and deltas:
        row["delta_bytes_per_step"] = statistics.median(deltas)
        if size:
            row["delta_density"] = row["delta_bytes_per_step"] / size
    links_seen = summary.get("links")
    if links_seen:
        row["link_bytes"] = {k: v["bytes"] for k, v in links_seen["links"].items()}
        row["forwarder_bytes"] = {
            k: {"up": v["bytes_up"], "down": v["bytes_down"]}
            for k, v in links_seen["forwarders"].items()
            if v["bytes_up"] or v["bytes_down"]
        }
        ckpt = [v["bytes_down"] for k, v in links_seen["forwarders"].items() if k.endswith(">checkpoints")]
        if ckpt:
            row["checkpoint_link_bytes"] = sum(ckpt)
    return row


def add_ratios(rows: list[dict[str, Any]]) -> None:
    """ratio_to_ideal on every row; rollart_speedup (rollart's samples/s over the row's) on the full rows; the
    full transfer over the ideal step, its generation window (window_ratio)."""
    by = {r["config"]: r for r in rows}
    ideal, rollart = by.get("ideal"), by.get("rollart")
    for r in rows:
        if ideal:
            r["ratio_to_ideal"] = r["samples_per_second"] / ideal["samples_per_second"]
            if r.get("full_transfer_seconds") and ideal["step_seconds"]:
                r["window_ratio"] = r["full_transfer_seconds"] / ideal["step_seconds"]
        if rollart and r["config"].startswith("full"):
            r["rollart_speedup"] = rollart["samples_per_second"] / r["samples_per_second"]


def table(rows: list[dict[str, Any]]) -> str:
    cols = [
        ("config", "{}"), ("link_mbps", "{}"), ("samples_per_second", "{:.2f}"), ("step_seconds", "{:.2f}"),
        ("transfer_exposed_seconds", "{:.2f}"), ("generation_seconds", "{:.2f}"), ("ratio_to_ideal", "{:.3f}"),
        ("rollart_speedup", "{:.2f}"), ("delta_density", "{:.3f}"), ("window_ratio", "{:.2f}"),
    ]  # fmt: skip
    lines = ["  ".join(f"{c:>12}" if c != "config" else f"{c:<10}" for c, _ in cols)]
    for r in rows:
        cells = []
        for c, fmt in cols:
            v = r.get(c)
            text = "-" if v is None else fmt.format(v)
            cells.append(f"{text:<10}" if c == "config" else f"{text:>12}")
        lines.append("  ".join(cells))
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench geo", description=__doc__.split("\n\n")[0])
    ap.add_argument("--steps", type=int, default=6, help="steps per run (medians over steps 3..N)")
    ap.add_argument(
        "--configs",
        default="ideal,rollart,full-lag1,full-lag4",
        help=f"rows to run, comma-separated: {', '.join(CONFIGS)}",
    )
    ap.add_argument("--rate-mbps", type=float, help="the link's rate both ways (default: examples/geo.yaml's)")
    ap.add_argument("--model-dir", help="model.dir for every run (a built warm start is reused by recipe)")
    ap.add_argument("--timeout", type=float, default=600.0, help="seconds per run before it is stopped")
    ap.add_argument("--out", type=Path, default=Path("runs/bench-geo"), help="run folders (one per config)")
    ap.add_argument("--json", type=Path, help="write the rows here")
    a = ap.parse_args(argv)
    rows = []
    configs = a.configs.split(",")
    for config in configs:
        if config not in CONFIGS:
            ap.error(f"--configs: unknown config {config!r} ({', '.join(CONFIGS)})")
    for config in configs:
        row = run_mode(config, a.out.resolve() / config, a.steps, a.model_dir, a.rate_mbps, a.timeout)
        print(json.dumps(row), flush=True)
        rows.append(row)
    add_ratios(rows)
    print(table(rows))
    if a.json:
        a.json.parent.mkdir(parents=True, exist_ok=True)
        a.json.write_text(json.dumps(rows, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
