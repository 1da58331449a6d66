"""`rollart up / status / resources / health / down` as a user runs them."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import grpc
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc

from rollart.local.processes import pid_alive

ROLLART = str(Path(sys.executable).parent / "rollart")


def rollart(state: Path, *args: str, timeout: float = 60) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith("ROLLART_")}
    return subprocess.run(
        [ROLLART, "--state-dir", str(state), *args], capture_output=True, text=True, timeout=timeout, env=env
    )


def list_services(address: str) -> set[str]:
    with grpc.insecure_channel(address) as ch:
        reqs = iter([reflection_pb2.ServerReflectionRequest(list_services="")])
        answer = next(reflection_pb2_grpc.ServerReflectionStub(ch).ServerReflectionInfo(reqs, timeout=5))
        return {s.name for s in answer.list_services_response.service}


def test_up_status_reflection_resources_down(tmp_path):
    state_dir = tmp_path / "state"
    up = rollart(state_dir, "up", "--only", "resource-manager")
    assert up.returncode == 0, up.stderr + up.stdout
    try:
        state = json.loads((state_dir / "state.json").read_text())
        pids = [state["redis"]["pid"]] + [s["pid"] for s in state["services"].values()]
        assert all(pid_alive(p) for p in pids)
        assert oct((state_dir / "job-token").stat().st_mode & 0o777) == "0o600"

        status = rollart(state_dir, "status")
        assert status.returncode == 0, status.stdout
        assert "resource-manager" in status.stdout and "SERVING" in status.stdout
        rows = json.loads(rollart(state_dir, "status", "--json").stdout)
        assert {r["service"]: r["status"] for r in rows} == {"redis": "RUNNING", "resource-manager": "SERVING"}

        address = state["services"]["resource-manager"]["address"]
        assert "rollart.v1.ResourceManager" in list_services(address)
        assert rollart(state_dir, "health", "--address", address).returncode == 0

        pools = rollart(state_dir, "resources", "pools", "--json")
        assert pools.returncode == 0 and json.loads(pools.stdout) == []
        table = rollart(state_dir, "resources", "bindings")
        assert table.returncode == 0 and "BINDING_ID" in table.stdout

        again = rollart(state_dir, "up", "--only", "resource-manager")
        assert again.returncode != 0 and "already running" in again.stderr
    finally:
        down = rollart(state_dir, "down")
    assert down.returncode == 0, down.stdout + down.stderr
    assert not any(pid_alive(p) for p in pids), "rollart down left a process behind"
    assert not (state_dir / "state.json").exists()


def test_status_reports_a_killed_service_and_down_still_cleans_up(tmp_path):
    state_dir = tmp_path / "state"
    assert rollart(state_dir, "up", "--only", "resource-manager").returncode == 0
    state = json.loads((state_dir / "state.json").read_text())
    rm_pid, redis_pid = state["services"]["resource-manager"]["pid"], state["redis"]["pid"]
    os.kill(rm_pid, signal.SIGKILL)
    status = rollart(state_dir, "status")
    assert status.returncode == 1 and "DEAD" in status.stdout
    assert rollart(state_dir, "down").returncode == 0
    assert not pid_alive(redis_pid)


def test_health_of_nothing_and_bad_arguments_are_clear(tmp_path):
    from rollart.local.processes import free_port

    res = rollart(tmp_path, "health", "--address", f"127.0.0.1:{free_port()}", "--timeout", "1")
    assert res.returncode == 1 and "UNREACHABLE" in res.stdout
    res = rollart(tmp_path, "up", "--only", "no-such-service")
    assert res.returncode == 2 and "invalid choice" in res.stderr
    res = rollart(tmp_path, "status")
    assert res.returncode == 1 and "no local cluster" in res.stderr
