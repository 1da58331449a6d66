"""A serverless endpoint: an HTTP JSON function host that a Cluster calls for ``@register_serverless`` methods.

Protocol (any language can implement it): ``POST /invoke`` with ``Authorization: Bearer <job token>`` and body
``{"method": str, "args": [...], "kwargs": {...}}``; answer 200 ``{"result": ...}``, or an error status with
``{"error": str}`` (400 bad request, 401 unauthenticated, 404 unknown method, 500 the function failed).
``GET /healthz`` answers 200 without a token.

``python -m rollart.sdk.serverless --worker module:Class --name NAME --pool POOL`` hosts the exported methods of a
Worker class and registers ``http://host:port`` with the resource manager (role NAME, no heartbeat TTL: a
serverless endpoint is always there, its platform scales it).
"""

from __future__ import annotations

import argparse
import asyncio
import hmac
import json
import signal
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import grpc

from rollart.runtime.client import sync_channel
from rollart.runtime.config import ConfigError, ServiceConfig, load_config
from rollart.runtime.server import _write_ready
from rollart.v1 import resource_manager_pb2 as rm
from rollart.v1 import resource_manager_pb2_grpc as rm_grpc

from .host import invoke_method, load_class

MAX_BODY = 16 * 1024 * 1024


class ServerlessConfig(ServiceConfig):
    listen: str = "127.0.0.1:0"
    metrics_listen: str | None = None


def make_handler(obj: Any, exported: dict, token: str | None):
    expected = f"Bearer {token}".encode() if token else None

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, fmt: str, *args: Any) -> None:  # quiet: one line per call is noise
            return

        def _send(self, status: int, payload: dict) -> None:
            body = json.dumps(payload).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def do_GET(self) -> None:
            if self.path == "/healthz":
                self._send(200, {"status": "ok"})
            else:
                self._send(404, {"error": f"no route {self.path}"})

        def do_POST(self) -> None:
            if self.path != "/invoke":
                return self._send(404, {"error": f"no route {self.path}"})
            if expected is not None:
                got = (self.headers.get("Authorization") or "").encode()
                if not hmac.compare_digest(got, expected):
                    return self._send(401, {"error": "missing or invalid bearer job token"})
            length = int(self.headers.get("Content-Length") or 0)
            if length <= 0 or length > MAX_BODY:
                return self._send(400, {"error": f"body must be 1..{MAX_BODY} bytes of JSON"})
            try:
                body = json.loads(self.rfile.read(length))
                method = body["method"]
                args, kwargs = json.dumps(body.get("args", [])), json.dumps(body.get("kwargs", {}))
            except (json.JSONDecodeError, KeyError, TypeError) as exc:
                return self._send(400, {"error": f"bad request body: {exc}"})
            try:
                result = asyncio.run(invoke_method(obj, exported, method, args, kwargs))
            except LookupError as exc:
                return self._send(404, {"error": str(exc)})
            except (json.JSONDecodeError, TypeError) as exc:
                return self._send(400, {"error": f"bad arguments: {exc}"})
            except Exception as exc:  # noqa: BLE001 - the function's failure goes back to the caller
                return self._send(500, {"error": f"{method} raised {type(exc).__name__}: {exc}"})
            self._send(200, {"result": result})

    return Handler


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m rollart.sdk.serverless", description=__doc__)
    parser.add_argument("--worker", required=True, help="module:Class of a rollart.sdk.Worker subclass")
    parser.add_argument("--name", required=True, help="endpoint name (what @register_serverless refers to)")
    parser.add_argument("--pool", required=True, help="serverless pool to register in")
    parser.add_argument("--config")
    args = parser.parse_args(argv)
    try:
        cfg = load_config(ServerlessConfig, args.config)
        cls = load_class(args.worker)
    except (ConfigError, ValueError, TypeError, ImportError, AttributeError) as exc:
        sys.exit(f"rollart.sdk.serverless: {exc}")
    obj = cls()
    exported = {name: spec for name, spec in cls.exported_methods().items()}
    host, _, port = cfg.listen.rpartition(":")
    server = ThreadingHTTPServer((host, int(port)), make_handler(obj, exported, cfg.token()))
    url = f"http://{host}:{server.server_port}"
    worker_id = f"serverless-{args.name}"
    stub = metadata = None
    if cfg.resource_manager:
        # The same client TLS settings as the services (tls.ca_file, the client pair for mTLS, server_name).
        ch, metadata = sync_channel(cfg.resource_manager, token=cfg.token(), tls=cfg.tls)
        stub = rm_grpc.ResourceManagerStub(ch)
        try:
            stub.RegisterWorker(
                rm.RegisterWorkerRequest(
                    worker=rm.Worker(worker_id=worker_id, role=args.name, endpoint=url, pool=args.pool, ttl_seconds=0)
                ),
                metadata=metadata,
                timeout=10,
            )
        except grpc.RpcError as exc:  # e.g. a certificate the resource manager refuses: one line, no traceback
            server.server_close()
            sys.exit(
                f"rollart.sdk.serverless: registering with the resource manager {cfg.resource_manager} failed: "
                f"{exc.code().name}: {exc.details()}"
            )
    if cfg.ready_file is not None:
        _write_ready(cfg.ready_file, f"serverless-{args.name}", url, None)

    def shutdown(*_: Any) -> None:
        threading.Thread(target=server.shutdown, daemon=True).start()

    signal.signal(signal.SIGTERM, shutdown)
    signal.signal(signal.SIGINT, shutdown)
    server.serve_forever()
    if stub is not None:
        stub.DeregisterWorker(rm.DeregisterWorkerRequest(worker_id=worker_id), metadata=metadata, timeout=5)


if __name__ == "__main__":
    main()
