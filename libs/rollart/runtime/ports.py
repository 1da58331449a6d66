"""Default ports of the RollArt services: the one table the code, deploy/ and the docs follow.

Config defaults (``listen``) come from here; docker-compose.yml, deploy/docker/Dockerfile, deploy/k8s and the
port tables in deploy/README.md and docs/architecture.md are checked against it by
tests/unit/deploy/test_manifests.py. Locally (``rollart up``, tests) every service binds port 0 instead.
"""

from __future__ import annotations

#: gRPC port of each service (the order is the order of the tables in the docs).
GRPC_PORTS: dict[str, int] = {
    "resource-manager": 50051,
    "ledger": 50052,
    "relay": 50053,
    "trainer": 50054,
    "actor": 50055,
    "llmproxy": 50056,
    "envmanager": 50057,
    "reward": 50058,
}

#: A weight-plane service's striped-TCP data endpoint is its gRPC port plus this.
DATA_PORT_OFFSET = 10

#: Ports a deployment publishes besides gRPC and metrics: the relay's data endpoint (subscribers dial it),
#: the llmproxy's OpenAI-compatible HTTP API.
EXTRA_PORTS: dict[str, dict[str, int]] = {
    "relay": {"data": GRPC_PORTS["relay"] + DATA_PORT_OFFSET},
    "llmproxy": {"http": 8000},
}

#: Prometheus /metrics of every container (locally: port 0).
METRICS_PORT = 9100

#: The Mooncake master (full-weight buckets) in the compose topology.
MOONCAKE_MASTER_PORT = 50088


def data_port(service: str) -> int:
    """The striped-TCP data port of ``relay`` or ``trainer``."""
    if service not in ("relay", "trainer"):
        raise KeyError(f"{service} has no data endpoint")
    return GRPC_PORTS[service] + DATA_PORT_OFFSET


def listen(service: str, host: str = "127.0.0.1") -> str:
    """``host:port`` of ``service``'s default gRPC listen address (its config's ``listen`` default)."""
    return f"{host}:{GRPC_PORTS[service]}"
