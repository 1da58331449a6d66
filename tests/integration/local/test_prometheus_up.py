"""`rollart up --with-prometheus`: Prometheus (the Debian package) starts beside a local cluster, discovers every
service from the generated targets file, scrapes them (up == 1, the ledger's counters, a recording rule
evaluated), and `rollart down` stops it with the cluster."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from rollart.job import monitoring
from rollart.local.processes import pid_alive

pytestmark = pytest.mark.skipif(shutil.which("prometheus") is None, reason="prometheus missing (apt-get install prometheus)")
BIN = Path(sys.executable).parent


def _rollart(state: Path, *args: str, timeout: float = 180) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith("ROLLART_")}
    return subprocess.run([str(BIN / "rollart"), "--state-dir", str(state), *args], capture_output=True, text=True,
                          timeout=timeout, env=env)


def _wait(url: str, expr: str, want: int, timeout: float = 60) -> list[dict]:
    deadline = time.monotonic() + timeout
    while True:
        result = monitoring.query(url, expr)
        if len(result) >= want or time.monotonic() > deadline:
            return result
        time.sleep(1)


@pytest.mark.timeout(300)
def test_up_with_prometheus_scrapes_every_service_and_down_stops_it(tmp_path: Path):
    state = tmp_path / "cluster"
    up = _rollart(state, "up", "--only", "resource-manager", "ledger", "--with-prometheus")
    try:
        assert up.returncode == 0, up.stdout + up.stderr
        prom = monitoring.info(state)
        assert prom["url"] in up.stdout and pid_alive(int(prom["pid"]))
        targets = _wait(prom["url"], 'up{job="rollart"} == 1', 2)
        assert {r["metric"]["component"] for r in targets} == {"resource-manager", "ledger"}, targets
        issued = _wait(prom["url"], 'rollart_ledger_leases_issued_total{instance_name="ledger"}', 1)
        assert issued and issued[0]["value"][1] == "0"
        # A recording rule evaluated on the scraped series (rates need two scrapes).
        assert _wait(prom["url"], "rollart:leases_issued:rate1m", 1, timeout=90)
        again = _rollart(state, "up", "--with-prometheus")
        assert again.returncode != 0  # the cluster (and its Prometheus) already run
    finally:
        down = _rollart(state, "down")
    assert down.returncode == 0, down.stdout + down.stderr
    assert not pid_alive(int(prom["pid"])) and not monitoring.info(state)
