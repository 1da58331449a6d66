"""The envmanager's peers (ledger, LLMProxy, reward): addresses from configuration or the resource manager.

A peer without a configured address is looked up by role in the resource manager when first needed, and looked
up again after it became unreachable (a restarted service may come back elsewhere).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Any

from grpc import aio

from rollart.discovery import resource_manager_channel
from rollart.runtime.auth import bearer
from rollart.runtime.client import bare_channel, channel
from rollart.runtime.telemetry import inject_metadata
from rollart.v1 import ledger_pb2_grpc, llmproxy_pb2_grpc, reward_pb2_grpc
from rollart.v1 import resource_manager_pb2 as rm
from rollart.v1 import resource_manager_pb2_grpc as rm_grpc

from .config import EnvManagerConfig

log = logging.getLogger(__name__)

# Calls that are safe to repeat (the client retries them on UNAVAILABLE and waits for a restarting server).
LEDGER_IDEMPOTENT = tuple(
    f"rollart.v1.Ledger/{m}"
    for m in ("RenewLease", "ReleaseLease", "Submit", "SubmitBatch", "RecordReward", "GetVersion", "GetLease",
              "GetJobPolicy", "ListUnscored")
)
PROXY_IDEMPOTENT = ("rollart.v1.LLMProxy/Tokenize", "rollart.v1.LLMProxy/Abort")
REWARD_IDEMPOTENT = ("rollart.v1.Reward/Score",)


class PeerUnavailable(Exception):
    """No address is configured or discoverable for a peer."""


class Peer:
    def __init__(self, role: str, cfg: EnvManagerConfig, address: str | None, stub_cls: Callable[[Any], Any],
                 idempotent: tuple[str, ...]) -> None:
        self.role = role
        self.cfg = cfg
        self.configured = address
        self.address: str | None = address
        self.stub_cls = stub_cls
        self.idempotent = idempotent
        self._channel: aio.Channel | None = None
        self._stub: Any = None
        self._lock = asyncio.Lock()
        self._bare: aio.Channel | None = None
        self._streams: dict[str, Any] = {}

    @property
    def known(self) -> bool:
        return self.address is not None or self.cfg.resource_manager is not None

    async def stub(self) -> Any:
        if self._stub is not None:
            return self._stub
        async with self._lock:
            if self._stub is None:
                address = self.configured or await self._discover()
                if address is None:
                    raise PeerUnavailable(f"no {self.role} address: set `{self.role}` in the configuration or "
                                          f"register a {self.role} with the resource manager")
                self.address = address
                self._channel = channel(address, token=self.cfg.token(), tls=self.cfg.tls,
                                        idempotent=self.idempotent, default_timeout=self.cfg.rpc_timeout_seconds)
                self._stub = self.stub_cls(self._channel)
        return self._stub

    async def unary_stream(self, method: str, request_serializer: Any, response_deserializer: Any) -> Any:
        """A multi-callable for a streaming call that is never retried (e.g. LLMProxy Generate), on a second
        channel to the same address without client interceptors or gRPC's retry filter: a grpc.aio interceptor
        adds a task and an iterator around every call and message, the largest per-turn cost of a loop after
        gRPC itself (`python -m bench control-scale`). Callers pass ``self.metadata()`` (token, trace context,
        baggage)."""
        await self.stub()  # resolves the address (configured or discovered)
        call = self._streams.get(method)
        if call is None:
            if self._bare is None:
                assert self.address is not None
                self._bare = bare_channel(self.address, self.cfg.tls)
            call = self._streams[method] = self._bare.unary_stream(
                method, request_serializer=request_serializer, response_deserializer=response_deserializer
            )
        return call

    def metadata(self) -> list[tuple[str, str | bytes]]:
        """What the client interceptors add to a call: the job token, the current trace context and baggage."""
        token = self.cfg.token()
        md: list[tuple[str, str | bytes]] = [bearer(token)] if token is not None else []
        inject_metadata(md)
        return md

    async def _discover(self) -> str | None:
        if not self.cfg.resource_manager:
            return None
        ch = resource_manager_channel(self.cfg.resource_manager, self.cfg.token(), self.cfg.tls)
        try:
            resp = await rm_grpc.ResourceManagerStub(ch).ListWorkers(rm.ListWorkersRequest(role=self.role))
        except aio.AioRpcError as exc:
            log.warning("%s discovery failed: %s", self.role, exc.details())
            return None
        finally:
            await ch.close()
        alive = [w for w in resp.workers if w.state != rm.WORKER_STATE_EXPIRED]
        return alive[0].endpoint if alive else None

    async def forget(self) -> None:
        """Drop a discovered address (the peer became unreachable); the next call discovers it again."""
        if self.configured is not None:
            return
        async with self._lock:
            old, self._channel, self._stub = self._channel, None, None
            bare, self._bare, self._streams = self._bare, None, {}
            self.address = None
        for ch in (old, bare):
            if ch is not None:
                await ch.close()

    async def close(self) -> None:
        for ch in (self._channel, self._bare):
            if ch is not None:
                await ch.close()
        self._channel, self._stub, self._bare, self._streams = None, None, None, {}


class Peers:
    def __init__(self, cfg: EnvManagerConfig) -> None:
        self.ledger = Peer("ledger", cfg, cfg.ledger, ledger_pb2_grpc.LedgerStub, LEDGER_IDEMPOTENT)
        self.llmproxy = Peer("llmproxy", cfg, cfg.llmproxy, llmproxy_pb2_grpc.LLMProxyStub, PROXY_IDEMPOTENT)
        self.reward = Peer("reward", cfg, cfg.reward, reward_pb2_grpc.RewardStub, REWARD_IDEMPOTENT)

    async def close(self) -> None:
        for peer in (self.ledger, self.llmproxy, self.reward):
            await peer.close()
