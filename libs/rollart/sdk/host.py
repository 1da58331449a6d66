"""Hosting a Worker object as a gRPC service (rollart.v1.ClusterWorker) registered with the resource manager.

``python -m rollart.sdk.host --worker package.module:Class --role ROLE --pool POOL [--tag T ...]`` runs one; its
listen address, token and resource manager come from the usual ROLLART_* configuration.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib
import inspect
import json
import socket
import sys
from typing import Any

from grpc import aio

from rollart.discovery import Registration
from rollart.runtime import errors, ids
from rollart.runtime.config import ConfigError, ServiceConfig, load_config
from rollart.runtime.server import run_service
from rollart.v1 import common_pb2, worker_pb2, worker_pb2_grpc
from rollart.v1 import resource_manager_pb2 as rm

from .worker import Worker


class WorkerHostConfig(ServiceConfig):
    listen: str = "127.0.0.1:0"
    # Heartbeat TTL registered with the resource manager.
    ttl_seconds: float = 5.0


def load_class(spec: str) -> type[Worker]:
    module, _, name = spec.partition(":")
    if not module or not name:
        raise ValueError(f"expected module:Class, got {spec!r}")
    cls = getattr(importlib.import_module(module), name)
    if not (isinstance(cls, type) and issubclass(cls, Worker)):
        raise TypeError(f"{spec} is not a rollart.sdk.Worker subclass")
    return cls


async def invoke_method(obj: Any, exported: dict, method: str, args_json: str, kwargs_json: str) -> Any:
    """Decode JSON arguments and call an exported method (sync methods run in a thread)."""
    if method not in exported:
        raise LookupError(f"{type(obj).__name__} exports no method {method!r}; exported: {sorted(exported)}")
    args = json.loads(args_json) if args_json else []
    kwargs = json.loads(kwargs_json) if kwargs_json else {}
    if not isinstance(args, list) or not isinstance(kwargs, dict):
        raise TypeError("args_json must be a JSON array and kwargs_json a JSON object")
    fn = getattr(obj, method)
    if inspect.iscoroutinefunction(fn):
        return await fn(*args, **kwargs)
    return await asyncio.to_thread(fn, *args, **kwargs)


class WorkerHost(worker_pb2_grpc.ClusterWorkerServicer):
    name = "worker-host"
    service_names = [worker_pb2.DESCRIPTOR.services_by_name["ClusterWorker"].full_name]

    def __init__(self, obj: Worker, cfg: WorkerHostConfig, *, role: str, pool: str, tags: list[str], worker_id: str):
        self.obj = obj
        self.cfg = cfg
        self.exported = type(obj).exported_methods()
        self.role, self.pool, self.tags, self.worker_id = role, pool, tags, worker_id
        self.registration: Registration | None = None

    def add_to_server(self, server: aio.Server) -> None:
        worker_pb2_grpc.add_ClusterWorkerServicer_to_server(self, server)

    async def start(self) -> None:
        return None

    async def on_serving(self, address: str) -> None:
        if self.cfg.resource_manager:
            worker = rm.Worker(
                worker_id=self.worker_id,
                role=self.role,
                endpoint=address,
                pool=self.pool,
                hardware=common_pb2.Hardware(accelerator="cpu", count=1, tags=self.tags),
                ttl_seconds=self.cfg.ttl_seconds,
            )
            self.registration = Registration(
                self.cfg.resource_manager, worker, token=self.cfg.token(), tls=self.cfg.tls
            )
            await self.registration.start()

    async def stop(self) -> None:
        if self.registration is not None:
            await self.registration.stop()

    async def Invoke(
        self, request: worker_pb2.InvokeRequest, context: aio.ServicerContext
    ) -> worker_pb2.InvokeResponse:
        try:
            result = await invoke_method(
                self.obj, self.exported, request.method, request.args_json, request.kwargs_json
            )
        except errors.ServiceError:
            raise  # the worker chose its status (e.g. errors.NotFound)
        except LookupError as exc:
            raise errors.Unimplemented(str(exc)) from None
        except (json.JSONDecodeError, TypeError) as exc:
            raise errors.InvalidArgument("", f"bad arguments for {request.method}: {exc}") from None
        except Exception as exc:  # noqa: BLE001 - the worker's own failure, reported to the caller
            raise errors.Internal(f"{request.method} raised {type(exc).__name__}: {exc}") from None
        try:
            return worker_pb2.InvokeResponse(result_json=json.dumps(result))
        except TypeError as exc:
            raise errors.Internal(f"{request.method} returned a non-JSON value: {exc}") from None

    async def Describe(self, request, context) -> worker_pb2.DescribeResponse:
        return worker_pb2.DescribeResponse(
            worker_class=f"{type(self.obj).__module__}.{type(self.obj).__name__}",
            role=self.role,
            methods={name: mode for name, (mode, _) in self.exported.items()},
        )


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m rollart.sdk.host", description=__doc__)
    parser.add_argument("--worker", required=True, help="module:Class of a rollart.sdk.Worker subclass")
    parser.add_argument("--role", help="role to register (default: the class's role)")
    parser.add_argument("--pool", required=True, help="resource pool the worker belongs to")
    parser.add_argument("--tag", action="append", default=[], help="hardware tag (repeatable)")
    parser.add_argument("--worker-id", help="stable worker id (default: host-role-random)")
    parser.add_argument("--config", help="YAML config (also ROLLART_CONFIG)")
    args = parser.parse_args(argv)
    try:
        cfg = load_config(WorkerHostConfig, args.config)
        cls = load_class(args.worker)
    except (ConfigError, ValueError, TypeError, ImportError, AttributeError) as exc:
        sys.exit(f"rollart.sdk.host: {exc}")
    role = args.role or cls.role
    worker_id = args.worker_id or ids.new_id(f"{socket.gethostname()}-{role}", nbytes=4)
    host = WorkerHost(cls(), cfg, role=role, pool=args.pool, tags=args.tag, worker_id=worker_id)
    host.name = f"worker-{role}"
    run_service(host, cfg)


if __name__ == "__main__":
    main()
