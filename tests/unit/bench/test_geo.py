"""python -m bench geo without running jobs: each row's overrides, the ratios between rows, the per-step delta
bytes read from the trainer's log, the table."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench.protocol import geo

LINKS = {"train->infer": {"rate_mbps": 0.6}, "infer->train": {"rate_mbps": 0.6}}


def test_config_sets():
    assert geo.config_sets("ideal", LINKS, None) == (["cluster.regions=null"], None)
    assert geo.config_sets("rollart", LINKS, None) == ([], 0.6)
    sets, rate = geo.config_sets("full-lag4", LINKS, 2.0)
    assert rate == 2.0 and "job.publish.weight_sync=full_checkpoint" in sets and "job.alpha=4" in sets
    assert "cluster.regions.links.train->infer.rate_mbps=2.0" in sets
    with pytest.raises(ValueError, match="unknown config"):
        geo.config_sets("full-lag3", LINKS, None)


def test_ratios_and_table():
    rows = [
        {"config": "ideal", "link_mbps": None, "samples_per_second": 8.0, "step_seconds": 4.0,
         "transfer_exposed_seconds": 0.1, "generation_seconds": 5.0},
        {"config": "rollart", "link_mbps": 0.6, "samples_per_second": 7.5, "step_seconds": 4.3,
         "transfer_exposed_seconds": 0.4, "generation_seconds": 5.0, "delta_density": 0.3},
        {"config": "full-lag1", "link_mbps": 0.6, "samples_per_second": 2.5, "step_seconds": 12.8,
         "transfer_exposed_seconds": 9.0, "generation_seconds": 5.0, "full_transfer_seconds": 14.0},
    ]  # fmt: skip
    geo.add_ratios(rows)
    assert rows[1]["ratio_to_ideal"] == pytest.approx(7.5 / 8)
    assert rows[2]["rollart_speedup"] == pytest.approx(3.0) and "rollart_speedup" not in rows[1]
    assert rows[2]["window_ratio"] == pytest.approx(14.0 / 4.0)
    text = geo.table(rows)
    assert text.splitlines()[0].startswith("config") and "3.00" in text.splitlines()[3]


def test_published_delta_bytes(tmp_path: Path):
    log = tmp_path / "cluster" / "logs" / "trainer.log"
    log.parent.mkdir(parents=True)
    lines = [
        json.dumps({"msg": "version published", "version": 0, "delta_bytes": 0}),
        json.dumps({"msg": "version published", "version": 1, "delta_bytes": 1000}),
        json.dumps({"msg": "step finished", "step": 1}),
        '{"msg": "version published", broken',
        json.dumps({"msg": "version published", "version": 2, "delta_bytes": 3000}),
    ]
    log.write_text("\n".join(lines) + "\n")
    assert geo.published_delta_bytes(tmp_path) == [1000, 3000]
    assert geo.published_delta_bytes(tmp_path / "none") == []
