"""Another language: a Node.js client built from protos/ at run time calls the resource manager."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import grpc
import pytest

from rollart.v1 import resource_manager_pb2 as rm
from rollart.v1 import resource_manager_pb2_grpc as rm_grpc

NODE_DIR = Path(__file__).resolve().parents[2] / "interop" / "node"


def test_node_client_health_register_bind(services, redis_url, job_token, auth_md, channel_factory):
    node = shutil.which("node")
    if node is None or not (NODE_DIR / "node_modules" / "@grpc" / "grpc-js").exists():
        pytest.fail("Node.js client deps missing: `make setup` installs node and runs npm install in tests/interop/node")
    _, address = services.resource_manager(redis_url)
    res = subprocess.run([node, str(NODE_DIR / "client.js"), address, job_token], capture_output=True, text=True, timeout=60)
    assert res.returncode == 0, res.stderr
    out = json.loads(res.stdout.strip().splitlines()[-1])
    assert out["health"] == "SERVING"
    assert out["unauthenticated"] == "UNAUTHENTICATED"
    assert out["pool"] == {"name": "node-pool", "kind": "POOL_KIND_CPU", "up": True}
    assert out["worker"] == {"id": "node-worker", "state": "WORKER_STATE_ALIVE", "region": "js"}
    assert out["binding"] == {"id": "node-binding", "workers": ["node-worker"], "degraded": False}
    # What Node wrote is what Python reads.
    stub = rm_grpc.ResourceManagerStub(channel_factory(address))
    b = stub.GetBinding(rm.GetBindingRequest(binding_id="node-binding"), metadata=auth_md)
    assert [w.worker_id for w in b.workers] == ["node-worker"]
    with pytest.raises(grpc.RpcError):
        stub.GetBinding(rm.GetBindingRequest(binding_id="node-binding"))
