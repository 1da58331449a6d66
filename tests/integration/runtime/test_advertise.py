"""What a service registers with the resource manager is an address peers can dial (rollart.runtime.server).

A service listening on every interface (0.0.0.0, as in containers) used to register ``0.0.0.0:port``, which
nobody else can dial; now it registers this machine's address, or ``advertise`` (ROLLART_ADVERTISE) when set.
"""

from __future__ import annotations

import socket
import subprocess
import sys

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from rollart.runtime.server import advertised_address
from rollart.v1 import common_pb2
from rollart.v1 import resource_manager_pb2 as rm
from rollart.v1 import resource_manager_pb2_grpc as rm_grpc
from tests.conftest import BIN

pytestmark = pytest.mark.timeout(120)
WORKER = [sys.executable, "-m", "rollart.sdk.host", "--worker", "tests.integration.sdk.workers:EchoWorker"]


def test_advertised_address_rules(monkeypatch):
    assert advertised_address("127.0.0.1", 5, None) == "127.0.0.1:5"
    assert advertised_address("0.0.0.0", 5, "actor-2") == "actor-2:5"  # a host keeps the bound port
    assert advertised_address("0.0.0.0", 5, "actor-2:25059") == "actor-2:25059"
    assert advertised_address("[::]", 5, "[fd00::1]:7") == "[fd00::1]:7"
    monkeypatch.setattr(socket, "gethostname", lambda: "pod-a")
    monkeypatch.setattr(socket, "gethostbyname", lambda name: {"pod-a": "10.1.2.3"}[name])
    for unspecified in ("0.0.0.0", "::", "[::]", ""):
        assert advertised_address(unspecified, 50055, None) == "10.1.2.3:50055"

    def unresolvable(name: str) -> str:
        raise socket.gaierror("no such host")

    monkeypatch.setattr(socket, "gethostbyname", unresolvable)
    assert advertised_address("0.0.0.0", 50055, None) == "pod-a:50055"


def _workers(address: str, auth_md) -> dict[str, str]:
    with grpc.insecure_channel(address) as ch:
        out = rm_grpc.ResourceManagerStub(ch).ListWorkers(rm.ListWorkersRequest(), metadata=auth_md, timeout=10)
    return {w.worker_id: w.endpoint for w in out.workers}


def _serving(endpoint: str) -> bool:
    with grpc.insecure_channel(endpoint) as ch:
        got = health_pb2_grpc.HealthStub(ch).Check(health_pb2.HealthCheckRequest(), timeout=10)
    return got.status == health_pb2.HealthCheckResponse.SERVING


def test_a_service_on_every_interface_registers_an_address_that_answers(services, redis_url, auth_md):
    _, rm_address = services.resource_manager(redis_url)
    with grpc.insecure_channel(rm_address) as ch:
        rm_grpc.ResourceManagerStub(ch).RegisterPool(
            rm.RegisterPoolRequest(pool=rm.Pool(name="p", kind=common_pb2.POOL_KIND_CPU, capacity=4)),
            metadata=auth_md,
            timeout=10,
        )
    common = {"ROLLART_RESOURCE_MANAGER": rm_address}
    _, wide = services.start(
        "wide", [*WORKER, "--pool", "p", "--worker-id", "wide"], ROLLART_LISTEN="0.0.0.0:0", **common
    )
    _, named = services.start(
        "named",
        [*WORKER, "--pool", "p", "--worker-id", "named"],
        ROLLART_LISTEN="0.0.0.0:0",
        ROLLART_ADVERTISE="localhost",
        **common,
    )
    workers = _workers(rm_address, auth_md)
    wide_port, named_port = wide["address"].rpartition(":")[2], named["address"].rpartition(":")[2]
    assert workers["wide"] == f"{socket.gethostbyname(socket.gethostname())}:{wide_port}"
    assert workers["named"] == f"localhost:{named_port}"
    assert not any(e.startswith(("0.0.0.0:", "[::]:")) for e in workers.values())
    # What each registered answers (the llmproxy dials exactly this for an actor).
    assert _serving(workers["wide"]) and _serving(workers["named"])


@pytest.mark.parametrize("bad", ["0.0.0.0", "[::]:5", "host:0", "a b", "http://x/"])
def test_an_advertise_address_nobody_can_dial_is_a_config_error(services, bad):
    env = services.env(ROLLART_ADVERTISE=bad, ROLLART_REDIS_URL="redis://127.0.0.1:1/0")
    out = subprocess.run([str(BIN / "rollart-resource-manager")], env=env, capture_output=True, text=True, timeout=60)
    assert out.returncode == 1
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and "config key 'advertise' (from env ROLLART_ADVERTISE)" in lines[0], out.stderr
    assert "Traceback" not in out.stderr
