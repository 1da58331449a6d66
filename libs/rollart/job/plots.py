"""``rollart run``'s reward curve (``reward.png``); the timeline is in ``timeline.py``. matplotlib is optional:
without it nothing is drawn."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from .metrics import task_rewards


def plot_rewards(records: list[dict[str, Any]], path: Path, title: str,
                 validation: list[dict[str, Any]] | None = None) -> bool:
    """The reward curve (mean ± std per step, and its 10-step moving average) as a PNG; with ``validation`` rows
    (rollart.job.evaluation) the validation curve beside it, on the same steps."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    steps = [r["step"] for r in records]
    mean = [r.get("reward_mean", 0.0) for r in records]
    std = [r.get("reward_std", 0.0) for r in records]
    avg = [sum(mean[max(0, i - 9) : i + 1]) / len(mean[max(0, i - 9) : i + 1]) for i in range(len(mean))]
    if validation:
        fig, (ax, vax) = plt.subplots(1, 2, figsize=(12, 4), dpi=110, sharex=True)
        from .evaluation import draw_validation

        draw_validation(vax, validation)
    else:
        fig, ax = plt.subplots(figsize=(7, 4), dpi=110)
    lo = [max(m - s, r.get("reward_min", m - s)) for m, s, r in zip(mean, std, records)]
    hi = [min(m + s, r.get("reward_max", m + s)) for m, s, r in zip(mean, std, records)]
    ax.fill_between(steps, lo, hi, alpha=0.15, label="± std (within min..max)")
    ax.plot(steps, mean, marker=".", linewidth=1, label="batch mean reward")
    ax.plot(steps, avg, linewidth=2, label="10-step moving average")
    for task, points in sorted(task_rewards(records).items()):  # multi-task jobs: one curve per task
        xs = [p[0] for p in points]
        ys = [p[1] for p in points]
        ma = [sum(ys[max(0, i - 9) : i + 1]) / len(ys[max(0, i - 9) : i + 1]) for i in range(len(ys))]
        line = ax.plot(xs, ys, linewidth=0.8, alpha=0.5, marker=".")[0]
        ax.plot(xs, ma, linewidth=2, color=line.get_color(), label=f"{task} (10-step average)")
    ax.set_xlabel("step")
    ax.set_ylabel("reward")
    ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend(loc="best")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path)
    plt.close(fig)
    return True
