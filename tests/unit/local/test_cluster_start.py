"""How `up` starts the instances of a service: side by side when the service asks for it (each then waited
for), and none left running when one of them fails. The service is a stand-in script (this tests the launcher,
not a service); redis is the real redis-server."""

from __future__ import annotations

import os
import stat
import time
from pathlib import Path

import pytest

from rollart.local import cluster as local
from rollart.local.processes import ProcessError, pid_alive

# Writes its ready file after a second (the address is not dialled); exits 3 at once when told to fail.
SCRIPT = """#!/usr/bin/env python3
import json, os, sys, time
if os.environ.get("FAIL_INSTANCE") and os.environ["ROLLART_READY_FILE"].endswith(os.environ["FAIL_INSTANCE"] + ".ready"):
    sys.exit(3)
with open(os.environ["STARTS"], "a") as f:
    f.write(f"{time.time()}\\n")
time.sleep(1.0)
os.makedirs(os.path.dirname(os.environ["ROLLART_READY_FILE"]), exist_ok=True)
open(os.environ["ROLLART_READY_FILE"], "w").write(json.dumps({"address": "127.0.0.1:1", "metrics_port": None}))
time.sleep(600)
"""


@pytest.fixture
def stand_in(tmp_path, monkeypatch):
    script = tmp_path / "bin" / "rollart-standin"
    script.parent.mkdir()
    script.write_text(SCRIPT)
    script.chmod(script.stat().st_mode | stat.S_IEXEC)
    monkeypatch.setenv("PATH", f"{script.parent}:{os.environ['PATH']}")
    monkeypatch.setenv("STARTS", str(tmp_path / "starts"))
    monkeypatch.setattr(local, "find_script", lambda name: str(script) if name == "rollart-standin" else None)

    def services(together: bool) -> None:
        spec = local.ServiceSpec("actor", "rollart-standin", start_together=together)
        monkeypatch.setattr(local, "SERVICES", [spec])
        monkeypatch.setattr(local, "SERVICE_NAMES", ["actor"])

    return services


@pytest.mark.parametrize("together", [True, False])
def test_instances_start_side_by_side_only_when_asked(tmp_path, stand_in, together):
    stand_in(together)
    state_dir = tmp_path / "cluster"
    t0 = time.monotonic()
    state = local.up(state_dir, replicas={"actor": 3}, log=lambda _m: None, with_mooncake=False)
    took = time.monotonic() - t0
    try:
        assert list(state["services"]) == ["actor", "actor-2", "actor-3"]
        starts = [float(x) for x in (tmp_path / "starts").read_text().split()]
        spread = max(starts) - min(starts)
        if together:
            assert spread < 0.9 and took < 2.9, (spread, took)  # all three waited out their second at once
        else:
            assert spread > 1.9 and took > 3.0, (spread, took)  # one after the other
    finally:
        assert local.down(state_dir, log=lambda _m: None)


def test_a_failing_instance_leaves_nothing_running(tmp_path, stand_in, monkeypatch):
    stand_in(True)
    monkeypatch.setenv("FAIL_INSTANCE", "actor-2")
    state_dir = tmp_path / "cluster"
    with pytest.raises(ProcessError, match="actor-2 exited with code 3"):
        local.up(state_dir, replicas={"actor": 3}, log=lambda _m: None, with_mooncake=False)
    time.sleep(0.2)
    # actor and actor-3 had started (not yet ready) when actor-2 failed: both stopped with redis.
    pids = [int(p.name) for p in Path("/proc").iterdir() if p.name.isdigit()]
    mine = []
    for pid in pids:
        try:
            cmd = (Path("/proc") / str(pid) / "cmdline").read_bytes()
        except OSError:
            continue
        if str(tmp_path).encode() in cmd and pid_alive(pid):
            mine.append((pid, cmd))
    assert mine == []
