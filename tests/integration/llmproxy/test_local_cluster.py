"""`rollart up` starts the LLMProxy with its OpenAI endpoint, following the ledger, registered for discovery."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import urllib.request
from pathlib import Path

import grpc

from rollart.local.processes import pid_alive
from rollart.runtime.auth import bearer
from rollart.v1 import llmproxy_pb2 as pp
from rollart.v1 import llmproxy_pb2_grpc as lg
from rollart.v1 import resource_manager_pb2 as rm
from rollart.v1 import resource_manager_pb2_grpc as rm_grpc

ROLLART = str(Path(sys.executable).parent / "rollart")


def rollart(state: Path, *args: str, timeout: float = 90) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith("ROLLART_")}
    return subprocess.run(
        [ROLLART, "--state-dir", str(state), *args], capture_output=True, text=True, timeout=timeout, env=env
    )


def test_rollart_up_runs_the_llmproxy_with_its_http_api(tmp_path):
    state_dir = tmp_path / "state"
    up = rollart(state_dir, "up", "--only", "resource-manager", "ledger", "llmproxy")
    assert up.returncode == 0, up.stderr + up.stdout
    pids: list[int] = []
    try:
        state = json.loads((state_dir / "state.json").read_text())
        pids = [s["pid"] for s in state["services"].values()]
        proxy = state["services"]["llmproxy"]
        base = proxy["openai_base_url"]
        assert base == f"http://{proxy['http_address']}/v1"
        token = (state_dir / "job-token").read_text().strip()
        md = [bearer(token)]
        with grpc.insecure_channel(proxy["address"]) as ch:
            status = lg.LLMProxyStub(ch).GetStatus(pp.ProxyStatusRequest(), metadata=md, timeout=10)
        assert status.openai_base_url == base and status.actors == 0
        # Discoverable through the resource manager (the reward service's judge finds it this way).
        with grpc.insecure_channel(state["services"]["resource-manager"]["address"]) as ch:
            workers = rm_grpc.ResourceManagerStub(ch).ListWorkers(
                rm.ListWorkersRequest(role="llmproxy"), metadata=md, timeout=10
            )
        assert [w.endpoint for w in workers.workers] == [proxy["address"]]
        assert workers.workers[0].labels["openai_base_url"] == base
        req = urllib.request.Request(f"{base}/models", headers={"Authorization": f"Bearer {token}"})
        with urllib.request.urlopen(req, timeout=10) as r:  # noqa: S310 - loopback
            assert json.loads(r.read()) == {"object": "list", "data": []}
        with urllib.request.urlopen(f"http://127.0.0.1:{proxy['metrics_port']}/metrics", timeout=10) as r:  # noqa: S310
            exported = r.read().decode()
        assert "rollart_llmproxy_suspended_waiters" in exported and "rollart_llmproxy_requests_total" in exported
        # It follows the ledger that `up` started.
        environ = Path(f"/proc/{proxy['pid']}/environ").read_bytes().split(b"\0")
        ledger = state["services"]["ledger"]["address"]
        assert f"ROLLART_LEDGER={ledger}".encode() in environ
    finally:
        down = rollart(state_dir, "down")
    assert down.returncode == 0, down.stdout + down.stderr
    assert not any(pid_alive(p) for p in pids)
