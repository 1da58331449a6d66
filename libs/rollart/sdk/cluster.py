"""The Cluster: a client-side proxy over the worker group of one role that the resource manager bound.

    cluster = await Cluster.create(RewardWorker, binding="reward", replicas=2, resource_manager=addr, token=tok)
    scores = await cluster.score(batch)            # @register: every worker, results gathered in order
    out = await cluster.generate(p, tag="decode")  # @hw_mapping: one worker matching the tag (round-robin)
    v = await cluster.judge(text)                  # @register_serverless("judge"): the serverless endpoint

A worker that fails with UNAVAILABLE makes the Cluster re-read its binding from the resource manager (which
re-places lost workers) and retry the call once on the new placement.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import urllib.error
import urllib.request
from collections.abc import Callable
from typing import Any

import grpc
from grpc import aio

from rollart.discovery import resource_manager_channel
from rollart.runtime.auth import bearer
from rollart.runtime.client import channel
from rollart.runtime.config import TLSConfig
from rollart.v1 import common_pb2, worker_pb2, worker_pb2_grpc
from rollart.v1 import resource_manager_pb2 as rm
from rollart.v1 import resource_manager_pb2_grpc as rm_grpc

from .worker import HW_MAPPING, REGISTER, SERVERLESS, Worker


class ClusterError(RuntimeError):
    """A Cluster call failed; ``failures`` maps worker id (or endpoint) to the error."""

    def __init__(self, message: str, failures: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.failures = failures or {}


class Cluster:
    def __init__(
        self,
        worker_cls: type[Worker],
        *,
        binding: str,
        resource_manager: str,
        token: str | None,
        tls: TLSConfig | None = None,
        call_timeout: float = 60.0,
    ) -> None:
        self.worker_cls = worker_cls
        self.binding_id = binding
        self.token = token
        self.tls = tls
        self.call_timeout = call_timeout
        self._rm_channel = resource_manager_channel(resource_manager, token, tls)
        self.rm = rm_grpc.ResourceManagerStub(self._rm_channel)
        self.binding: rm.Binding | None = None
        self._channels: dict[str, aio.Channel] = {}
        self._stubs: dict[str, worker_pb2_grpc.ClusterWorkerStub] = {}
        self._rr: dict[str, itertools.count] = {}
        self._methods = worker_cls.exported_methods()

    @classmethod
    async def create(
        cls,
        worker_cls: type[Worker],
        *,
        binding: str,
        resource_manager: str,
        token: str | None,
        replicas: int = 1,
        role: str | None = None,
        preferred_pool: str = "",
        preferred_kind: common_pb2.PoolKind = common_pb2.POOL_KIND_UNSPECIFIED,
        hardware_tags: tuple[str, ...] = (),
        allow_fallback: bool = True,
        tls: TLSConfig | None = None,
    ) -> "Cluster":
        """Bind a worker group with the resource manager and open channels to it."""
        self = cls(worker_cls, binding=binding, resource_manager=resource_manager, token=token, tls=tls)
        b = await self.rm.Bind(
            rm.BindRequest(
                binding_id=binding,
                role=role or worker_cls.role,
                replicas=replicas,
                preferred_pool=preferred_pool,
                preferred_kind=preferred_kind,
                hardware_tags=list(hardware_tags),
                allow_fallback=allow_fallback,
            )
        )
        self._use(b)
        return self

    def _use(self, b: rm.Binding) -> None:
        self.binding = b
        wanted = {m.worker_id: m.endpoint for m in b.workers}
        for wid in list(self._stubs):
            if wid not in wanted:
                self._stubs.pop(wid)
                asyncio.ensure_future(self._channels.pop(wid).close())
        for wid, endpoint in wanted.items():
            if wid not in self._stubs:
                ch = channel(endpoint, token=self.token, tls=self.tls, default_timeout=self.call_timeout)
                self._channels[wid] = ch
                self._stubs[wid] = worker_pb2_grpc.ClusterWorkerStub(ch)

    async def refresh(self) -> rm.Binding:
        """Re-read the binding (the resource manager re-places lost workers)."""
        b = await self.rm.GetBinding(rm.GetBindingRequest(binding_id=self.binding_id))
        self._use(b)
        return b

    @property
    def workers(self) -> list[rm.BoundWorker]:
        return list(self.binding.workers) if self.binding else []

    async def close(self) -> None:
        for ch in self._channels.values():
            await ch.close()
        await self._rm_channel.close()

    # ----------------------------------------------------------------------------------------------- calls

    def __getattr__(self, name: str) -> Callable[..., Any]:
        methods = self.__dict__.get("_methods", {})
        if name not in methods:
            raise AttributeError(f"{self.__dict__.get('worker_cls')} exports no method {name!r}")
        mode, endpoint = methods[name]
        if mode == REGISTER:
            return lambda *a, **kw: self._broadcast(name, a, kw)
        if mode == HW_MAPPING:
            return lambda *a, tag, **kw: self._route(name, tag, a, kw)
        if mode == SERVERLESS:
            return lambda *a, **kw: self._serverless(name, endpoint, a, kw)
        raise AttributeError(f"unknown dispatch mode {mode!r} for {name}")

    def _request(self, method: str, args: tuple, kwargs: dict, tag: str = "") -> worker_pb2.InvokeRequest:
        return worker_pb2.InvokeRequest(
            method=method, args_json=json.dumps(list(args)), kwargs_json=json.dumps(kwargs), tag=tag
        )

    async def _invoke(self, wid: str, req: worker_pb2.InvokeRequest) -> Any:
        resp = await self._stubs[wid].Invoke(req)
        return json.loads(resp.result_json)

    async def _broadcast(self, method: str, args: tuple, kwargs: dict) -> list[Any]:
        req = self._request(method, args, kwargs)
        for attempt in range(2):
            order = [m.worker_id for m in self.workers]
            if not order:
                raise ClusterError(f"binding {self.binding_id!r} has no workers")
            results = await asyncio.gather(*(self._invoke(w, req) for w in order), return_exceptions=True)
            failures = {w: r for w, r in zip(order, results) if isinstance(r, BaseException)}
            if not failures:
                return list(results)
            unavailable = all(
                isinstance(e, aio.AioRpcError) and e.code() == grpc.StatusCode.UNAVAILABLE for e in failures.values()
            )
            if attempt == 0 and unavailable:
                await self.refresh()
                continue
            raise ClusterError(
                f"{method} failed on {len(failures)}/{len(order)} workers",
                {w: _describe(e) for w, e in failures.items()},
            )
        raise AssertionError("unreachable")

    def _matching(self, tag: str) -> list[rm.BoundWorker]:
        exact = [m for m in self.workers if tag in m.hardware.tags or m.pool == tag]
        return exact or self.workers  # the rest were placed on compatible pools: they can serve it

    async def _route(self, method: str, tag: str, args: tuple, kwargs: dict) -> Any:
        req = self._request(method, args, kwargs, tag)
        for attempt in range(2):
            candidates = self._matching(tag)
            if not candidates:
                raise ClusterError(f"binding {self.binding_id!r} has no workers")
            counter = self._rr.setdefault(tag, itertools.count())
            target = candidates[next(counter) % len(candidates)]
            try:
                return await self._invoke(target.worker_id, req)
            except aio.AioRpcError as exc:
                if attempt == 0 and exc.code() == grpc.StatusCode.UNAVAILABLE:
                    await self.refresh()
                    continue
                raise ClusterError(
                    f"{method} failed on {target.worker_id}", {target.worker_id: _describe(exc)}
                ) from exc
        raise AssertionError("unreachable")

    async def _serverless(self, method: str, name: str, args: tuple, kwargs: dict) -> Any:
        resp = await self.rm.ListWorkers(rm.ListWorkersRequest(role=name))
        endpoints = [w.endpoint for w in resp.workers if w.endpoint.startswith(("http://", "https://"))]
        if not endpoints:
            raise ClusterError(f"no serverless endpoint named {name!r} is registered")
        body = json.dumps({"method": method, "args": list(args), "kwargs": kwargs}).encode()
        return await asyncio.to_thread(self._post, endpoints[0], body)

    def _post(self, url: str, body: bytes) -> Any:
        headers = {"Content-Type": "application/json"}
        if self.token:
            headers["Authorization"] = bearer(self.token)[1]
        req = urllib.request.Request(url.rstrip("/") + "/invoke", data=body, headers=headers, method="POST")
        try:
            with urllib.request.urlopen(req, timeout=self.call_timeout) as r:  # noqa: S310 - registered endpoint
                return json.loads(r.read())["result"]
        except urllib.error.HTTPError as exc:
            detail = exc.read().decode(errors="replace")
            raise ClusterError(f"serverless {url} answered {exc.code}: {detail}", {url: detail}) from None
        except urllib.error.URLError as exc:
            raise ClusterError(f"serverless {url} unreachable: {exc.reason}", {url: str(exc.reason)}) from None


def _describe(e: BaseException) -> str:
    if isinstance(e, aio.AioRpcError):
        return f"{e.code().name}: {e.details()}"
    return f"{type(e).__name__}: {e}"
