"""The ledger's Prometheus endpoint shows the newest registered version (dashboards compare actors with it)."""

from __future__ import annotations

import re
import urllib.request

from rollart.v1 import ledger_pb2_grpc as lg
from tests.conftest import BIN

from . import helpers as H


def _gauge(port: int) -> float | None:
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
    m = re.search(r"^rollart_ledger_latest_version ([0-9.e+-]+)$", text, re.M)
    return float(m.group(1)) if m else None


def test_latest_version_gauge_follows_registrations(services, redis_url, channel_factory, auth_md):
    proc, info = services.start(
        "ledger", [str(BIN / "rollart-ledger")], ROLLART_REDIS_URL=redis_url
    )
    stub = lg.LedgerStub(channel_factory(info["address"]))
    H.policy(stub, auth_md)
    assert _gauge(info["metrics_port"]) == 0.0  # nothing registered yet
    for v in range(3):
        H.version(stub, auth_md, v, base=-1 if v == 0 else None)
    assert _gauge(info["metrics_port"]) == 2.0
    H.version(stub, auth_md, 1)  # registering an older version again (idempotent) leaves it
    assert _gauge(info["metrics_port"]) == 2.0
