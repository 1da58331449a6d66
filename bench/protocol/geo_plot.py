"""The PNGs of ``python -m bench geo`` (issue 26), drawn from its rows alone (each row's ``timeline``: its steps as
metrics.jsonl recorded them), so they can be drawn again from a saved JSON:

- ``plot_bandwidth``: step time and weight transfer exposed per step against the link's rate (log x), one line
  per mode, the ideal row (no link) as a horizontal line; only with two rates or more (a sweep);
- ``plot_timeline``: five consecutive steps per row (from step 3), each step its generation, training and
  exposed weight transfer one after the other on a time axis (the seed's execution timeline); in a sweep, the
  rows at the job file's rate (else the slowest) and the ideal row.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

PARTS = (  # (timeline key, legend, colour)
    ("generation_seconds", "generation (wait for the batch)", "tab:blue"),
    ("train_seconds", "training", "tab:orange"),
    ("transfer_exposed_seconds", "weight transfer exposed", "tab:red"),
)


def label(row: dict[str, Any], several_rates: bool) -> str:
    name = row["config"]
    if several_rates and row.get("link_mbps") is not None:
        name += f" @ {row['link_mbps']:g} Mbit/s"
    if row.get("faults"):
        name += " + faults"
    return name


def rates(rows: list[dict[str, Any]]) -> list[float]:
    return sorted({float(r["link_mbps"]) for r in rows if r.get("link_mbps") is not None})


def five_steps(timeline: list[dict[str, Any]], first: int = 3, n: int = 5) -> list[dict[str, Any]]:
    """``n`` consecutive steps from step ``first`` (fewer steps: the last ``n`` there are)."""
    steps = sorted(timeline, key=lambda s: s["step"])
    later = [s for s in steps if s["step"] >= first]
    return later[:n] if len(later) >= n else steps[-n:]


def timeline_rows(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The rows a timeline shows: all of them, or in a sweep those at one rate (the reference, else the slowest)
    with the rows without a link."""
    rs = rates(rows)
    if len(rs) <= 1:
        return [r for r in rows if r.get("timeline")]
    ref = [float(r["link_mbps"]) for r in rows if r.get("reference") and r.get("link_mbps") is not None]
    rate = ref[0] if ref else rs[0]
    return [r for r in rows if r.get("timeline") and r.get("link_mbps") in (None, rate)]


def _pyplot():  # noqa: ANN202
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    return plt


def _save(fig, path: Path, plt) -> None:  # noqa: ANN001
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path)
    plt.close(fig)


def plot_bandwidth(rows: list[dict[str, Any]], path: Path) -> bool:
    """Step time and transfer exposed against bandwidth per mode; False (nothing drawn) under two rates."""
    plt = _pyplot()
    if plt is None or len(rates(rows)) < 2:
        return False
    fig, (ax, bx) = plt.subplots(1, 2, figsize=(12, 4.4), dpi=110)
    colors = plt.get_cmap("tab10")
    modes = list(dict.fromkeys(r["config"] for r in rows if r.get("link_mbps") is not None and not r.get("faults")))
    for i, mode in enumerate(modes):
        pts = sorted(
            (float(r["link_mbps"]), r) for r in rows if r["config"] == mode and r.get("link_mbps") is not None
            and not r.get("faults") and r.get("state") in (None, "COMPLETED")
        )  # fmt: skip
        xs = [x for x, _ in pts]
        ax.plot(xs, [r["step_seconds"] for _, r in pts], marker="o", color=colors(i % 10), label=mode)
        bx.plot(xs, [r["transfer_exposed_seconds"] for _, r in pts], marker="o", color=colors(i % 10), label=mode)
    for r in rows:
        if r.get("link_mbps") is None:
            ax.axhline(r["step_seconds"], color="grey", ls="--", lw=1, label=f"{r['config']} (no link)")
            bx.axhline(r["transfer_exposed_seconds"], color="grey", ls="--", lw=1, label=f"{r['config']} (no link)")
    from matplotlib.ticker import FormatStrFormatter, NullFormatter

    for a, what in ((ax, "step time, s (median, steps 3..N)"), (bx, "weight transfer exposed per step, s")):
        a.set_xscale("log")
        a.set_xticks(rates(rows))  # the sweep's rates, not decades
        a.xaxis.set_major_formatter(FormatStrFormatter("%g"))
        a.xaxis.set_minor_formatter(NullFormatter())
        a.set_xlabel("link rate each way, Mbit/s (log)")
        a.set_ylabel(what)
        a.set_ylim(bottom=0)
        a.grid(alpha=0.3, which="both")
        a.legend(fontsize=7)
    ax.set_title("step time against bandwidth")
    bx.set_title("transfer on the critical path against bandwidth")
    _save(fig, path, plt)
    return True


def plot_timeline(rows: list[dict[str, Any]], path: Path, first: int = 3, n: int = 5) -> bool:
    """Five consecutive steps per row, each step's parts in turn on one lane; False when no row has steps."""
    plt = _pyplot()
    shown = timeline_rows(rows)
    if plt is None or not shown:
        return False
    several = len(rates(rows)) > 1
    fig, ax = plt.subplots(figsize=(12, 0.7 * len(shown) + 2.0), dpi=110)
    for lane, r in enumerate(shown):
        t = 0.0
        for s in five_steps(r["timeline"], first, n):
            at = t
            for key, _, color in PARTS:
                d = max(0.0, float(s.get(key) or 0.0))
                if d:
                    ax.broken_barh([(at, d)], (lane - 0.35, 0.7), facecolors=color)
                at += d
            step = max(float(s["step_seconds"]), at - t)
            if step > at - t:  # the rest of the step (checkpoint, bookkeeping)
                ax.broken_barh([(at, step - (at - t))], (lane - 0.35, 0.7), facecolors="lightgrey")
            ax.annotate(str(s["step"]), (t + 0.1, lane + 0.38), fontsize=6, va="bottom")
            ax.plot([t, t], [lane - 0.4, lane + 0.4], color="black", lw=0.6)
            t += step
    ax.set_yticks(range(len(shown)), [label(r, several) for r in shown], fontsize=8)
    ax.invert_yaxis()
    ax.set_xlabel(f"seconds from the start of step {first} (each bar: one step; numbers: the step)")
    ax.set_title("execution timeline: five consecutive steps per mode")
    handles = [plt.Rectangle((0, 0), 1, 1, color=c) for _, _, c in PARTS]
    handles.append(plt.Rectangle((0, 0), 1, 1, color="lightgrey"))
    ax.legend(handles, [lab for _, lab, _ in PARTS] + ["rest of the step"], fontsize=7, ncol=4,
              loc="upper center", bbox_to_anchor=(0.5, -0.22))  # fmt: skip
    ax.grid(alpha=0.3, axis="x")
    _save(fig, path, plt)
    return True
