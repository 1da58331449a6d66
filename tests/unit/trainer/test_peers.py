"""through_outage: an idempotent call to a peer across a link is made again while the link is down, within a
budget, and anything else fails at once."""

from __future__ import annotations

import time

import grpc
import pytest
from grpc import aio

from rollart_trainer.peers import through_outage


def _error(code: grpc.StatusCode) -> aio.AioRpcError:
    return aio.AioRpcError(code, aio.Metadata(), aio.Metadata(), details=code.name)


class Peer:
    """Answers after ``down`` failed attempts with ``code``; records each attempt's timeout."""

    def __init__(self, down: int, code: grpc.StatusCode = grpc.StatusCode.DEADLINE_EXCEEDED) -> None:
        self.down, self.code, self.timeouts = down, code, []

    async def __call__(self, request: str, timeout: float) -> str:
        self.timeouts.append(timeout)
        if len(self.timeouts) <= self.down:
            raise _error(self.code)
        return f"ok {request}"


async def test_a_link_down_for_a_while_delays_the_call_instead_of_failing_it():
    for code in (grpc.StatusCode.DEADLINE_EXCEEDED, grpc.StatusCode.UNAVAILABLE):
        peer = Peer(down=2, code=code)
        assert await through_outage(peer, "suspend", budget=30, attempt_timeout=10, what="LLMProxy Suspend") == "ok suspend"
        assert len(peer.timeouts) == 3 and peer.timeouts[0] == 10


async def test_the_budget_bounds_the_wait_and_the_last_error_is_raised():
    peer = Peer(down=100)
    t0 = time.monotonic()
    with pytest.raises(aio.AioRpcError) as info:
        await through_outage(peer, "suspend", budget=1.5, attempt_timeout=10, what="LLMProxy Suspend")
    assert info.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
    assert time.monotonic() - t0 < 4 and all(t <= 1.5 for t in peer.timeouts)


async def test_any_other_error_fails_at_once():
    for code in (grpc.StatusCode.PERMISSION_DENIED, grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.INTERNAL):
        peer = Peer(down=1, code=code)
        with pytest.raises(aio.AioRpcError):
            await through_outage(peer, "resume", budget=30, attempt_timeout=10, what="LLMProxy Resume")
        assert len(peer.timeouts) == 1
