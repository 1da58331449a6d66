"""The job's environment loops kept running across envmanager restarts and replacements.

Why here (the job's owner re-requests them) and not in the envmanager's own store: the envmanager keeps no
durable state (it has no Redis of its own, and a replacement may run on another host), while whoever started
the job holds its ``StartLoopsRequest`` for the whole run. ``StartLoops`` is idempotent per group id and spec,
so asking again is always safe: a running group is answered as it is, a missing one is started.

Invariant: a group that the envmanager in the cluster state does not list (a restarted or replaced process
starts with none) is requested again within ``interval`` seconds of that envmanager answering; a group it
lists, stopped or not, is left alone (stopping is the job's decision).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from pathlib import Path

from grpc import aio

from rollart.local import cluster as local
from rollart.local.supervisor import Event
from rollart.runtime.client import channel
from rollart.v1 import envmanager_pb2, envmanager_pb2_grpc

log = logging.getLogger(__name__)


class LoopKeeper:
    def __init__(
        self,
        state_dir: Path,
        token: str,
        request: envmanager_pb2.StartLoopsRequest,
        *,
        name: str = "envmanager",
        interval: float = 1.0,
        on_event: Callable[[Event], None] = lambda _e: None,
    ) -> None:
        self.state_dir = state_dir
        self.token = token
        self.request = request
        self.name = name
        self.interval = interval
        self.on_event = on_event
        self.restored = 0

    def _address(self) -> str | None:
        info = local.read_state(self.state_dir).get("services", {}).get(self.name)
        return info["address"] if info else None

    async def ensure(self) -> bool:
        """One check: True when the group was missing and has been requested again. Raises AioRpcError
        when the envmanager does not answer (the process supervisor brings it back)."""
        address = self._address()
        if address is None:
            return False
        ch = channel(address, token=self.token, default_timeout=10.0)
        try:
            stub = envmanager_pb2_grpc.EnvManagerStub(ch)
            groups = await stub.ListLoopGroups(envmanager_pb2.ListLoopGroupsRequest(include_stopped=True))
            if any(g.group_id == self.request.group_id for g in groups.groups):
                return False
            t0 = time.monotonic()
            group = await stub.StartLoops(self.request, timeout=30.0)
        finally:
            await ch.close()
        self.restored += 1
        self.on_event(
            Event(
                time.time(),
                self.name,
                "loops-restored",
                f"loop group {self.request.group_id} missing at {address}",
                seconds=round(time.monotonic() - t0, 3),
                detail=f"{group.count} loops started again",
            )
        )
        return True

    async def run(self, stop: asyncio.Event) -> None:
        while not stop.is_set():
            try:
                await self.ensure()
            except aio.AioRpcError as exc:
                log.debug("envmanager not answering: %s", exc.code().name)
            try:
                await asyncio.wait_for(stop.wait(), self.interval)
            except TimeoutError:
                pass
