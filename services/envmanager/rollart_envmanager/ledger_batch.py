"""The envmanager's ledger client for its loops' hot path: AcquireLeases and Submit calls of many loops are sent
together as AcquireLeasesBatch and SubmitBatch (one RPC, one store round trip and one fsync for all of them).

Each loop still makes its own call and gets its own answer or error, exactly as from the single-item RPC: a
refused item raises the ``grpc.aio.AioRpcError`` its own call would have ended with, a failed batch raises its
error in every item's call. Calls made while a batch is in flight queue up and leave together in the next one,
so batching adds no wait when the ledger keeps up, and batches grow with load. Invariants:

* at most ``max_in_flight`` batches of each kind are in flight, each at most ``max_items`` calls and about
  ``max_bytes`` of requests (one larger request goes alone), below the ledger's receive limit;
* a batch never names a holder (acquire) or a lease or trajectory (submit) twice: a second call for one waits
  for the next batch, so the ledger's refusal of duplicates within a batch never hits a loop;
* a call whose deadline passes ends with DEADLINE_EXCEEDED; if it was not sent yet it never is, and leases
  granted to an acquire nobody waits for any more are released at once (their samples go back to the pool);
* a ledger without the batched RPCs (UNIMPLEMENTED) is called item by item from then on.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

import grpc
from grpc import aio

from rollart.runtime.timeutil import duration as dur
from rollart.v1 import ledger_pb2 as lp

log = logging.getLogger(__name__)

Req = TypeVar("Req")
Resp = TypeVar("Resp")
#: Returns a ledger stub (raises what the caller should see when the ledger cannot be reached).
StubSource = Callable[[], Awaitable[Any]]

MAX_ITEMS = 256  # the ledger's limit per batch
MAX_BYTES = 8 * 1024 * 1024  # half the ledger's default receive limit (16 MiB)
MAX_IN_FLIGHT = 2  # fewer batches in flight, larger batches: less CPU per item on a loaded ledger


def rpc_error(code: grpc.StatusCode, details: str) -> aio.AioRpcError:
    """The error a single-item call would have raised."""
    return aio.AioRpcError(code, aio.Metadata(), aio.Metadata(), details=details)


def item_error(err: lp.BatchItemError) -> aio.AioRpcError:
    codes = {c.value[0]: c for c in grpc.StatusCode}
    return rpc_error(codes.get(err.code, grpc.StatusCode.UNKNOWN), err.message)


@dataclass
class _Call(Generic[Req, Resp]):
    request: Req
    keys: tuple[str, ...]
    size: int
    deadline: float
    future: asyncio.Future[Resp]


class Coalescer(Generic[Req, Resp]):
    """Sends the calls queued while earlier batches were in flight as one batch (see the module's docstring).

    ``send(requests, timeout)`` makes the batched call and returns, parallel to ``requests``, each one's answer or
    the exception its caller gets; ``orphaned(request, answer)`` is told of an answer nobody waits for."""

    def __init__(
        self,
        name: str,
        send: Callable[[list[Req], float], Awaitable[list[Resp | BaseException]]],
        keys: Callable[[Req], tuple[str, ...]],
        orphaned: Callable[[Req, Resp], None] | None = None,
        max_items: int = MAX_ITEMS,
        max_bytes: int = MAX_BYTES,
        max_in_flight: int = MAX_IN_FLIGHT,
    ) -> None:
        self.name = name
        self._send = send
        self._keys = keys
        self._orphaned = orphaned
        self.max_items, self.max_bytes, self.max_in_flight = max_items, max_bytes, max_in_flight
        self._queue: list[_Call[Req, Resp]] = []
        self._in_flight = 0
        self._tasks: set[asyncio.Task] = set()
        self.batches = 0  # sent so far (for tests and metrics)
        self.items = 0

    async def call(self, request: Req, timeout: float, size: int = 0) -> Resp:
        fut: asyncio.Future[Resp] = asyncio.get_running_loop().create_future()
        entry = _Call(request, self._keys(request), size, time.monotonic() + timeout, fut)
        self._queue.append(entry)
        self._pump()
        # asyncio.timeout around the future itself (no wait_for task, no shield: the hot path of every loop); a
        # timeout or a cancelled caller cancels the future, which _run then treats as an orphan.
        try:
            async with asyncio.timeout(timeout):
                return await fut
        except TimeoutError:
            why = f"{self.name}: no answer within {timeout:.1f}s"
            raise rpc_error(grpc.StatusCode.DEADLINE_EXCEEDED, why) from None
        finally:
            if not fut.done() or fut.cancelled():  # timed out or cancelled: not sent any more, or an orphan
                fut.cancel()
                self._queue = [e for e in self._queue if e is not entry]

    def _pump(self) -> None:
        while self._queue and self._in_flight < self.max_in_flight:
            batch = self._take()
            self._in_flight += 1
            task = asyncio.get_running_loop().create_task(self._run(batch), name=f"ledger-{self.name}")
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    def _take(self) -> list[_Call[Req, Resp]]:
        batch: list[_Call[Req, Resp]] = []
        seen: set[str] = set()
        size = 0
        rest: list[_Call[Req, Resp]] = []
        for entry in self._queue:
            fits = len(batch) < self.max_items and (not batch or size + entry.size <= self.max_bytes)
            if fits and not seen.intersection(entry.keys):
                batch.append(entry)
                seen.update(entry.keys)
                size += entry.size
            else:
                rest.append(entry)
        self._queue = rest
        return batch

    async def _run(self, batch: list[_Call[Req, Resp]]) -> None:
        try:
            timeout = max(0.05, max(e.deadline for e in batch) - time.monotonic())
            self.batches += 1
            self.items += len(batch)
            try:
                answers: list[Resp | BaseException] = await self._send([e.request for e in batch], timeout)
            except asyncio.CancelledError:  # closing: nobody gets an answer
                for entry in batch:
                    entry.future.cancel()
                raise
            except Exception as exc:  # noqa: BLE001 - the batch failed: every caller sees the error
                answers = [exc] * len(batch)
            for entry, answer in zip(batch, answers):
                if entry.future.done():  # its caller gave up
                    if self._orphaned is not None and not isinstance(answer, BaseException):
                        self._orphaned(entry.request, answer)
                elif isinstance(answer, BaseException):
                    entry.future.set_exception(answer)
                else:
                    entry.future.set_result(answer)
        finally:
            self._in_flight -= 1
            self._pump()

    async def close(self) -> None:
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        for entry in self._queue:
            entry.future.cancel()
        self._queue.clear()


class LedgerBatcher:
    """AcquireLeases and Submit of many loops through AcquireLeasesBatch and SubmitBatch (module docstring)."""

    def __init__(self, stub: StubSource, max_in_flight: int = MAX_IN_FLIGHT) -> None:
        self._stub = stub
        self.batched = True  # False once the ledger said UNIMPLEMENTED
        self.acquires: Coalescer[lp.AcquireLeasesRequest, lp.AcquireLeasesResponse] = Coalescer(
            "AcquireLeasesBatch", self._acquire_batch, lambda r: (r.holder,), self._release_orphan,
            max_in_flight=max_in_flight,
        )
        self.submits: Coalescer[lp.SubmitRequest, lp.SubmitResponse] = Coalescer(
            "SubmitBatch", self._submit_batch,
            lambda r: ("l:" + r.trajectory.lease_id, "t:" + r.trajectory.trajectory_id),
            max_in_flight=max_in_flight,
        )
        self._waits: dict[int, float] = {}  # id(request) -> its wait (AcquireLeasesBatch has one for all)
        self._orphans: set[asyncio.Task] = set()

    async def acquire(self, request: lp.AcquireLeasesRequest, wait: float, timeout: float) -> lp.AcquireLeasesResponse:
        """AcquireLeases(request) waiting up to ``wait`` for a lease (``request.wait`` is ignored)."""
        self._waits[id(request)] = wait
        try:
            return await self.acquires.call(request, timeout)
        finally:
            self._waits.pop(id(request), None)

    async def submit(self, request: lp.SubmitRequest, timeout: float) -> lp.SubmitResponse:
        return await self.submits.call(request, timeout, size=request.ByteSize())

    async def _acquire_batch(
        self, requests: list[lp.AcquireLeasesRequest], timeout: float
    ) -> list[lp.AcquireLeasesResponse | BaseException]:
        # The shortest wait asked for, so that no loop waits longer than it asked (the call returns as soon as
        # one of them got a lease).
        wait = min((self._waits.get(id(r), 0.0) for r in requests), default=0.0)
        stub = await self._stub()
        if not self.batched:
            return list(await asyncio.gather(
                *(stub.AcquireLeases(_with_wait(r, wait), timeout=timeout) for r in requests), return_exceptions=True))
        try:
            resp = await stub.AcquireLeasesBatch(
                lp.AcquireLeasesBatchRequest(requests=requests, wait=dur(wait)), timeout=timeout)
        except aio.AioRpcError as exc:
            if exc.code() != grpc.StatusCode.UNIMPLEMENTED:
                raise
            self._unimplemented()
            return await self._acquire_batch(requests, timeout)
        return [item_error(r.error) if r.HasField("error") else r.response for r in resp.results]

    async def _submit_batch(
        self, requests: list[lp.SubmitRequest], timeout: float
    ) -> list[lp.SubmitResponse | BaseException]:
        stub = await self._stub()
        if not self.batched:
            return list(await asyncio.gather(
                *(stub.Submit(r, timeout=timeout) for r in requests), return_exceptions=True))
        try:
            resp = await stub.SubmitBatch(lp.SubmitBatchRequest(submissions=requests), timeout=timeout)
        except aio.AioRpcError as exc:
            if exc.code() != grpc.StatusCode.UNIMPLEMENTED:
                raise
            self._unimplemented()
            return await self._submit_batch(requests, timeout)
        return [item_error(r.error) if r.HasField("error") else r.response for r in resp.results]

    def _unimplemented(self) -> None:
        if self.batched:
            log.warning("the ledger has no batched lease calls (UNIMPLEMENTED): calling it item by item")
        self.batched = False

    def _release_orphan(self, request: lp.AcquireLeasesRequest, answer: lp.AcquireLeasesResponse) -> None:
        """Leases granted to a loop that stopped waiting: given back at once rather than left to expire."""

        async def release() -> None:
            try:
                stub = await self._stub()
                for lease in answer.leases:
                    await stub.ReleaseLease(lp.ReleaseLeaseRequest(
                        lease_id=lease.lease_id, holder=request.holder, reason=lp.RELEASE_REASON_ABANDONED,
                        cause="granted after its loop stopped waiting"))
            except Exception as exc:  # noqa: BLE001 - best effort: the leases expire back to the pool anyway
                log.info("releasing leases nobody waits for failed: %s", exc)

        if answer.leases:
            task = asyncio.get_running_loop().create_task(release())
            self._orphans.add(task)
            task.add_done_callback(self._orphans.discard)

    async def close(self) -> None:
        await self.acquires.close()
        await self.submits.close()
        if self._orphans:
            await asyncio.wait(self._orphans, timeout=2)


def _with_wait(request: lp.AcquireLeasesRequest, wait: float) -> lp.AcquireLeasesRequest:
    r = lp.AcquireLeasesRequest()
    r.CopyFrom(request)
    r.wait.CopyFrom(dur(wait))
    return r
