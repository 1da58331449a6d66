"""The step protocol end to end: step time, throughput, wasted generation and time to score of sync, sync+,
one-off, AReaL and async (alpha = 1, 2, 4; or a sweep), and the reward curves of sync vs async alpha = 1, on the
same task, seeds, model and hardware.

Time to score on the validation score (issue 25): every run evaluates the policy on the example's held-out maps
(its ``eval`` section: at the start and every ``eval.every`` steps, mean@4); ``--rows tts`` runs the named row
set ``TTS_ROWS`` (sync+, and AReaL and async alpha 1, 2, 4: without correction, with it, and with it and dynamic
sampling), every row
``--seeds`` times (job seed and latency seed 0..N-1) and reports medians over seeds: the validation time to
score (an unreached seed counts as never: the median is null when most seeds never reach it), the steps to
score and the final validation score. ``--set KEY=VALUE`` applies a job-file field (``rollart run --set``'s
syntax) to every row; the rows themselves are such field dicts.

    python -m bench protocol                        # ~40 min on 2 cores
    python -m bench protocol --record         # also writes "## Trainer and protocol" in bench/notes/protocol.md
    python -m bench protocol --json out.json        # one object per configuration (see --json)
    python -m bench protocol --alphas 1 2 3 4 6     # the async rows for these alphas (the alpha sweep)
    python -m bench protocol --pin --epochs 8 --seeds 3 --rows tts --json out.json   # time to score (issue 25)

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
| areal | AREAL: the ASYNC steps, staleness bounded only when a trajectory starts (nothing evicted as stale) | 1 | delta | trajectory-level |

Step time is the median over the steps after the first two (warm-up);
throughput is trained samples per second (B / step time). Wasted is the ledger's generation accounting at the
end of the run: tokens generated but not trained (evicted, cancelled, rejected, failed) over tokens generated.
Time to score is the wall time from the first step's start until the 10-step moving average of the batch reward
first reaches ``--target`` (0.8), none when the run ends before. The overlap limit comes from the sync+ row of the
same run: rollout alone is its median GET_BATCH time (the trainer idle), training alone the rest of its step
(train, checkpoint, publish, update); an asynchronous step cannot be shorter than the larger of the two.
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

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from rollart.job.evaluation import eval_rows, job_start  # noqa: E402
from rollart.job.metrics import read_records  # noqa: E402
from rollart.job.run import RunOptions, improvement, run  # noqa: E402
from rollart.job.spec import apply_overrides  # noqa: E402

# (row, job overrides, weight update, environment interaction)
CONFIGS = [
    ("sync", {"mode": "sync", "alpha": 0}, "full_checkpoint", "batch"),
    ("sync+", {"mode": "sync", "alpha": 0}, "full_checkpoint", "trajectory"),
    ("one-off", {"mode": "one_off", "alpha": 1}, "delta", "trajectory"),
    ("async-1", {"mode": "async", "alpha": 1}, "delta", "trajectory"),
    ("async-2", {"mode": "async", "alpha": 2}, "delta", "trajectory"),
    ("async-4", {"mode": "async", "alpha": 4}, "delta", "trajectory"),
    ("areal", {"mode": "areal", "alpha": 1}, "delta", "trajectory"),
]
# Time to score (--rows tts): each row a dict of job-file fields (rollart run --set paths). Sync+ is the
# baseline; the corrected rows are the first candidates (AReaL's own decoupled objective; TIS for the async
# modes), to be replaced by the best configuration measured.
_SYNC_PLUS = {"job.mode": "sync", "job.alpha": 0, "job.publish.weight_sync": "full_checkpoint",
              "environment.interaction": "trajectory"}  # fmt: skip
_DELTA = {"job.publish.weight_sync": "delta", "environment.interaction": "trajectory"}
TTS_ROWS: list[tuple[str, dict]] = [
    ("sync+", _SYNC_PLUS),
    ("areal", {**_DELTA, "job.mode": "areal", "job.alpha": 1}),
    ("areal+decoupled", {**_DELTA, "job.mode": "areal", "job.alpha": 1, "job.grpo.correction": "decoupled"}),
    *[
        row
        for a in (1, 2, 4)
        for row in (
            (f"async-{a}", {**_DELTA, "job.mode": "async", "job.alpha": a}),
            (f"async-{a}+tis", {**_DELTA, "job.mode": "async", "job.alpha": a, "job.grpo.correction": "tis"}),
        )
    ],
    # Each corrected row again with DAPO's dynamic sampling (zero-variance groups dropped, the batch topped up).
    ("areal+decoupled+ds", {**_DELTA, "job.mode": "areal", "job.alpha": 1, "job.grpo.correction": "decoupled",
                            "job.grpo.dynamic_sampling": True}),
    *[
        (f"async-{a}+tis+ds", {**_DELTA, "job.mode": "async", "job.alpha": a, "job.grpo.correction": "tis",
                               "job.grpo.dynamic_sampling": True})
        for a in (1, 2, 4)
    ],
]
ROW_SETS = {"tts": TTS_ROWS}
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
    target: float = 0.8,
    seed: int = 0,
    fields: dict | None = None,
    overrides: list[str] | None = None,
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
            "seed": 7 + seed,
        }
    data["model"]["dir"] = str(work / "model")  # one warm start for every row
    data["run"] = {"timeout": f"{max(600, 60 * steps)}s", "score_target": target}
    data["job"]["seed"] = seed
    if data.get("eval"):
        data["eval"]["score_target"] = target
    # The row's fields, then --set: rollart run --set's paths and checks (a bad one names the path).
    sets = [f"{k}={json.dumps(v)}" for k, v in (fields or {}).items()] + list(overrides or [])
    data = apply_overrides(data, sets)
    path = work / f"{name}{'' if not seed else f'-seed{seed}'}.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def finished(out: Path, cfg: Path) -> bool:
    """Whether ``out`` holds a finished run of exactly this job file (--resume keeps it)."""
    saved, summary = out / "job.yaml", out / "summary.json"
    if not (summary.is_file() and saved.is_file() and saved.read_text() == cfg.read_text()):
        return False
    return json.loads(summary.read_text()).get("state") == "COMPLETED"  # a failed run is run again


def summarise(name: str, out: Path, batch: int) -> dict:
    recs = sorted(read_records(out / "metrics.jsonl"), key=lambda r: r["step"])
    summary = json.loads((out / "summary.json").read_text()) if (out / "summary.json").is_file() else {}
    steady = recs[2:] or recs
    med = lambda key: statistics.median(r[key] for r in steady) if steady else float("nan")  # noqa: E731
    rewards = [r["reward_mean"] for r in recs]
    first, last, _ = improvement(rewards)
    acc = recs[-1].get("accounting_total", {}) if recs else {}
    t0 = float(recs[0].get("started_at") or 0.0) if recs else 0.0
    # (wall seconds at the end of the step, 10-step moving average of the batch reward) for the picture
    curve = [
        (float(r.get("finished_at") or 0.0) - t0, statistics.mean(rewards[max(0, i - 9) : i + 1]))
        for i, r in enumerate(recs)
    ]
    return {
        "name": name,
        "curve": curve,
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
        "checkpoint_s": med("checkpoint_seconds") if steady and "checkpoint_seconds" in steady[0] else 0.0,
        "rest_s": statistics.median(r["step_seconds"] - r["get_batch_seconds"] for r in steady) if steady else 0.0,
        "wasted": acc.get("wasted_token_fraction", float("nan")) if acc else float("nan"),
        "accounting": acc,
        "time_to_score_s": summary.get("time_to_score_seconds"),
        "rewards": rewards,
        "reward_first10": first,
        "reward_last10": last,
        **validation(summary),
        "eval_points": eval_points(out / "metrics.jsonl", recs),
    }


def eval_points(metrics: Path, recs: list[dict]) -> list[tuple[float, float]]:
    """(wall seconds since the job's start at which the evaluated policy was current, validation score): the
    validation curve on summary.json's clock (its time to score is the first point at the target)."""
    rows = [r for r in eval_rows(metrics) if not r.get("failed")]
    t0 = job_start(recs, rows)
    if t0 is None:
        return []
    return [(max(float(r.get("policy_at") or t0) - t0, 0.0), float(r["score"])) for r in rows]


def validation(summary: dict) -> dict:
    """The validation figures of a run's summary.json (its one task's; the job validates one)."""
    v = next(iter((summary.get("validation") or {}).values()), None) or {}
    return {
        "eval_time_to_score_s": v.get("time_to_score_seconds"),
        "eval_steps_to_score": v.get("step_to_score"),
        "final_eval": v.get("final"),
        "eval_curve": v.get("curve", []),
        "eval_tokens": v.get("tokens_generated", 0),
    }


def _median_or_none(values: list) -> float | None:
    """Median where None is "never": None when the median is never (most seeds did not reach it)."""
    if not values:
        return None
    xs = sorted(float("inf") if x is None else float(x) for x in values)
    m = statistics.median(xs)
    return None if m == float("inf") else m


def combine(seeds: list[dict]) -> dict:
    """One row from its seeds' runs: medians of the figures (the first seed's curves and accounting), and
    ``per_seed``."""
    row = dict(seeds[0])
    for key, value in seeds[0].items():
        if key.startswith("eval_") and key not in ("eval_curve", "eval_points") or key == "final_eval":
            row[key] = _median_or_none([s.get(key) for s in seeds])
        elif key == "time_to_score_s":
            row[key] = _median_or_none([s.get(key) for s in seeds])
        elif isinstance(value, int | float) and not isinstance(value, bool):
            xs = [s[key] for s in seeds if isinstance(s.get(key), int | float)]
            row[key] = statistics.median(xs) if xs else value
    row["eval_points_seeds"] = [s.get("eval_points", []) for s in seeds]
    row["per_seed"] = [
        {
            "seed": s["seed"],
            "time_to_score_seconds": s.get("eval_time_to_score_s"),
            "steps_to_score": s.get("eval_steps_to_score"),
            "final_eval": s.get("final_eval"),
            "train_time_to_score_seconds": s.get("time_to_score_s"),
            "step_seconds": s.get("step_s"),
            "steps": s.get("steps"),
            "state": s.get("state"),
        }
        for s in seeds
    ]
    return row


def eval_table(rows: list[dict]) -> str:
    """Time to score on the validation score, medians over seeds (sync+ the baseline)."""
    base = {r["name"]: r for r in rows}.get("sync+")
    lines = [
        "| config | seeds | val. time to score s | vs sync+ | steps to score | final val. | train tts s | step s |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        tts = r.get("eval_time_to_score_s")
        fin = r.get("final_eval")
        steps = r.get("eval_steps_to_score")
        lines.append(
            f"| {r['name']} | {len(r.get('per_seed') or [1])} | {'-' if tts is None else f'{tts:.0f}'} "
            f"| {_ratio(base and base.get('eval_time_to_score_s'), tts)} | {'-' if steps is None else f'{steps:g}'} "
            f"| {'-' if fin is None else f'{fin:.3f}'} | {_tts(r)} | {r['step_s']:.2f} |"
        )
    return "\n".join(lines)


def overlap_limit(rows: list[dict]) -> dict | None:
    """max(rollout alone, training alone) per step, from the sync+ row of the same run (None without it)."""
    base = {r["name"]: r for r in rows}.get("sync+")
    if base is None or not base["steps"]:
        return None
    rollout, train = base["get_batch_s"], base["rest_s"]
    return {"rollout_only_s": rollout, "train_only_s": train, "limit_s": max(rollout, train)}


def _tts(r: dict) -> str:
    return f"{r['time_to_score_s']:.0f}" if r.get("time_to_score_s") is not None else "not reached"


def _ratio(a: float | None, b: float | None) -> str:
    return f"{a / b:.2f}x" if a and b else "-"


def table(rows: list[dict]) -> str:
    by = {r["name"]: r for r in rows}
    base = by.get("sync+")
    oneoff = by.get("one-off")
    areal = by.get("areal")
    lines = [
        "| config | steps | step s | samples/s | vs sync+ | vs one-off | get_batch s | update s | pause s "
        "| train s | gen tok/s | staleness | wasted | time to score s | tts vs sync+ | tts vs one-off | tts vs areal "
        "| reward first/last 10 |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        vs_base = f"{base['step_s'] / r['step_s']:.2f}x" if base else "-"
        vs_oneoff = f"{oneoff['step_s'] / r['step_s']:.2f}x" if oneoff else "-"
        tts = r.get("time_to_score_s")
        lines.append(
            f"| {r['name']} | {r['steps']} | {r['step_s']:.2f} | {r['samples_per_s']:.2f} | {vs_base} | {vs_oneoff} "
            f"| {r['get_batch_s']:.2f} | {r['update_s']:.2f} | {r['pause_s']:.3f} | {r['train_s']:.2f} "
            f"| {r['tokens_per_s']:.0f} | {r['staleness']:.2f} | {r['wasted']:.3f} | {_tts(r)} "
            f"| {_ratio(base and base.get('time_to_score_s'), tts)} "
            f"| {_ratio(oneoff and oneoff.get('time_to_score_s'), tts)} "
            f"| {_ratio(areal and areal.get('time_to_score_s'), tts)} "
            f"| {r['reward_first10']:.3f} / {r['reward_last10']:.3f} |"
        )
    lim = overlap_limit(rows)
    if lim:
        lines.append("")
        lines.append(
            f"Overlap limit (same run, from sync+): rollout alone {lim['rollout_only_s']:.2f} s, training alone "
            f"{lim['train_only_s']:.2f} s per step: limit {lim['limit_s']:.2f} s"
            + "".join(
                f"; {r['name']} at {r['step_s'] / lim['limit_s']:.2f}x of it"
                for r in rows
                if r["name"].startswith("async")
            )
            + "."
        )
    return "\n".join(lines)


def json_rows(rows: list[dict]) -> list[dict]:
    """One object per configuration (``--json``)."""
    lim = overlap_limit(rows)
    out = []
    for r in rows:
        out.append(
            {
                "config": r["name"],
                "step_seconds": r["step_s"],
                "samples_per_second": r["samples_per_s"],
                "wasted_token_fraction": r["wasted"],
                # On the validation score (medians over seeds; null when not reached), issue 25.
                "time_to_score_seconds": r.get("eval_time_to_score_s"),
                "steps_to_score": r.get("eval_steps_to_score"),
                "final_eval": r.get("final_eval"),
                "per_seed": r.get("per_seed", []),
                # The training reward's (10-step average of the batch reward), as before.
                "train_time_to_score_seconds": r.get("time_to_score_s"),
                "reward_first10": r["reward_first10"],
                "reward_last10": r["reward_last10"],
                "steps": r["steps"],
                "state": r["state"],
                "accounting": r["accounting"],
                "overlap_limit_seconds": lim["limit_s"] if lim else None,
                "rollout_only_seconds": lim["rollout_only_s"] if lim else None,
                "train_only_seconds": lim["train_only_s"] if lim else None,
            }
        )
    return out


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


def _line_style(name: str) -> str:
    return ":" if name.endswith("+ds") else "-" if _mode(name) == name else "--"


def plot(rows: list[dict], path: Path, target: float = 0.8) -> None:
    """Left: the 10-step moving average of the batch reward against wall time, one line per row (where it crosses
    the target is the time to score); with validation (--rows tts), the validation score against wall time, every
    row and seed. Right: the alpha sweep (async rows): step time and time to score; with validation, each row's
    median validation time to score."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return
    fig, (ax, bx) = plt.subplots(1, 2, figsize=(12, 4.2), dpi=110)
    validated = any(r.get("eval_points_seeds") and any(r["eval_points_seeds"]) for r in rows)
    colors = plt.get_cmap("tab10")
    # one colour per mode; its corrected rows (name "<mode>+<what>") dashed, with dynamic sampling dotted
    modes = list(dict.fromkeys(_mode(r["name"]) for r in rows))
    for i, r in enumerate(rows):
        if validated:
            i = modes.index(_mode(r["name"]))
            for k, pts in enumerate(r.get("eval_points_seeds") or []):
                if pts:
                    ax.plot([t for t, _ in pts], [m for _, m in pts], color=colors(i % 10), lw=1.4 if k == 0 else 0.6,
                            alpha=1.0 if k == 0 else 0.45, marker="." if k == 0 else None, ms=3,
                            ls=_line_style(r["name"]), label=r["name"] if k == 0 else None)  # fmt: skip
            continue
        pts = r.get("curve") or []
        if pts:
            ax.plot([t for t, _ in pts], [m for _, m in pts], marker=".", ms=3, label=r["name"])
    ax.axhline(target, color="grey", ls="--", lw=0.8)
    ax.set_xlabel("wall time since the first step's start, s")
    ax.set_ylabel(
        "validation score (mean@n; thin: other seeds)" if validated else "batch reward, 10-step moving average"
    )
    ax.set_title("time to score (same seeds, same warm start)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    if validated:
        names = [r["name"] for r in rows]
        vals = [r.get("eval_time_to_score_s") for r in rows]
        bx.barh(names, [v or 0 for v in vals], color=[colors(modes.index(_mode(n)) % 10) for n in names])
        for i, v in enumerate(vals):
            bx.annotate("not reached" if v is None else f"{v:.0f} s", (v or 0, i), fontsize=7,
                        textcoords="offset points", xytext=(3, -3))  # fmt: skip
        bx.invert_yaxis()
        bx.set_xlabel("validation time to score, s (median over seeds)")
        bx.set_title(f"time to reach {target:g} on the validation score")
        bx.grid(alpha=0.3, axis="x")
        _save(fig, path, plt)
        return
    sweep = sorted(
        ((int(r["name"].split("-")[1]), r) for r in rows if r["name"].split("-")[0] == "async"
         and r["name"].split("-")[1].isdigit()),
        key=lambda x: x[0],
    )  # fmt: skip
    if sweep:
        alphas = [a for a, _ in sweep]
        bx.plot(alphas, [r["step_s"] for _, r in sweep], marker="o", label="step s (median)")
        tts = [(a, r["time_to_score_s"]) for a, r in sweep if r.get("time_to_score_s") is not None]
        bx2 = bx.twinx()
        bx2.plot([a for a, _ in tts], [t for _, t in tts], marker="s", color="tab:red", label="time to score s")
        bx2.set_ylabel("time to score, s", color="tab:red")
        for a, r in sweep:
            bx.annotate(
                f"wasted {r['wasted']:.3f}",
                (a, r["step_s"]),
                fontsize=7,
                textcoords="offset points",
                xytext=(0, 6),
                ha="center",
            )
        bx.set_xlabel("alpha")
        bx.set_ylabel("step s")
        bx.set_title("alpha sweep (async)")
        bx.set_ylim(bottom=0)
        bx2.set_ylim(bottom=0)
        bx.grid(alpha=0.3)
    else:
        bx.axis("off")
    _save(fig, path, plt)


def _mode(name: str) -> str:
    """A row's mode: ``async-1`` for ``async-1+tis`` (``sync+`` is a mode)."""
    head, _, rest = name.partition("+")
    return head if rest else name


def _save(fig, path: Path, plt) -> None:  # noqa: ANN001
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
    path = ROOT / "bench" / "notes" / "protocol.md"
    head = f"## Time to score on the validation score (--rows {args.rows})" if args.rows else "## Trainer and protocol"
    if args.epochs != 1 or args.pin:
        what = [f"{args.epochs} epochs per batch"] if args.epochs != 1 else []
        what += ["trainer on CPU 0, rollout side on CPU 1"] if args.pin else []
        head += f": {', '.join(what)}"
    only = f" --only {' '.join(args.only)}" if args.only else ""
    only += f" --alphas {' '.join(map(str, args.alphas))}" if args.alphas else ""
    only += f" --rows {args.rows} --seeds {args.seeds} --target {args.target:g}" if args.rows else ""
    only += "".join(f" --set {kv}" for kv in args.set)
    cmd = (
        f"`.venv/bin/python -m bench protocol --steps {args.steps} --curve-steps {args.curve_steps} "
        f"--latency {args.latency} --epochs {args.epochs}{' --pin' if args.pin else ''}{only} --record`"
    )
    placement = (
        "the trainer (one torch thread) pinned to CPU 0, every other service (two vLLM-CPU actors, envmanager, "
        "LLMProxy, relay, ledger, reward, resource manager) to CPU 1 with `ROLLART_CPUS`; Redis and the Mooncake "
        "master unpinned"
        if args.pin
        else "every service of the cluster (two vLLM-CPU actors, the trainer on one torch thread, envmanager, "
        "LLMProxy, relay, ledger, reward, Redis, Mooncake master) shares the cores"
    )
    body = (
        f"{head}\n\nCommand: {cmd}.\nMachine: {os.cpu_count()} cores, {_cpu_model()}, "
        f"{os.sysconf('SC_PAGE_SIZE') * os.sysconf('SC_PHYS_PAGES') / 2**30:.0f} GiB, Python "
        f"{platform.python_version()}; {placement}. Measured "
        f"{time.strftime('%Y-%m-%d')}; load average at the end of each run: "
        f"{', '.join(f'{x:.1f}' for x in loads)} (mostly the cluster's own processes).\n\n"
        f"{text}\n"
    )
    old = path.read_text() if path.exists() else "# Notes\n"
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
    ap.add_argument("--record", action="store_true", help="write the section in bench/notes/protocol.md")
    ap.add_argument("--json", type=Path, help="write one object per configuration to this file")
    ap.add_argument(
        "--alphas", type=int, nargs="*", help="the async rows for these alphas instead of 1, 2, 4 (the sweep)"
    )
    ap.add_argument(
        "--target", type=float, default=0.8,
        help="target of the times to score: the 10-step average reward, and the validation score (eval.score_target)",
    )
    ap.add_argument("--seeds", type=int, default=1, help="runs of every row (seeds 0..N-1); medians over seeds")
    ap.add_argument("--rows", choices=sorted(ROW_SETS), help="a named row set instead of the default rows")
    ap.add_argument(
        "--set", action="append", default=[], metavar="KEY=VALUE",
        help="a job-file field applied to every row (rollart run --set syntax), e.g. --set eval.every=2",
    )
    ap.add_argument(
        "--resume",
        action="store_true",
        help="keep a run already finished in the work folder with the same job file (its summary.json); run the rest",
    )
    ap.add_argument(
        "--no-run",
        action="store_true",
        help="run nothing: summarise the rows already in the work folder (e.g. after rerunning some with --only)",
    )
    args = ap.parse_args()
    if args.work is None:
        tag = ("" if args.epochs == 1 else f"-e{args.epochs}") + ("-pin" if args.pin else "")
        args.work = ROOT / "bench" / "out" / f"protocol{tag}"
    args.work.mkdir(parents=True, exist_ok=True)
    rows, loads = [], []
    # (name, job fields, weight update, interaction, row fields); --rows: field dicts only
    configs: list[tuple[str, dict, str, str, dict]] = [(n, j, ws, i, {}) for n, j, ws, i in CONFIGS]
    if args.alphas:
        configs = [c for c in configs if not c[0].startswith("async-")]
        configs += [(f"async-{a}", {"mode": "async", "alpha": a}, "delta", "trajectory", {}) for a in args.alphas]
    if args.rows:
        configs = [(name, {}, "delta", "trajectory", fields) for name, fields in ROW_SETS[args.rows]]
    for name, job, ws, interaction, fields in configs:
        if args.only and name not in args.only:
            continue
        steps = args.curve_steps if name in CURVES or args.rows else args.steps
        per_seed = []
        for seed in range(args.seeds):
            cfg = job_file(
                args.work, name, job, ws, interaction, steps, args.latency, args.epochs, args.pin, target=args.target,
                seed=seed, fields=fields, overrides=args.set,
            )
            out = args.work / (name if not seed else f"{name}-seed{seed}")
            t0 = time.monotonic()
            if args.resume and finished(out, cfg):
                print(f"{name:8s} seed {seed}: kept the finished run in {out}", flush=True)
                code = 0
            elif args.no_run:
                if not (out / "metrics.jsonl").is_file():
                    continue
                code = 0
            else:
                log = io.StringIO()
                code = run(RunOptions(job_file=cfg, out_dir=out, quiet=True), log=log)
                (out / "run.log").write_text(log.getvalue())
                (out / "job.yaml").write_text(cfg.read_text())  # what --resume compares
            loads.append(os.getloadavg()[0])
            one = summarise(name, out, batch=int(yaml.safe_load(cfg.read_text())["job"]["batch_size"]))
            one["seed"] = seed
            per_seed.append(one)
            v = one.get("eval_time_to_score_s")
            print(
                f"{name:8s} seed {seed} exit {code} {one['state']} {one['steps']} steps, step {one['step_s']:.2f} s, "
                f"reward {one['reward_first10']:.3f} -> {one['reward_last10']:.3f}, wasted {one['wasted']:.3f}, "
                f"time to score {_tts(one)}, on validation {'not reached' if v is None else f'{v:.0f}'} "
                f"(final {one.get('final_eval')}) ({time.monotonic() - t0:.0f} s, load {loads[-1]:.1f})",
                flush=True,
            )
        if per_seed:
            rows.append(combine(per_seed))
    (args.work / "protocol.json").write_text(json.dumps(rows, indent=1))
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(json_rows(rows), indent=1) + "\n")
    plot(rows, args.work / "curves.png", target=args.target)
    text = table(rows) + "\n\nReward per step (mean of 3-step windows), same seeds:\n\n" + curves(rows)
    if any(r.get("eval_curve") for r in rows):
        text += "\n\nTime to score on the validation score (medians over seeds):\n\n" + eval_table(rows)
    print()
    print(text)
    if args.record:
        record(text, args, loads)
    return 0


if __name__ == "__main__":
    sys.exit(main())
