"""The server runtime under hostile or careless callers: token-less requests are refused before they are parsed,
the receive limit holds, and streams that a client cancels end quietly (no ERROR traceback in the log)."""

from __future__ import annotations

import asyncio
import json
import logging
import threading
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import grpc
import pytest
from grpc import aio

from rollart.runtime import server as runtime_server
from rollart.runtime import validation
from rollart.runtime.auth import bearer
from rollart.runtime.config import ServiceConfig
from rollart.v1 import resource_manager_pb2 as rm
from rollart.v1 import resource_manager_pb2_grpc as rm_grpc

TOKEN = "stream-test-token"
BIG_LABEL = "x" * 100_000


def rss_mib(pid: int) -> float:
    return int(Path(f"/proc/{pid}/status").read_text().split("VmRSS:")[1].split()[0]) / 1024


class Recorder(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


class FloodService(rm_grpc.ResourceManagerServicer):
    """Watch sends large events as fast as the client takes them; RegisterWorker counts parsed requests."""

    name = "flood"
    service_names = [rm.DESCRIPTOR.services_by_name["ResourceManager"].full_name]
    max_receive_message_bytes = 1 << 20
    request_limits = validation.Limits(max_map_entries=100_000)

    def __init__(self) -> None:
        self.parsed = 0
        self.closed = 0

    def add_to_server(self, server: aio.Server) -> None:
        rm_grpc.add_ResourceManagerServicer_to_server(self, server)

    async def start(self) -> None:
        return None

    async def stop(self) -> None:
        return None

    async def RegisterWorker(self, request, context):
        self.parsed += 1
        return rm.RegisterWorkerResponse(worker=rm.Worker(worker_id="w"))

    async def Watch(self, request, context) -> AsyncIterator[rm.ResourceEvent]:
        ev = rm.ResourceEvent(pool=rm.Pool(name="p", labels={"big": BIG_LABEL}))
        try:
            while True:
                ev.revision += 1
                yield ev
        finally:
            self.closed += 1


@pytest.fixture
def flood(tmp_path, monkeypatch) -> Iterator[tuple[str, FloodService, Recorder]]:
    # In-process: leave the process-wide tracer provider to the tests that install their own.
    monkeypatch.setattr(runtime_server.telemetry, "setup_tracing", lambda *a, **k: None)
    monkeypatch.setattr(runtime_server.telemetry, "shutdown_tracing", lambda: None)
    service = FloodService()
    ready = tmp_path / "ready.json"
    cfg = ServiceConfig(listen="127.0.0.1:0", metrics_listen=None, job_token=TOKEN, ready_file=ready)
    recorder = Recorder()
    logging.getLogger().addHandler(recorder)
    loop = asyncio.new_event_loop()
    stop = asyncio.Event()
    original = loop.add_signal_handler
    loop.add_signal_handler = lambda *a, **k: None  # signals belong to the main thread (pytest)
    thread = threading.Thread(target=loop.run_until_complete, args=(runtime_server.serve(service, cfg, stop),))
    thread.start()
    deadline = time.monotonic() + 10
    while not ready.exists() and time.monotonic() < deadline:
        time.sleep(0.02)
    address = json.loads(ready.read_text())["address"]
    try:
        yield address, service, recorder
    finally:
        loop.call_soon_threadsafe(stop.set)
        thread.join(15)
        loop.add_signal_handler = original
        loop.close()
        logging.getLogger().removeHandler(recorder)


def big_register(n_labels: int) -> rm.RegisterWorkerRequest:
    w = rm.Worker(worker_id="w", role="r", pool="p", endpoint="x:1")
    for i in range(n_labels):
        w.labels[f"k{i}"] = "v"
    return rm.RegisterWorkerRequest(worker=w)


def test_token_less_requests_are_not_parsed(flood):
    address, service, _ = flood
    ch = grpc.insecure_channel(address, options=[("grpc.max_send_message_length", 64 << 20)])
    stub = rm_grpc.ResourceManagerStub(ch)
    req = big_register(50_000)  # ~0.7 MB: under the receive limit
    for md in ([], [bearer("wrong")]):
        with pytest.raises(grpc.RpcError) as exc:
            stub.RegisterWorker(req, metadata=md)
        assert exc.value.code() == grpc.StatusCode.UNAUTHENTICATED
    assert service.parsed == 0
    stub.RegisterWorker(req, metadata=[bearer(TOKEN)])
    assert service.parsed == 1
    # Over the service's receive limit: refused by gRPC before anything is read, token or not.
    with pytest.raises(grpc.RpcError) as exc:
        stub.RegisterWorker(big_register(120_000), metadata=[bearer(TOKEN)])
    assert exc.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    # Within the receive limit but over the service's request limits: INVALID_ARGUMENT naming the field.
    with pytest.raises(grpc.RpcError) as exc:
        stub.RegisterWorker(rm.RegisterWorkerRequest(worker=rm.Worker(worker_id="w" * 300)), metadata=[bearer(TOKEN)])
    assert exc.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert exc.value.details().startswith("worker.worker_id:") and len(exc.value.details()) < 200
    assert service.parsed == 1
    ch.close()


def test_cancelled_streams_end_without_error_logs(flood):
    address, service, recorder = flood
    ch = grpc.insecure_channel(address)
    stub = rm_grpc.ResourceManagerStub(ch)
    for _ in range(3):
        call = stub.Watch(rm.WatchRequest(), metadata=[bearer(TOKEN)])
        next(call)
        time.sleep(0.3)  # the server is now blocked sending (flow control)
        call.cancel()
    deadline = time.monotonic() + 10
    while service.closed < 3 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert service.closed == 3  # every generator was closed (its finally ran)
    ch.close()
    errors = [r for r in recorder.records if r.levelno >= logging.ERROR]
    assert not errors, [r.getMessage() for r in errors]
    assert not [r for r in recorder.records if "Failed to detach context" in r.getMessage()]
