"""The ledger over a real redis-server that is SIGKILLed: every RPC (unary and an open or new WatchCommands
stream) ends UNAVAILABLE (retryable), never UNKNOWN; redis started again on its port and folder brings back
the ledger's state (AOF) and the same calls succeed without restarting the ledger."""

from __future__ import annotations

import time

import grpc
import pytest

from rollart.local.processes import start_redis
from rollart.v1 import ledger_pb2 as lp
from rollart.v1 import ledger_pb2_grpc as lg

from .conftest import start_ledger
from .helpers import acquire, policy, prompts, version

pytestmark = pytest.mark.timeout(120)


def _code(fn) -> grpc.StatusCode:
    try:
        out = fn()
        if not hasattr(out, "ByteSize"):  # a stream: read it to its end
            for _ in out:
                pass
    except grpc.RpcError as exc:
        return exc.code()
    return grpc.StatusCode.OK


def test_redis_down_is_unavailable_everywhere_and_redis_back_recovers(services, tmp_path, channel_factory, auth_md):
    redis, url = start_redis(tmp_path / "store")
    port = int(url.rsplit(":", 1)[1].split("/")[0])
    try:
        _, address = start_ledger(services, url)
        s, md = lg.LedgerStub(channel_factory(address)), auth_md
        policy(s, md)
        version(s, md, 0)
        prompts(s, md, 2, group_size=1)
        (lease,) = acquire(s, md, "env/a")
        watch = s.WatchCommands(
            lp.WatchCommandsRequest(subscriber_id="env", kind=lp.SUBSCRIBER_KIND_HOLDER), metadata=md, timeout=30
        )
        time.sleep(0.5)
        redis.kill()
        assert _code(lambda: watch) == grpc.StatusCode.UNAVAILABLE  # the open stream
        calls = {
            "WatchCommands": lambda: s.WatchCommands(
                lp.WatchCommandsRequest(subscriber_id="env", kind=lp.SUBSCRIBER_KIND_HOLDER), metadata=md, timeout=10
            ),
            "GetStatus": lambda: s.GetStatus(lp.LedgerStatusRequest(), metadata=md, timeout=10),
            "AcquireLeases": lambda: s.AcquireLeases(
                lp.AcquireLeasesRequest(holder="env/b", max_leases=1), metadata=md, timeout=10
            ),
            "RenewLease": lambda: s.RenewLease(
                lp.RenewLeaseRequest(lease_id=lease.lease_id, holder="env/a"), metadata=md, timeout=10
            ),
            "GetLease": lambda: s.GetLease(lp.GetLeaseRequest(lease_id=lease.lease_id), metadata=md, timeout=10),
            "ListVersions": lambda: s.ListVersions(lp.ListVersionsRequest(), metadata=md, timeout=10),
        }
        codes = {name: _code(fn) for name, fn in calls.items()}
        assert codes == dict.fromkeys(calls, grpc.StatusCode.UNAVAILABLE)

        redis, _ = start_redis(tmp_path / "store", port=port)  # same folder: the AOF replays
        deadline = time.monotonic() + 20
        while _code(calls["GetStatus"]) != grpc.StatusCode.OK:
            assert time.monotonic() < deadline, "the ledger did not recover"
            time.sleep(0.2)
        got = s.GetLease(lp.GetLeaseRequest(lease_id=lease.lease_id), metadata=md, timeout=10)
        assert got.holder == "env/a"
        assert len(acquire(s, md, "env/b")) == 1  # the other sample is still there
    finally:
        redis.stop()
