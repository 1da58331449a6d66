"""The trainer's channels to the ledger, the LLMProxy and (for full-weight updates) the actors; only the calls
that are safe to repeat are retried."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any

import grpc
from grpc import aio

from rollart.runtime.client import channel as make_channel
from rollart.v1 import actor_pb2_grpc, ledger_pb2_grpc, llmproxy_pb2_grpc, trainer_pb2

from .config import TrainerConfig
from .jobspec import JobError

T = trainer_pb2
log = logging.getLogger(__name__)
# What a peer across a link that is down answers: nothing (the deadline passes) or a refused connection.
_OUTAGE = (grpc.StatusCode.DEADLINE_EXCEEDED, grpc.StatusCode.UNAVAILABLE)

_LEDGER = "rollart.v1.Ledger"
_IDEMPOTENT_LEDGER = tuple(
    f"{_LEDGER}/{m}"
    for m in (
        "SetJobPolicy",
        "RegisterVersion",
        "GetVersion",
        "ListVersions",
        "ListActors",
        "PlanStep",
        "GetStepPlan",
        "AddPrompts",
        "GetBatch",
        "AckBatch",
        "GetStatus",
    )
)


class Peers:
    """Channels to the ledger, the LLMProxy and (for full-weight updates) the actors."""

    def __init__(self, cfg: TrainerConfig, spec: T.TrainerJobSpec) -> None:
        self.cfg = cfg
        self.token = cfg.token()
        ledger = spec.endpoints.ledger or cfg.ledger
        if not ledger:
            raise JobError("INVALID_ARGUMENT", "no ledger endpoint (spec.endpoints.ledger or the ledger config key)")
        self.ledger_address = ledger
        self._ledger_ch = make_channel(
            ledger,
            token=self.token,
            tls=cfg.tls,
            idempotent=_IDEMPOTENT_LEDGER,
            default_timeout=cfg.rpc_timeout_seconds,
        )
        self.ledger = ledger_pb2_grpc.LedgerStub(self._ledger_ch)
        proxy = spec.endpoints.llmproxy or cfg.llmproxy
        self._proxy_ch = None
        self.proxy: llmproxy_pb2_grpc.LLMProxyStub | None = None
        if proxy:
            self._proxy_ch = make_channel(
                proxy,
                token=self.token,
                tls=cfg.tls,
                idempotent=(
                    "rollart.v1.LLMProxy/Suspend",
                    "rollart.v1.LLMProxy/Resume",
                    "rollart.v1.LLMProxy/GetStatus",
                ),
                default_timeout=cfg.rpc_timeout_seconds,
            )
            self.proxy = llmproxy_pb2_grpc.LLMProxyStub(self._proxy_ch)
        self._actors: dict[str, tuple[aio.Channel, actor_pb2_grpc.ActorStub]] = {}

    def actor(self, endpoint: str) -> actor_pb2_grpc.ActorStub:
        if endpoint not in self._actors:
            ch = make_channel(
                endpoint, token=self.token, tls=self.cfg.tls, default_timeout=self.cfg.rpc_timeout_seconds
            )
            self._actors[endpoint] = (ch, actor_pb2_grpc.ActorStub(ch))
        return self._actors[endpoint][1]

    async def close(self) -> None:
        chans = [self._ledger_ch, self._proxy_ch, *(c for c, _ in self._actors.values())]
        for ch in chans:
            if ch is not None:
                with contextlib.suppress(Exception):
                    await ch.close(grace=None)


async def through_outage(
    method: Callable[..., Awaitable[Any]], request: Any, *, budget: float, attempt_timeout: float, what: str
) -> Any:
    """An idempotent call to a peer that may sit across a link (the LLMProxy in another region): an attempt that
    gets no reply in ``attempt_timeout`` or finds the peer unreachable is made again until ``budget`` seconds have
    passed, so a link down for a while delays the step instead of failing the job."""
    deadline = time.monotonic() + budget
    attempt = 0
    while True:
        attempt += 1
        left = deadline - time.monotonic()
        try:
            return await method(request, timeout=max(0.5, min(attempt_timeout, left)))
        except aio.AioRpcError as exc:
            left = deadline - time.monotonic()
            if exc.code() not in _OUTAGE or left <= 0:
                raise
            log.warning("%s: %s (attempt %d); trying again for up to %.0f s more", what, exc.code().name, attempt, left)
            await asyncio.sleep(min(1.0, left))
