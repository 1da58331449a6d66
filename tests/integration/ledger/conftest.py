"""Fixtures for the ledger: a real rollart-ledger process over a real redis-server."""

from __future__ import annotations

from dataclasses import dataclass

import grpc
import pytest

from rollart.v1 import ledger_pb2_grpc as lg
from tests.conftest import BIN


@dataclass
class LedgerEnv:
    proc: object
    address: str
    stub: lg.LedgerStub
    md: list[tuple[str, str]]
    redis_url: str


def start_ledger(services, redis_url: str, **env: str):
    env.setdefault("ROLLART_REAP_INTERVAL_SECONDS", "0.05")
    env.setdefault("ROLLART_POLL_INTERVAL_SECONDS", "0.05")
    proc, info = services.start("ledger", [str(BIN / "rollart-ledger")], ROLLART_REDIS_URL=redis_url, **env)
    return proc, info["address"]


@pytest.fixture
def ledger(services, redis_url, channel_factory, auth_md) -> LedgerEnv:
    proc, address = start_ledger(services, redis_url)
    return LedgerEnv(proc, address, lg.LedgerStub(channel_factory(address)), auth_md, redis_url)


@pytest.fixture
def rpc_error():
    """Run a call that must fail; returns the grpc.RpcError."""

    def run(fn, *args, **kwargs) -> grpc.RpcError:
        with pytest.raises(grpc.RpcError) as exc:
            fn(*args, **kwargs)
        return exc.value

    return run
