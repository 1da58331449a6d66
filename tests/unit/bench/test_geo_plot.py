"""bench/protocol/geo_plot.py from synthetic rows: which steps and rows the timeline shows, and both PNGs."""

from __future__ import annotations

from pathlib import Path

from bench.protocol import geo_plot


def _timeline(n: int, transfer: float) -> list[dict]:
    return [{"step": s, "step_seconds": 5.0 + transfer, "generation_seconds": 3.5, "train_seconds": 1.2,
             "transfer_exposed_seconds": transfer} for s in range(1, n + 1)]  # fmt: skip


def _rows() -> list[dict]:
    rows = [{"config": "ideal", "link_mbps": None, "step_seconds": 5.0, "transfer_exposed_seconds": 0.1,
             "reference": True, "timeline": _timeline(7, 0.1)}]  # fmt: skip
    for mbps in (0.15, 0.6, 6.0):
        for mode, transfer in (("rollart", 0.5 + 0.3 / mbps), ("full-lag1", 16.8 / mbps)):
            rows.append({"config": mode, "link_mbps": mbps, "step_seconds": 4.7 + transfer, "reference": mbps == 0.6,
                         "transfer_exposed_seconds": transfer, "timeline": _timeline(7, transfer)})  # fmt: skip
    return rows


def test_five_steps_and_the_rows_a_timeline_shows():
    tl = _timeline(9, 1.0)
    assert [s["step"] for s in geo_plot.five_steps(tl)] == [3, 4, 5, 6, 7]
    assert [s["step"] for s in geo_plot.five_steps(tl[:5])] == [1, 2, 3, 4, 5]  # too few from step 3
    rows = _rows()
    shown = geo_plot.timeline_rows(rows)
    assert [(r["config"], r["link_mbps"]) for r in shown] == [("ideal", None), ("rollart", 0.6), ("full-lag1", 0.6)]
    unref = [dict(r, reference=False) for r in rows]
    assert {r["link_mbps"] for r in geo_plot.timeline_rows(unref)} == {None, 0.15}  # no reference: the slowest
    one_rate = [r for r in rows if r["link_mbps"] in (None, 6.0)]
    assert geo_plot.timeline_rows(one_rate) == one_rate
    assert geo_plot.label(rows[1], True) == "rollart @ 0.15 Mbit/s" and geo_plot.label(rows[1], False) == "rollart"


def test_pngs(tmp_path: Path):
    rows = _rows()
    assert geo_plot.plot_bandwidth(rows, tmp_path / "bw.png")
    assert geo_plot.plot_timeline(rows, tmp_path / "tl.png")
    for name in ("bw.png", "tl.png"):
        assert (tmp_path / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    one_rate = [r for r in rows if r["link_mbps"] in (None, 0.6)]
    assert not geo_plot.plot_bandwidth(one_rate, tmp_path / "none.png") and not (tmp_path / "none.png").exists()
    assert not geo_plot.plot_timeline([{"config": "x", "timeline": []}], tmp_path / "none.png")
