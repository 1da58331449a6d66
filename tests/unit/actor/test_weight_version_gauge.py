"""The actor's rollart_actor_weight_version gauge (the dashboard's per-actor version) follows the active version:
the loaded one at start, a committed one after, unchanged by a refused commit; as Prometheus scrapes it."""

from __future__ import annotations

import asyncio
from pathlib import Path

from prometheus_client import REGISTRY, generate_latest

from rollart.delta import load_safetensors
from rollart.v1 import common_pb2
from tests.unit.actor.actor_testlib import delta_segments, layer_projections, perturb
from tests.unit.actor.test_actor_weights import _setup, model  # noqa: F401 - the model fixture

NAME = "rollart_actor_weight_version"


def _scraped() -> float | None:
    for line in generate_latest(REGISTRY).decode().splitlines():
        if line.startswith(NAME + " "):
            return float(line.split()[1])
    return None


def test_the_gauge_is_the_active_version(model: Path, tmp_path: Path) -> None:  # noqa: F811
    host, engine, mgr = _setup(model, tmp_path)
    assert REGISTRY.get_sample_value(NAME) == 0.0 == _scraped()
    base = load_safetensors(model / "model.safetensors")
    v1 = perturb(base, layer_projections(base, 1), seed=1)
    msgs, h1 = delta_segments(base, v1, version=1, base_version=0)
    for m in msgs:
        mgr.stage_segment(m)
    outcome, _ = asyncio.run(mgr.commit(common_pb2.CommitOrder(order_id="o1", version=1, hash=h1)))
    assert outcome.error is None and host.version == 1
    assert REGISTRY.get_sample_value(NAME) == 1.0 == _scraped()
    v2 = perturb(v1, layer_projections(v1, 0), seed=2)
    v1.applied_hash = h1
    msgs2, _h2 = delta_segments(v1, v2, version=2, base_version=1)
    for m in msgs2:
        mgr.stage_segment(m)
    bad, _ = asyncio.run(mgr.commit(common_pb2.CommitOrder(order_id="o2", version=2, hash=b"\x01" * 32)))
    assert bad.error is not None and host.version == 1  # a refused commit: the engine still serves v1
    assert REGISTRY.get_sample_value(NAME) == 1.0 == _scraped()
