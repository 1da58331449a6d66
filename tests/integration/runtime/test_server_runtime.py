"""The shared server runtime, seen from outside real processes: traces, metrics, reflection, health, TLS/mTLS."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc

from rollart.runtime import telemetry
from rollart.runtime.config import TLSConfig, TracingConfig
from rollart.v1 import common_pb2, worker_pb2, worker_pb2_grpc
from rollart.v1 import resource_manager_pb2 as rm
from rollart.v1 import resource_manager_pb2_grpc as rm_grpc


def read_spans(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def test_one_trace_across_three_processes_with_trajectory_baggage(services, redis_url, job_token, tmp_path):
    rm_trace, worker_trace, me_trace = tmp_path / "rm.jsonl", tmp_path / "worker.jsonl", tmp_path / "me.jsonl"
    rm_proc, rm_addr = services.resource_manager(
        redis_url, ROLLART_TRACING__EXPORTER="file", ROLLART_TRACING__FILE=str(rm_trace)
    )
    ch = grpc.insecure_channel(rm_addr)
    rm_grpc.ResourceManagerStub(ch).RegisterPool(
        rm.RegisterPoolRequest(pool=rm.Pool(name="p", kind=common_pb2.POOL_KIND_CPU, capacity=4)),
        metadata=[("authorization", f"Bearer {job_token}")],
    )
    ch.close()
    # The worker calls the resource manager from inside the call (its address comes from its environment).
    _, info = services.start(
        "worker",
        [
            sys.executable,
            "-m",
            "rollart.sdk.host",
            "--worker",
            "tests.integration.sdk.workers:EchoWorker",
            "--pool",
            "p",
        ],
        ROLLART_TRACING__EXPORTER="file",
        ROLLART_TRACING__FILE=str(worker_trace),
        ROLLART_RESOURCE_MANAGER=rm_addr,
    )
    telemetry.setup_tracing("test-client", TracingConfig(exporter="file", file=me_trace))
    from rollart.runtime.client import channel

    async def call() -> int:
        ch = channel(info["address"], token=job_token)
        try:
            with telemetry.tracer("test").start_as_current_span("rollout-step"):
                with telemetry.trajectory_scope("traj-42"):
                    resp = await worker_pb2_grpc.ClusterWorkerStub(ch).Invoke(worker_pb2.InvokeRequest(method="chain"))
            return json.loads(resp.result_json)
        finally:
            await ch.close()

    assert asyncio.run(call()) == 1  # the pool registered above
    telemetry._provider.force_flush()
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline and not any(
        s["name"].endswith("ListPools") and s["kind"] == "SERVER" for s in read_spans(rm_trace)
    ):
        time.sleep(0.05)
    mine = [s for s in read_spans(me_trace) if s["name"] == "rollout-step"]
    worker_server = [s for s in read_spans(worker_trace) if s["name"].endswith("Invoke") and s["kind"] == "SERVER"]
    rm_server = [s for s in read_spans(rm_trace) if s["name"].endswith("ListPools") and s["kind"] == "SERVER"]
    assert mine and worker_server and rm_server
    trace_id = mine[0]["trace_id"]
    assert worker_server[-1]["trace_id"] == trace_id
    assert rm_server[-1]["trace_id"] == trace_id
    # Parent links: the resource manager's server span hangs off the worker's client span.
    worker_clients = {s["span_id"] for s in read_spans(worker_trace) if s["kind"] == "CLIENT"}
    assert rm_server[-1]["parent_span_id"] in worker_clients
    # The trajectory id travelled as baggage through both hops.
    assert worker_server[-1]["attributes"]["rollart.trajectory_id"] == "traj-42"
    assert rm_server[-1]["attributes"]["rollart.trajectory_id"] == "traj-42"


def test_metrics_reflection_and_unauthenticated_health(services, redis_url, channel_factory, auth_md):
    _, info = services.start(
        "resource-manager",
        [str(Path(sys.executable).parent / "rollart-resource-manager")],
        ROLLART_REDIS_URL=redis_url,
    )
    ch = channel_factory(info["address"])
    # Health needs no token.
    resp = health_pb2_grpc.HealthStub(ch).Check(health_pb2.HealthCheckRequest(service="rollart.v1.ResourceManager"))
    assert resp.status == health_pb2.HealthCheckResponse.SERVING
    # Reflection lists the rollart.v1 service, like grpcurl would.
    reqs = iter([reflection_pb2.ServerReflectionRequest(list_services="")])
    answer = next(reflection_pb2_grpc.ServerReflectionStub(ch).ServerReflectionInfo(reqs))
    names = {s.name for s in answer.list_services_response.service}
    assert "rollart.v1.ResourceManager" in names and "grpc.health.v1.Health" in names
    # Metrics count calls by method and status.
    stub = rm_grpc.ResourceManagerStub(ch)
    stub.ListPools(rm.ListPoolsRequest(), metadata=auth_md)
    with pytest.raises(grpc.RpcError):
        stub.ListPools(rm.ListPoolsRequest())
    ok = 'rollart_rpc_total{code="OK",method="/rollart.v1.ResourceManager/ListPools",service="resource-manager"}'
    refused = 'code="UNAUTHENTICATED",method="/rollart.v1.ResourceManager/ListPools"'
    # The server counts a call after its status has gone out, so the client can see the error first: poll.
    deadline = time.monotonic() + 10
    while True:
        body = urllib.request.urlopen(f"http://127.0.0.1:{info['metrics_port']}/metrics", timeout=5).read().decode()
        if (ok in body and refused in body) or time.monotonic() > deadline:
            break
        time.sleep(0.05)
    assert ok in body
    assert refused in body
    assert "rollart_rpc_seconds_bucket" in body


def _openssl(*args: str, cwd: Path) -> None:
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True)


def make_pki(d: Path) -> dict[str, Path]:
    """A CA, a server certificate for 127.0.0.1/localhost and a client certificate."""
    d.mkdir(parents=True, exist_ok=True)
    _openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2", "-subj", "/CN=rollart-test-ca",
             "-keyout", "ca.key", "-out", "ca.crt", cwd=d)  # fmt: skip
    (d / "san.ext").write_text("subjectAltName=DNS:localhost,IP:127.0.0.1\n")
    for name in ("server", "client"):
        _openssl("req", "-newkey", "rsa:2048", "-nodes", "-subj", f"/CN={name}", "-keyout", f"{name}.key",
                 "-out", f"{name}.csr", cwd=d)  # fmt: skip
        _openssl("x509", "-req", "-in", f"{name}.csr", "-CA", "ca.crt", "-CAkey", "ca.key", "-CAcreateserial",
                 "-days", "2", "-extfile", "san.ext", "-out", f"{name}.crt", cwd=d)  # fmt: skip
    return {n: d / n for n in ("ca.crt", "server.crt", "server.key", "client.crt", "client.key")}


async def _list_pools(address: str, token: str, tls: TLSConfig | None) -> int:
    from rollart.runtime.client import channel

    ch = channel(address, token=token, tls=tls, default_timeout=3)
    try:
        return len((await rm_grpc.ResourceManagerStub(ch).ListPools(rm.ListPoolsRequest())).pools)
    finally:
        await ch.close()


def test_mtls_requires_a_client_certificate(services, redis_url, job_token, tmp_path):
    pki = make_pki(tmp_path / "pki")
    _, info = services.start(
        "resource-manager",
        [str(Path(sys.executable).parent / "rollart-resource-manager")],
        ROLLART_REDIS_URL=redis_url,
        ROLLART_TLS__CERT_FILE=str(pki["server.crt"]),
        ROLLART_TLS__KEY_FILE=str(pki["server.key"]),
        ROLLART_TLS__CLIENT_CA_FILE=str(pki["ca.crt"]),
    )
    addr = info["address"]
    full = TLSConfig(ca_file=pki["ca.crt"], client_cert_file=pki["client.crt"], client_key_file=pki["client.key"])
    assert asyncio.run(_list_pools(addr, job_token, full)) == 0
    # TLS without a client certificate, and plaintext, are refused.
    for tls in (TLSConfig(ca_file=pki["ca.crt"]), None):
        with pytest.raises(grpc.aio.AioRpcError) as exc:
            asyncio.run(_list_pools(addr, job_token, tls))
        assert exc.value.code() == grpc.StatusCode.UNAVAILABLE
    # A valid certificate does not replace the job token.
    with pytest.raises(grpc.aio.AioRpcError) as exc:
        asyncio.run(_list_pools(addr, "wrong", full))
    assert exc.value.code() == grpc.StatusCode.UNAUTHENTICATED
