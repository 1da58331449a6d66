"""The ledger registers with the resource manager (role "ledger") so the other services can find it."""

from __future__ import annotations

import time

from rollart.v1 import resource_manager_pb2 as rm
from rollart.v1 import resource_manager_pb2_grpc as rm_grpc
from tests.integration.ledger.conftest import start_ledger


def test_ledger_is_discoverable_and_leaves_on_sigterm(services, redis_url, channel_factory, auth_md):
    _, rm_addr = services.resource_manager(redis_url)
    proc, address = start_ledger(services, redis_url.rsplit("/", 1)[0] + "/1", ROLLART_RESOURCE_MANAGER=rm_addr)
    stub = rm_grpc.ResourceManagerStub(channel_factory(rm_addr))
    workers = stub.ListWorkers(rm.ListWorkersRequest(role="ledger"), metadata=auth_md).workers
    assert [w.endpoint for w in workers] == [address]
    proc.stop()
    deadline = time.monotonic() + 5
    while stub.ListWorkers(rm.ListWorkersRequest(role="ledger"), metadata=auth_md).workers:
        assert time.monotonic() < deadline, "the ledger did not deregister on SIGTERM"
        time.sleep(0.05)
