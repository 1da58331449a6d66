"""The envmanager's call coalescer (ledger_batch.Coalescer) on its own: what goes into one batch, how many batches
are in flight, deadlines, answers nobody waits for, and a failed batch."""

from __future__ import annotations

import asyncio

import grpc
import pytest
from grpc import aio

from rollart.v1 import ledger_pb2 as lp
from rollart_envmanager.ledger_batch import Coalescer, item_error


class Recorder:
    """A batched call that records its batches and answers each request with its own value doubled."""

    def __init__(self, delay: float = 0.05, fail: Exception | None = None) -> None:
        self.batches: list[list[int]] = []
        self.delay = delay
        self.fail = fail
        self.in_flight = self.most_in_flight = 0

    async def send(self, requests: list[int], timeout: float) -> list[int | BaseException]:
        self.batches.append(list(requests))
        self.in_flight += 1
        self.most_in_flight = max(self.most_in_flight, self.in_flight)
        try:
            await asyncio.sleep(self.delay)
        finally:
            self.in_flight -= 1
        if self.fail is not None:
            raise self.fail
        return [ValueError(f"odd {r}") if r < 0 else 2 * r for r in requests]


def coalescer(rec: Recorder, **kw) -> Coalescer[int, int]:
    return Coalescer("test", rec.send, lambda r: (str(abs(r) % 1000),), **kw)


def test_calls_made_while_a_batch_is_in_flight_leave_together():
    async def run():
        rec = Recorder()
        c = coalescer(rec, max_in_flight=1)
        out = await asyncio.gather(*(c.call(i, timeout=5) for i in range(50)))
        return rec, out

    rec, out = asyncio.run(run())
    assert out == [2 * i for i in range(50)]
    assert rec.batches[0] == [0]  # the first call goes at once: no added wait when idle
    assert rec.batches[1] == list(range(1, 50))  # the rest queued behind it: one batch
    assert rec.most_in_flight == 1


def test_limits_items_bytes_in_flight_and_never_puts_one_key_twice_in_a_batch():
    async def run():
        rec = Recorder()
        c = coalescer(rec, max_items=8, max_bytes=100, max_in_flight=2)
        calls = [c.call(i, timeout=5, size=30) for i in range(20)]
        calls += [c.call(1000 + 5, timeout=5, size=30)]  # the same key as request 5
        calls += [c.call(7000, timeout=5, size=500)]  # larger than max_bytes: goes alone
        out = await asyncio.gather(*calls)
        return rec, out

    rec, out = asyncio.run(run())
    assert out[:20] == [2 * i for i in range(20)] and out[20] == 2010 and out[21] == 14000
    assert rec.most_in_flight == 2
    for b in rec.batches:
        assert len(b) <= 8
        assert len(b) == 1 or sum(500 if r == 7000 else 30 for r in b) <= 100
        keys = [str(abs(r) % 1000) for r in b]
        assert len(keys) == len(set(keys))
    assert [7000] in rec.batches


def test_item_errors_and_batch_failures_reach_their_callers():
    async def run():
        c = coalescer(Recorder())
        ok, bad = await asyncio.gather(c.call(3, timeout=5), c.call(-4, timeout=5), return_exceptions=True)
        failing = coalescer(Recorder(fail=aio.AioRpcError(grpc.StatusCode.UNAVAILABLE, None, None, "gone")))
        errs = await asyncio.gather(*(failing.call(i, timeout=5) for i in range(3)), return_exceptions=True)
        return ok, bad, errs

    ok, bad, errs = asyncio.run(run())
    assert ok == 6 and isinstance(bad, ValueError)
    assert all(isinstance(e, aio.AioRpcError) and e.code() == grpc.StatusCode.UNAVAILABLE for e in errs)


def test_a_call_past_its_deadline_is_never_sent_or_its_answer_is_an_orphan():
    orphans: list[tuple[int, int]] = []

    async def run():
        rec = Recorder(delay=0.3)
        c = Coalescer("test", rec.send, lambda r: (str(r),), lambda req, ans: orphans.append((req, ans)),
                      max_in_flight=1)
        first = asyncio.ensure_future(c.call(1, timeout=0.1))  # sent at once, answered after its deadline
        await asyncio.sleep(0)
        queued = asyncio.ensure_future(c.call(2, timeout=0.1))  # queued behind it, gives up before it is sent
        results = await asyncio.gather(first, queued, return_exceptions=True)
        await asyncio.sleep(0.4)
        return rec, results

    rec, results = asyncio.run(run())
    for r in results:
        assert isinstance(r, aio.AioRpcError) and r.code() == grpc.StatusCode.DEADLINE_EXCEEDED
    assert rec.batches == [[1]]  # 2 was never sent
    assert orphans == [(1, 2)]


@pytest.mark.parametrize("code", [grpc.StatusCode.ALREADY_EXISTS, grpc.StatusCode.INVALID_ARGUMENT])
def test_item_error_is_the_status_a_single_call_would_end_with(code):
    err = item_error(lp.BatchItemError(code=code.value[0], message="submissions[0]: no"))
    assert err.code() == code and err.details() == "submissions[0]: no"
