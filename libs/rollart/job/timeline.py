"""``timeline.png``: where each step's time goes, one lane per service kind, from the step metrics records.

The trainer's driver records, per step, wall-clock times in ``extra`` (Unix seconds): ``t_batch_ready`` (GetBatch
returned), ``t_update_start``/``t_update_end`` (the UPDATE phase), ``t_publish_start``/``t_publish_end`` (the
publication of the version that update made active), ``t_train_start``/``t_train_end``, and
``t_rollout_start``/``t_rollout_end`` (the first start and last end of the batch's trajectories); with
``checkpoint_seconds`` and ``update_pause_seconds`` that is enough to draw:

- trainer: waiting for the batch, training, checkpoint;
- relay / weights: publishing a version, the UPDATE that makes it active;
- actors: the rollout of each batch (alternate rows: batches overlap in asynchronous modes) and the pause of
  generation at the update;
- reward: from the batch's last trajectory to the batch being ready (the scores the batch waited for), for
  steps whose trainer waited for its batch.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

LANES = ("trainer", "relay / weights", "actors", "reward")
COLOURS = {
    "wait for batch": "#d9d9d9",
    "train": "#4c72b0",
    "checkpoint": "#8172b2",
    "publish": "#55a868",
    "update": "#ccb974",
    "rollout": "#64b5cd",
    "pause": "#c44e52",
    "reward": "#dd8452",
}


def spans(records: list[dict[str, Any]]) -> list[tuple[str, str, float, float, int]]:
    """(lane, kind, start, end, step) bars in Unix seconds; parts a record lacks are left out."""
    out: list[tuple[str, str, float, float, int]] = []
    for r in records:
        x = r.get("extra") or {}
        step = int(r["step"])
        start = float(r.get("started_at") or 0.0)

        def bar(lane: str, kind: str, a: float | None, b: float | None, step: int = step) -> None:
            if a and b and b > a:
                out.append((lane, kind, float(a), float(b), step))

        bar("trainer", "wait for batch", start, x.get("t_batch_ready"))
        bar("trainer", "train", x.get("t_train_start"), x.get("t_train_end"))
        end_train = x.get("t_train_end")
        if end_train:
            bar("trainer", "checkpoint", end_train, end_train + float(r.get("checkpoint_seconds") or 0.0))
        bar("relay / weights", "publish", x.get("t_publish_start"), x.get("t_publish_end"))
        bar("relay / weights", "update", x.get("t_update_start"), x.get("t_update_end"))
        bar("actors", "rollout", x.get("t_rollout_start"), x.get("t_rollout_end"))
        pause = float(r.get("update_pause_seconds") or 0.0)
        if x.get("t_update_end") and pause > 0:
            bar("actors", "pause", x["t_update_end"] - pause, x["t_update_end"])
        if float(r.get("get_batch_seconds") or 0.0) >= 0.2:
            # The trainer waited for the batch: it was ready when its last score landed. (A batch ready before
            # the trainer asked says nothing about when its scores came: no bar.)
            bar("reward", "reward", x.get("t_rollout_end"), x.get("t_batch_ready"))
    return out


def plot_timeline(records: list[dict[str, Any]], path: Path, title: str) -> bool:
    """Writes the PNG; False when matplotlib is missing or there is nothing to draw."""
    recs = sorted(records, key=lambda r: r["step"])
    bars = spans(recs)
    if not bars:
        return False
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    t0 = min(min(b[2] for b in bars), float(recs[0].get("started_at") or bars[0][2]))
    # Two rows per lane: consecutive steps alternate, so overlapping rollouts of two batches stay visible.
    fig, ax = plt.subplots(figsize=(max(8.0, min(40.0, 0.6 * len(recs) + 6)), 4.2), dpi=110)
    yticks, ylabels = [], []
    for i, lane in enumerate(LANES):
        base = (len(LANES) - 1 - i) * 3
        yticks.append(base + 1.0)
        ylabels.append(lane)
        for ln, kind, a, b, step in bars:
            if ln != lane:
                continue
            row = base + (0.0 if step % 2 else 1.0)
            height = 0.9
            if kind == "pause":
                row, height = base, 1.9  # across both rows: no token on any actor
            ax.broken_barh([(a - t0, b - a)], (row, height), facecolors=COLOURS[kind], edgecolor="none")
    for r in recs:
        end = float(r.get("finished_at") or 0.0)
        if end:
            ax.axvline(end - t0, color="#888888", linewidth=0.5, linestyle=":")
    ax.set_yticks(yticks)
    ax.set_yticklabels(ylabels)
    ax.set_xlabel("wall time, s (dotted: end of a step)")
    ax.set_title(title)
    handles = [plt.Rectangle((0, 0), 1, 1, color=c) for c in COLOURS.values()]
    ax.legend(handles, list(COLOURS), loc="upper center", bbox_to_anchor=(0.5, -0.2), ncol=8, fontsize=7)
    ax.grid(axis="x", alpha=0.3)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path)
    plt.close(fig)
    return True
