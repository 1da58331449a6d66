"""One turn's parts, shared by the turn pipeline (``core``), the actor table (``actors``) and the APIs: the
failure that ends a turn with the retryable-status trailing metadata of llmproxy.proto (request checks:
``validators``), the in-flight turn, and a forwarded chunk (the actor's bytes, never re-encoded).
See docs/llmproxy.md."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

import grpc
from grpc import aio

from rollart.runtime import errors, ids
from rollart.v1 import common_pb2
from rollart.v1 import llmproxy_pb2 as pp

from .router import ActorEntry

MAX_ID = ids.MAX_ID_CHARS  # also the longest task (route) name
# Trailing metadata of a failed turn (see the retryable-status contract in llmproxy.proto).
MD_RETRYABLE = "rollart-retryable"
MD_FAILED_ACTOR = "rollart-failed-actor"
MD_TOKENS = "rollart-tokens-streamed"


def _varint(n: int) -> bytes:
    out = bytearray()
    while n > 0x7F:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


@dataclass(slots=True)
class Forward:
    """One chunk on its way to the caller: the actor's encoded ``GenerationChunk`` as received (``raw``), its
    parsed form (read for accounting, never re-encoded) and, on a turn's first chunk, the routing decision."""

    raw: bytes
    chunk: common_pb2.GenerationChunk
    route: pp.RouteInfo | None = None

    def wire(self) -> bytes:
        """The encoded ``TrajectoryGenerateResponse`` (route = field 1, chunk = field 2), built around the
        actor's bytes: byte for byte what serializing ``message()`` gives, without encoding the chunk again."""
        head = b""
        if self.route is not None:
            r = self.route.SerializeToString()
            head = b"\x0a" + _varint(len(r)) + r
        return head + b"\x12" + _varint(len(self.raw)) + self.raw

    def message(self) -> pp.TrajectoryGenerateResponse:
        resp = pp.TrajectoryGenerateResponse(chunk=self.chunk)
        if self.route is not None:
            resp.route.CopyFrom(self.route)
        return resp


class TurnError(errors.Coded):
    """Ends a turn with a gRPC status and the retryable-status trailing metadata (llmproxy.proto).

    The proxy's ``runtime.errors.Coded`` error: raised from a servicer method, the server's one mapper ends the
    call with it; the OpenAI HTTP API maps it to an HTTP status. ``field`` names the offending request field of
    an INVALID_ARGUMENT (trailing metadata ``rollart-field``).
    """

    code: grpc.StatusCode  # always a status code here (the HTTP API maps it), never a name

    def __init__(
        self, code: grpc.StatusCode, message: str, trailing: list[tuple[str, str]] | None = None, *, field: str = ""
    ) -> None:
        md = trailing or [(MD_RETRYABLE, "true" if code == grpc.StatusCode.UNAVAILABLE else "false")]
        super().__init__(code, message, trailing=md + ([(errors.MD_FIELD, field)] if field else []))

    @property
    def retryable(self) -> bool:
        return self.code == grpc.StatusCode.UNAVAILABLE


def unavailable(message: str, failed_actor: str = "", streamed: int = 0) -> TurnError:
    md = [(MD_RETRYABLE, "true"), (MD_TOKENS, str(streamed))]
    if failed_actor:
        md.append((MD_FAILED_ACTOR, failed_actor))
    return TurnError(grpc.StatusCode.UNAVAILABLE, message, md)


class _ActorFailed(Exception):
    """The actor failed the turn in a way another actor may not (dead, unreachable, wrong version)."""

    def __init__(self, actor: ActorEntry, message: str, dead: bool) -> None:
        super().__init__(message)
        self.actor = actor
        self.message = message
        self.dead = dead


def prompt_estimate(inp: common_pb2.ModelInput) -> int:
    """Prompt tokens, exact for token ids, a rough estimate for text (corrected once the actor answers)."""
    if inp.token_ids:
        return len(inp.token_ids)
    if inp.messages:
        return sum(len(m.content) for m in inp.messages) // 3 + 4 * len(inp.messages)
    return len(inp.text) // 3 + 1


@dataclass(eq=False)
class Turn:
    request_id: str
    trajectory_id: str
    lease_id: str
    abort_future: asyncio.Future
    aborted: bool = False
    # Set when the proxy cuts the turn because its actor was removed or died (UNAVAILABLE).
    failed: str = ""
    actor: ActorEntry | None = None
    actor_request_id: str = ""
    call: aio.UnaryStreamCall | None = None
    streamed: int = 0
    # Set once the turn's last chunk is handed on: an Abort that comes later no longer ends it.
    finished: bool = False
    cut_handle: asyncio.TimerHandle | None = None
    # PD: prompt tokens the prefill actor computed (not from its prefix cache), for the task's profile.
    prefill_uncached: int = 0

    def cut(self) -> None:
        if self.call is not None and not self.call.done():
            self.call.cancel()
