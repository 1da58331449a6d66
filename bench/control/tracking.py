"""What experiment tracking costs a run: the same short `rollart run examples/frozenlake.yaml` with tracking on
(``--on all``: TensorBoard, W&B offline, MLflow file store, rollout samples; ``--on default``: the example's own,
TensorBoard and samples) and off (`--set tracking=false`), in alternating pairs (on, off, on, off, ...).

    python -m bench tracking --json bench/results/tracking-overhead-frozenlake-4steps-all.json   # 2 pairs, 4 steps
    python -m bench tracking --on default --pairs 1 --json bench/results/tracking-overhead-frozenlake-4steps-default.json

Per pair: each run's wall time (the `rollart run` process, start to exit, cluster start and teardown included)
and its steps time (first step's start to last step's end), and the ratio on/off of both; the last row gives the
medians and the spread of the ratios over the pairs (the noise between runs: compare it with the overhead).
``loop_seconds`` is the time the run's own loop spent in the tracker (tracking.json), a floor on the overhead
that run-to-run noise does not blur (W&B's service process and the event writers' threads run beside it).
The warm-started model is built once before the pairs (``--model-dir``) so no run pays for it.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
EXAMPLE = REPO / "examples" / "frozenlake.yaml"
# Tracking "on": every backend (TensorBoard is on by default), or the example's own (`make run`: TensorBoard and
# samples every 5 steps, what a user gets without a tracking section).
CONFIGS = {"all": "{wandb: true, mlflow: true, samples: {every: 2}}", "default": "true"}
OFF = "false"
MODEL_DIR = Path(tempfile.gettempdir()) / "rollart-bench-models" / "frozenlake-example"


def build_model(model_dir: Path) -> float:
    """The example's warm-started model into ``model_dir`` (reused when its recipe is there); seconds taken."""
    from rollart.job.prepare import prepare_model

    section = dict(yaml.safe_load(EXAMPLE.read_text())["model"], dir=str(model_dir))
    t0 = time.monotonic()
    prepare_model(section, model_dir.parent, sys.stderr)
    return time.monotonic() - t0


def one(out: Path, tracking: str, steps: int, model_dir: Path, timeout: float) -> dict[str, Any]:
    """One `rollart run` of the example; its wall and steps seconds and what tracking recorded."""
    argv = [str(BIN / "rollart"), "run", str(EXAMPLE), "--out", str(out), "--quiet",
            "--set", f"job.max_steps={steps}", "--set", f"model.dir={model_dir}", "--set", f"tracking={tracking}"]
    env = {k: v for k, v in os.environ.items() if not k.startswith(("ROLLART_", "WANDB_", "MLFLOW_"))}
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    out.mkdir(parents=True, exist_ok=True)
    t0 = time.monotonic()
    with open(out.parent / f"{out.name}.log", "wb") as log:
        code = subprocess.run(argv, stdout=log, stderr=subprocess.STDOUT, env=env, cwd=REPO, timeout=timeout).returncode
    wall = time.monotonic() - t0
    lines = (out / "metrics.jsonl").read_text().splitlines() if (out / "metrics.jsonl").is_file() else []
    recs = sorted((r for r in map(json.loads, lines) if "step" in r), key=lambda r: r["step"])
    state_path = out / "tracking.json"
    state = json.loads(state_path.read_text()) if state_path.is_file() else {}
    return {
        "ok": code == 0 and len(recs) == steps,
        "code": code,
        "wall_seconds": round(wall, 2),
        "steps_seconds": round(recs[-1]["finished_at"] - recs[0]["started_at"], 2) if recs else None,
        "loop_seconds": state.get("loop_seconds"),
        "tb_files": len(list((out / "tb").glob("events.out.tfevents.*"))) if (out / "tb").is_dir() else 0,
        "samples": len((out / "samples.jsonl").read_text().splitlines()) if (out / "samples.jsonl").is_file() else 0,
    }


def _ratio(a: float | None, b: float | None) -> float | None:
    return round(a / b, 4) if a and b else None


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench tracking", description=__doc__.splitlines()[0])
    ap.add_argument("--pairs", type=int, default=2, help="on/off pairs, alternating (default 2: on off on off)")
    ap.add_argument("--steps", type=int, default=4, help="job.max_steps of each run")
    ap.add_argument("--model-dir", type=Path, default=MODEL_DIR, help="where the example's model is built once")
    ap.add_argument("--timeout", type=float, default=600.0, help="seconds allowed for one run")
    ap.add_argument("--on", choices=sorted(CONFIGS), default="all",
                    help="tracking when on: all (TensorBoard, W&B, MLflow, samples every 2) or default (make run's)")
    ap.add_argument("--json", type=Path, help="write one object per row here")
    args = ap.parse_args(argv)
    if args.pairs < 1 or args.steps < 1:
        ap.error("--pairs and --steps must be at least 1")
    build_s = build_model(args.model_dir)
    root = Path(tempfile.mkdtemp(prefix="bench-tracking-"))
    rows: list[dict[str, Any]] = []
    for i in range(args.pairs):
        on = one(root / f"on-{i}", CONFIGS[args.on], args.steps, args.model_dir, args.timeout)
        off = one(root / f"off-{i}", OFF, args.steps, args.model_dir, args.timeout)
        if on["ok"] and (on["tb_files"] == 0 or on["samples"] == 0):
            on["ok"] = False  # "on" must have tracked: a run without event files or samples measured nothing
        if off["ok"] and (off["tb_files"] or off["samples"] or off["loop_seconds"] is not None):
            off["ok"] = False  # "off" must not have
        rows.append({
            "pair": i + 1,
            "steps": args.steps,
            "ok": on["ok"] and off["ok"],
            "on_wall_seconds": on["wall_seconds"],
            "off_wall_seconds": off["wall_seconds"],
            "wall_ratio_on_off": _ratio(on["wall_seconds"], off["wall_seconds"]),
            "on_steps_seconds": on["steps_seconds"],
            "off_steps_seconds": off["steps_seconds"],
            "steps_ratio_on_off": _ratio(on["steps_seconds"], off["steps_seconds"]),
            "on_loop_seconds": on["loop_seconds"],
            "on_loop_fraction_of_wall": round(on["loop_seconds"] / on["wall_seconds"], 4)
            if on["loop_seconds"] is not None else None,
            "on": on,
            "off": off,
        })
        print(f"pair {i + 1}: on {on['wall_seconds']} s, off {off['wall_seconds']} s (ok {rows[-1]['ok']})",
              file=sys.stderr, flush=True)
    good = [r for r in rows if r["ok"]]

    def med(key: str) -> float | None:
        vals = [r[key] for r in good if r[key] is not None]
        return round(statistics.median(vals), 4) if vals else None

    def spread(key: str) -> list[float] | None:
        vals = [r[key] for r in good if r[key] is not None]
        return [min(vals), max(vals)] if vals else None

    summary = {
        "pair": "median",
        "steps": args.steps,
        "ok": len(good) == len(rows),
        "pairs_ok": f"{len(good)}/{len(rows)}",
        "on_wall_seconds": med("on_wall_seconds"),
        "off_wall_seconds": med("off_wall_seconds"),
        "wall_ratio_on_off": med("wall_ratio_on_off"),
        "wall_ratio_spread": spread("wall_ratio_on_off"),
        "on_steps_seconds": med("on_steps_seconds"),
        "off_steps_seconds": med("off_steps_seconds"),
        "steps_ratio_on_off": med("steps_ratio_on_off"),
        "steps_ratio_spread": spread("steps_ratio_on_off"),
        "on_loop_seconds": med("on_loop_seconds"),
        "on_loop_fraction_of_wall": med("on_loop_fraction_of_wall"),
        "model_build_seconds": round(build_s, 1),
        "tracking_on": CONFIGS[args.on],
    }
    rows.append(summary)
    print(f"`rollart run examples/frozenlake.yaml --set job.max_steps={args.steps}`, "
          f"tracking on = tracking={CONFIGS[args.on]}")
    print("| pair | on wall (s) | off wall (s) | wall on/off | on steps (s) | off steps (s) | steps on/off "
          "| tracker in loop (s) | ok |")
    print("|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['pair']} | {r['on_wall_seconds']} | {r['off_wall_seconds']} | {r['wall_ratio_on_off']} "
              f"| {r['on_steps_seconds']} | {r['off_steps_seconds']} | {r['steps_ratio_on_off']} "
              f"| {r['on_loop_seconds']} | {r.get('pairs_ok', r['ok'])} |")
    print(f"spread of wall on/off over pairs: {summary['wall_ratio_spread']}; "
          f"steps on/off: {summary['steps_ratio_spread']}")
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        if args.json.suffix == ".jsonl":
            args.json.write_text("".join(json.dumps(r, default=str) + "\n" for r in rows))
        else:  # a list, one object per row (bench/_support/results_table.py selects [pair=median].<field>)
            args.json.write_text(json.dumps(rows, indent=1, default=str) + "\n")
    return 0 if summary["ok"] else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
