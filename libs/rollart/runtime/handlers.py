"""Helpers to wrap a grpc.aio method handler's behaviour while keeping its kind (unary/stream)."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import grpc
from grpc import aio

from . import errors

# Called around one RPC: gets (request_or_iterator, context, run) where run() performs the call; for streaming
# responses the wrapper receives an async iterator factory instead.
UnaryAround = Callable[[Any, aio.ServicerContext, Callable[[], Awaitable[Any]]], Awaitable[Any]]
StreamAround = Callable[[Any, aio.ServicerContext, Callable[[], AsyncIterator[Any]]], AsyncIterator[Any]]


def _factory(handler: grpc.RpcMethodHandler) -> Callable[..., grpc.RpcMethodHandler]:
    if handler.request_streaming and handler.response_streaming:
        return grpc.stream_stream_rpc_method_handler
    if handler.request_streaming:
        return grpc.stream_unary_rpc_method_handler
    if handler.response_streaming:
        return grpc.unary_stream_rpc_method_handler
    return grpc.unary_unary_rpc_method_handler


def _behavior(handler: grpc.RpcMethodHandler) -> Callable[..., Any]:
    behavior = handler.unary_unary or handler.unary_stream or handler.stream_unary or handler.stream_stream
    if behavior is None:
        raise TypeError("gRPC method handler has no behaviour to wrap")
    return behavior


class Malformed:
    """Stands in for a request that did not parse, so the call ends with INVALID_ARGUMENT instead of UNKNOWN."""

    def __init__(self, error: Exception) -> None:
        self.error = error


def _lenient(deserializer: Callable[[bytes], Any] | None) -> Callable[[bytes], Any] | None:
    if deserializer is None:
        return None

    def parse(data: bytes) -> Any:
        try:
            return deserializer(data)
        except Exception as exc:  # noqa: BLE001 - any parse failure is the caller's malformed input
            return Malformed(exc)

    return parse


async def _reject(context: aio.ServicerContext, bad: Malformed) -> None:
    await context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"malformed request message: {bad.error}")


def _checked(
    request: Any, context: aio.ServicerContext, streaming: bool, check: Callable[[Any], None] | None = None
) -> Any:
    if not streaming:
        if check is not None:
            check(request)
        return request

    async def messages() -> AsyncIterator[Any]:
        async for item in request:
            if isinstance(item, Malformed):
                await _reject(context, item)
            if check is not None:
                check(item)  # raises into the service's loop, which ends the call with its status
            yield item

    return messages()


async def _end_with_status(context: aio.ServicerContext, exc: Exception) -> None:
    """The one place a servicer's exception becomes a status (``rollart.runtime.errors``); others re-raise."""
    if isinstance(exc, aio.AbortError) or not errors.is_mapped(exc):
        raise exc
    await errors.abort(context, exc)


def _unparsed(data: bytes) -> None:
    """Deserializer of a call that is refused before its request is read: the bytes are dropped unparsed."""
    return None


def wrap(
    handler: grpc.RpcMethodHandler,
    unary: UnaryAround,
    stream: StreamAround,
    parse: bool = True,
    check: Callable[[Any], None] | None = None,
) -> grpc.RpcMethodHandler:
    """A handler of the same kind whose behaviour runs through ``unary`` or ``stream``.

    Requests that fail to parse end the call with INVALID_ARGUMENT before the service sees them. With
    ``parse=False`` the request bytes are never deserialised (the behaviour must not read the request): a refused
    call then costs no memory beyond the bytes gRPC already received, whatever the message holds. ``check`` runs
    on every request message before the service sees it (e.g. ``validation.check_limits``); what it raises ends
    the call like an error of the service. A
    ``rollart.runtime.errors.ServiceError`` (or known library error) the behaviour raises ends the call with its
    status.
    """
    behavior = _behavior(handler)
    req_streaming = handler.request_streaming
    new: Callable[[Any, aio.ServicerContext], Any]
    if handler.response_streaming:

        async def call_stream(request: Any, context: aio.ServicerContext) -> AsyncIterator[Any]:
            async def run() -> AsyncIterator[Any]:
                if isinstance(request, Malformed):
                    await _reject(context, request)
                try:
                    result = behavior(_checked(request, context, req_streaming, check), context)
                    if hasattr(result, "__aiter__"):
                        async for item in result:
                            yield item
                    else:  # a coroutine that writes with context.write()
                        await result
                except Exception as exc:  # noqa: BLE001 - mapped to a status, or re-raised unchanged
                    await _end_with_status(context, exc)

            async for item in stream(request, context, run):
                yield item

        new = call_stream
    else:

        async def call_unary(request: Any, context: aio.ServicerContext) -> Any:
            async def run() -> Any:
                if isinstance(request, Malformed):
                    await _reject(context, request)
                try:
                    return await behavior(_checked(request, context, req_streaming, check), context)
                except Exception as exc:  # noqa: BLE001 - mapped to a status, or re-raised unchanged
                    await _end_with_status(context, exc)

            return await unary(request, context, run)

        new = call_unary
    return _factory(handler)(
        new,
        request_deserializer=_lenient(handler.request_deserializer) if parse else _unparsed,
        response_serializer=handler.response_serializer,
    )


def aborting(handler: grpc.RpcMethodHandler, code: grpc.StatusCode, details: str) -> grpc.RpcMethodHandler:
    """A handler of the same kind that ends the call with ``code`` before touching the service.

    The request is never deserialised (a token-less 20 MB message costs no parse memory), and a streaming
    request is never read.
    """

    async def unary(request: Any, context: aio.ServicerContext, run: Any) -> Any:
        await context.abort(code, details)

    async def stream(request: Any, context: aio.ServicerContext, run: Any) -> AsyncIterator[Any]:
        await context.abort(code, details)
        yield  # pragma: no cover - unreachable, makes this an async generator

    return wrap(handler, unary, stream, parse=False)
