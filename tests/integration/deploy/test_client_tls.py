"""The CLI (`rollart health/status/resources/ledger`) and the SDK's serverless registration over TLS and mTLS,
against real services, with certificates from deploy/tls/make-certs.sh (what compose and users use)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from rollart.local.processes import ManagedProcess
from rollart.runtime.client import sync_channel
from rollart.runtime.config import TLSConfig
from rollart.v1 import common_pb2
from rollart.v1 import resource_manager_pb2 as rm
from rollart.v1 import resource_manager_pb2_grpc as rm_grpc

REPO = Path(__file__).resolve().parents[3]
BIN = Path(sys.executable).parent
MAKE_CERTS = REPO / "deploy" / "tls" / "make-certs.sh"


def make_certs(out: Path) -> dict[str, str]:
    subprocess.run(["bash", str(MAKE_CERTS), str(out)], check=True, capture_output=True)
    return {n: str(out / n) for n in ("ca.crt", "server.crt", "server.key", "client.crt", "client.key")}


@pytest.fixture(scope="module")
def pki(tmp_path_factory) -> dict[str, str]:
    return make_certs(tmp_path_factory.mktemp("pki"))


@pytest.fixture(scope="module")
def other_pki(tmp_path_factory) -> dict[str, str]:
    """A second, unrelated CA: its certificates are 'wrong' for the services above."""
    return make_certs(tmp_path_factory.mktemp("other-pki"))


def server_env(pki: dict[str, str], mtls: bool) -> dict[str, str]:
    """A service's TLS settings: its server pair, and as a client of other services the CA (and client pair)."""
    env = {
        "ROLLART_TLS__CERT_FILE": pki["server.crt"],
        "ROLLART_TLS__KEY_FILE": pki["server.key"],
        "ROLLART_TLS__CA_FILE": pki["ca.crt"],
    }
    if mtls:
        env |= {
            "ROLLART_TLS__CLIENT_CA_FILE": pki["ca.crt"],
            "ROLLART_TLS__CLIENT_CERT_FILE": pki["client.crt"],
            "ROLLART_TLS__CLIENT_KEY_FILE": pki["client.key"],
        }
    return env


def rollart(*args: str, env: dict[str, str] | None = None, token: str | None = None) -> subprocess.CompletedProcess:
    full = {k: v for k, v in os.environ.items() if not k.startswith("ROLLART_")}
    if token:
        full["ROLLART_JOB_TOKEN"] = token
    full.update(env or {})
    return subprocess.run([str(BIN / "rollart"), *args], capture_output=True, text=True, timeout=60, env=full)


def client_flags(pki: dict[str, str], mtls: bool) -> list[str]:
    flags = ["--tls-ca-file", pki["ca.crt"]]
    if mtls:
        flags += ["--tls-client-cert-file", pki["client.crt"], "--tls-client-key-file", pki["client.key"]]
    return flags


def client_env(pki: dict[str, str], mtls: bool) -> dict[str, str]:
    env = {"ROLLART_TLS__CA_FILE": pki["ca.crt"]}
    if mtls:
        env |= {"ROLLART_TLS__CLIENT_CERT_FILE": pki["client.crt"], "ROLLART_TLS__CLIENT_KEY_FILE": pki["client.key"]}
    return env


@pytest.mark.parametrize("mtls", [False, True], ids=["tls", "mtls"])
def test_cli_commands_reach_tls_services(services, redis_url, job_token, pki, other_pki, tmp_path, mtls):
    tls = server_env(pki, mtls)
    _, rm_addr = services.resource_manager(redis_url, **tls)
    _, ledger = services.start(
        "ledger", [str(BIN / "rollart-ledger")], ROLLART_REDIS_URL=redis_url, ROLLART_RESOURCE_MANAGER=rm_addr, **tls
    )
    # Plaintext cannot reach a TLS server: the health check says so instead of passing.
    plain = rollart("health", "--address", rm_addr)
    assert plain.returncode == 1 and plain.stdout.startswith("UNREACHABLE")

    # Flags, ROLLART_TLS__* and a service configuration file (its tls section) all work.
    config = tmp_path / "service.yaml"
    config.write_text(json.dumps({"listen": "0.0.0.0:1", "tls": server_env_keys(pki, mtls)}))
    for how in ("flags", "env", "config"):
        flags = client_flags(pki, mtls) if how == "flags" else ["--config", str(config)] if how == "config" else []
        env = client_env(pki, mtls) if how == "env" else {}
        health = rollart("health", "--address", rm_addr, *flags, env=env)
        assert (health.returncode, health.stdout.strip()) == (0, "SERVING"), (how, health.stdout, health.stderr)
        pools = rollart("resources", "pools", "--json", "--address", rm_addr, *flags, env=env, token=job_token)
        assert pools.returncode == 0, (how, pools.stderr)
        # The ledger registered itself (over TLS, as a client of the resource manager) in the control pool.
        assert "control" in {p["name"] for p in json.loads(pools.stdout)}
        status = rollart("ledger", "status", "--json", "--address", ledger["address"], *flags, env=env, token=job_token)
        assert status.returncode == 0 and "policy" in json.loads(status.stdout), (how, status.stderr)

    # A certificate from another CA: the server is not trusted (and under mTLS the client is refused too).
    wrong = rollart("health", "--address", rm_addr, *client_flags(other_pki, mtls))
    assert wrong.returncode == 1 and "UNREACHABLE" in wrong.stdout
    if mtls:
        # The right CA but no client certificate: the mTLS server refuses the handshake.
        no_client = rollart("health", "--address", rm_addr, "--tls-ca-file", pki["ca.crt"])
        assert no_client.returncode == 1 and "UNREACHABLE" in no_client.stdout
    # A setting that names a missing file: one line naming the key, no traceback.
    missing = rollart("health", "--address", rm_addr, env={"ROLLART_TLS__CA_FILE": str(tmp_path / "nope.crt")})
    assert missing.returncode == 1
    assert "tls.ca_file" in missing.stderr and "ROLLART_TLS__CA_FILE" in missing.stderr
    assert "Traceback" not in missing.stderr and len(missing.stderr.strip().splitlines()) == 1


def server_env_keys(pki: dict[str, str], mtls: bool) -> dict[str, str]:
    """``server_env`` as the keys of a configuration file's ``tls`` section."""
    return {k.removeprefix("ROLLART_TLS__").lower(): v for k, v in server_env(pki, mtls).items()}


def test_rollart_status_uses_tls(services, redis_url, pki, tmp_path):
    """`rollart status` checks the local cluster's services with the same settings."""
    _, rm_addr = services.resource_manager(redis_url, **server_env(pki, False))
    state = tmp_path / "state"
    state.mkdir()
    (state / "state.json").write_text(
        json.dumps(
            {
                "services": {"resource-manager": {"address": rm_addr, "pid": os.getpid()}},
                "redis": {"pid": os.getpid(), "url": redis_url},
            }
        )
    )
    plain = rollart("--state-dir", str(state), "status", "--json")
    assert plain.returncode == 1 and "UNREACHABLE" in plain.stdout
    ok = rollart("--state-dir", str(state), "status", "--json", *client_flags(pki, False))
    assert ok.returncode == 0, ok.stdout
    assert {r["service"]: r["status"] for r in json.loads(ok.stdout)}["resource-manager"] == "SERVING"


def test_serverless_registers_over_mtls_and_a_wrong_certificate_is_one_line(
    services, redis_url, job_token, pki, other_pki, tmp_path
):
    _, rm_addr = services.resource_manager(redis_url, **server_env(pki, True))
    tls = TLSConfig(ca_file=pki["ca.crt"], client_cert_file=pki["client.crt"], client_key_file=pki["client.key"])
    ch, md = sync_channel(rm_addr, token=job_token, tls=tls)
    with ch:
        pool = rm.Pool(name="sl", kind=common_pb2.POOL_KIND_SERVERLESS, capacity=8)
        rm_grpc.ResourceManagerStub(ch).RegisterPool(rm.RegisterPoolRequest(pool=pool), metadata=md, timeout=10)
    worker = "tests.integration.sdk.workers:EchoWorker"
    argv = [sys.executable, "-m", "rollart.sdk.serverless", "--worker", worker, "--name", "judge", "--pool", "sl"]
    services.start("judge", argv, ROLLART_RESOURCE_MANAGER=rm_addr, **client_env(pki, True))
    flags = client_flags(pki, True)
    deadline = time.monotonic() + 10
    workers: list = []
    while time.monotonic() < deadline:
        out = rollart("resources", "workers", "--json", "--address", rm_addr, *flags, token=job_token)
        assert out.returncode == 0, out.stderr
        workers = json.loads(out.stdout)
        if workers:
            break
        time.sleep(0.2)
    assert [(w["worker_id"], w["role"]) for w in workers] == [("serverless-judge", "judge")]

    # A client certificate from another CA: the registration fails with one line, the process exits.
    log = tmp_path / "wrong.log"
    wrong = ManagedProcess(
        "judge-wrong",
        argv,
        log_path=log,
        env=services.env(ROLLART_RESOURCE_MANAGER=rm_addr, **client_env(other_pki, True)),
    ).start()
    try:
        deadline = time.monotonic() + 30
        while wrong.proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.1)
        assert wrong.proc.returncode == 1
    finally:
        wrong.stop(timeout=5)
    # gRPC core may log the failed handshake itself (one 'Handshake failed' line); ours is the last, no traceback.
    text = log.read_text()
    ours = [ln for ln in text.splitlines() if ln.startswith("rollart.sdk.serverless:")]
    assert "Traceback" not in text and len(ours) == 1 and text.rstrip().endswith(ours[0])
    assert "registering with the resource manager" in ours[0] and "UNAVAILABLE" in ours[0]


def test_a_service_with_a_certificate_from_another_ca_names_the_settings(
    services, redis_url, pki, other_pki, tmp_path
):
    """What the compose smoke's 'wrong certificate' case sees in a container: one ERROR line that names the
    resource manager's address and the TLS settings, exit 1, no traceback."""
    _, rm_addr = services.resource_manager(redis_url, **server_env(pki, True))
    log = tmp_path / "wrong-host.log"
    argv = [sys.executable, "-m", "rollart.sdk.host", "--worker", "tests.integration.sdk.workers:EchoWorker"]
    wrong = ManagedProcess(
        "host-wrong",
        [*argv, "--pool", "p"],
        log_path=log,
        env=services.env(ROLLART_RESOURCE_MANAGER=rm_addr, **client_env(other_pki, True)),
    ).start()
    try:
        deadline = time.monotonic() + 60
        while wrong.proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.1)
        assert wrong.proc.returncode == 1
    finally:
        wrong.stop(timeout=5)
    text = log.read_text()
    errors = [json.loads(ln) for ln in text.splitlines() if ln.startswith("{") and '"level": "ERROR"' in ln]
    assert "Traceback" not in text and len(errors) == 1, text
    msg = errors[0]["msg"]
    assert msg.startswith("startup failed: ") and f"resource manager at {rm_addr}" in msg, msg
    assert "ROLLART_RESOURCE_MANAGER" in msg and "ROLLART_TLS__CA_FILE" in msg and "ROLLART_TLS__CLIENT_CERT_FILE" in msg
