"""The actor's ledger agent: registration, heartbeats and the ledger's commands to this actor.

The agent is the actor's only client of the ledger (``rollart.v1.Ledger``). It

- registers the actor (``RegisterActor``: identity, hardware, weight state), retrying with backoff until the
  ledger answers, and registers again when a heartbeat says the ledger forgot it (``NOT_FOUND``);
- heartbeats every ``heartbeat_seconds`` (or the ledger's interval when shorter) with the weight state, the
  tokens/s generated since the last heartbeat that arrived, the requests in flight and whether it drains;
- watches ``WatchCommands`` (resuming after the last sequence seen, from the start after OUT_OF_RANGE) and
  hands each command to the actor: ``Commit(v)`` (only orders naming this actor or no actor),
  lease cancellations, drain/undrain, relay switch; a command that asks for it is acknowledged
  (``AckCommand``) with the outcome and the weight state after it. Other commands are ignored;
- leaves (``LeaveActor``) when stopped.

What the actor does for each command is the servicer's business, behind :class:`ActorCommands`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

import grpc
from grpc import aio

from rollart.runtime.client import channel as make_channel
from rollart.runtime.config import TLSConfig
from rollart.runtime.telemetry import log_fields
from rollart.v1 import common_pb2, ledger_pb2, ledger_pb2_grpc

log = logging.getLogger(__name__)

SERVICE = "rollart.v1.Ledger"


@dataclass
class ActorReport:
    """What a heartbeat reports."""

    weights: common_pb2.ActorWeightState
    generated_tokens: int  # since the actor started (the agent turns it into tokens/s)
    in_flight_requests: int
    draining: bool


class ActorCommands(Protocol):
    """The actor, as the ledger agent sees it. Each command returns "" when done, else why it failed."""

    def ledger_actor(self) -> ledger_pb2.LedgerActor:
        """Identity, hardware and weight state, for RegisterActor."""
        ...

    def report(self) -> ActorReport: ...

    def weight_state(self) -> common_pb2.ActorWeightState: ...

    async def commit(self, order: common_pb2.CommitOrder) -> str: ...

    async def cancel_leases(self, trajectory_ids: Sequence[str]) -> str: ...

    async def set_draining(self, draining: bool) -> str: ...

    async def switch_relay(self, endpoint: str) -> str: ...


class LedgerAgent:
    """Registration, heartbeats and commands for one actor. See the module docstring."""

    def __init__(
        self,
        *,
        endpoint: str,
        actor_id: str,
        actor: ActorCommands,
        token: str | None,
        tls: TLSConfig | None = None,
        heartbeat_seconds: float = 2.0,
    ) -> None:
        self.endpoint = endpoint
        self.actor_id = actor_id
        self.actor = actor
        self.heartbeat_seconds = heartbeat_seconds
        self.registered = False
        self.heartbeats = 0
        self.commands_seen = 0
        self._channel = make_channel(
            endpoint,
            token=token,
            tls=tls,
            idempotent=(f"{SERVICE}/RegisterActor", f"{SERVICE}/ActorHeartbeat", f"{SERVICE}/AckCommand"),
            default_timeout=10.0,
        )
        self._stub = ledger_pb2_grpc.LedgerStub(self._channel)
        self._tasks: list[asyncio.Task] = []
        self._registered_event = asyncio.Event()
        self._heartbeat_tokens = 0
        self._heartbeat_at = time.monotonic()
        self.answered_at = time.monotonic()  # the ledger's last answer (from start: never answered yet)

    # ------------------------------------------------------------------------------------------ lifecycle

    def start(self) -> None:
        """Register and heartbeat, and follow the command stream (both in the background)."""
        if not self._tasks:
            self._tasks = [asyncio.ensure_future(self._heartbeat_loop()), asyncio.ensure_future(self._command_loop())]

    async def stop(self, reason: str = "shutdown") -> None:
        """Stop both loops, leave the ledger (when registered) and close the channel."""
        for t in self._tasks:
            t.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        self._tasks = []
        if self.registered:
            with contextlib.suppress(aio.AioRpcError):
                await self._stub.LeaveActor(
                    ledger_pb2.LeaveActorRequest(actor_id=self.actor_id, reason=reason), timeout=3
                )
            self.registered = False
        await self._channel.close()

    async def wait_registered(self, timeout: float) -> None:
        await asyncio.wait_for(self._registered_event.wait(), timeout)

    # ------------------------------------------------------------------------------- registration, beats

    async def register(self) -> float:
        """RegisterActor; returns the heartbeat interval to use."""
        resp = await self._stub.RegisterActor(ledger_pb2.RegisterActorRequest(actor=self.actor.ledger_actor()))
        self.registered = True
        self.answered_at = time.monotonic()
        self._registered_event.set()
        interval = resp.heartbeat_interval.ToNanoseconds() / 1e9
        log.info(
            "registered with the ledger", extra=log_fields(actor_id=self.actor_id, latest_version=resp.latest_version)
        )
        return min(interval, self.heartbeat_seconds) if interval > 0 else self.heartbeat_seconds

    async def heartbeat(self) -> None:
        """One ActorHeartbeat (raises the ledger's error)."""
        now = time.monotonic()
        rep = self.actor.report()
        rate = (rep.generated_tokens - self._heartbeat_tokens) / max(now - self._heartbeat_at, 1e-3)
        await self._stub.ActorHeartbeat(
            ledger_pb2.ActorHeartbeatRequest(
                actor_id=self.actor_id,
                weights=rep.weights,
                observed_tokens_per_s=rate,
                in_flight_requests=rep.in_flight_requests,
                draining=rep.draining,
            )
        )
        self.heartbeats += 1
        self.answered_at = time.monotonic()
        self._heartbeat_tokens, self._heartbeat_at = rep.generated_tokens, now

    async def _heartbeat_loop(self) -> None:
        interval = self.heartbeat_seconds
        backoff = 0.5
        while not self.registered:
            try:
                interval = await self.register()
            except aio.AioRpcError as exc:
                log.warning("ledger registration failed: %s %s", exc.code().name, exc.details())
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, 5.0)
        while True:
            await asyncio.sleep(interval)
            try:
                await self.heartbeat()
            except aio.AioRpcError as exc:
                if exc.code() == grpc.StatusCode.NOT_FOUND:  # presumed dead, or it left: register again
                    with contextlib.suppress(aio.AioRpcError):
                        await self.register()
                else:
                    log.warning("ledger heartbeat failed: %s %s", exc.code().name, exc.details())

    # ------------------------------------------------------------------------------------------ commands

    async def _command_loop(self) -> None:
        last = 0
        while True:
            try:
                await self._registered_event.wait()
                call = self._stub.WatchCommands(
                    ledger_pb2.WatchCommandsRequest(
                        subscriber_id=self.actor_id,
                        kind=ledger_pb2.SUBSCRIBER_KIND_ACTOR,
                        from_sequence=last,
                        only_new=last == 0,
                    ),
                    timeout=None,
                )
                async for cmd in call:
                    last = max(last, cmd.sequence)
                    await self.handle(cmd)
            except asyncio.CancelledError:
                raise
            except aio.AioRpcError as exc:
                if exc.code() == grpc.StatusCode.OUT_OF_RANGE:
                    last = 0
                else:
                    log.warning("ledger command stream: %s %s", exc.code().name, exc.details())
            await asyncio.sleep(1.0)

    async def handle(self, cmd: ledger_pb2.LedgerCommand) -> None:
        """Carry out one command and acknowledge it when the ledger asked for that."""
        self.commands_seen += 1
        kind = cmd.WhichOneof("command")
        error = ""
        if kind == "commit":
            order = cmd.commit
            if order.actor_ids and self.actor_id not in order.actor_ids:
                return
            error = await self.actor.commit(order)
        elif kind == "cancel_leases":
            error = await self.actor.cancel_leases(list(cmd.cancel_leases.trajectory_ids))
        elif kind == "drain":
            error = await self.actor.set_draining(True)
        elif kind == "undrain":
            error = await self.actor.set_draining(False)
        elif kind == "switch_relay":
            error = await self.actor.switch_relay(cmd.switch_relay.endpoint)
        else:
            return  # StageVersion, VersionPublished, StepPlanned: nothing to do here
        if cmd.ack_required:
            with contextlib.suppress(aio.AioRpcError):
                await self._stub.AckCommand(
                    ledger_pb2.AckCommandRequest(
                        subscriber_id=self.actor_id,
                        sequence=cmd.sequence,
                        ok=not error,
                        error=error,
                        weights=self.actor.weight_state(),
                    )
                )
