"""The token check runs before the request is deserialised: a refused call never parses its message."""

from __future__ import annotations

import asyncio
from collections import namedtuple

import grpc

from rollart.runtime.auth import TokenAuthInterceptor, bearer

Details = namedtuple("Details", "method invocation_metadata")


class CountingParser:
    def __init__(self) -> None:
        self.calls = 0

    def __call__(self, data: bytes) -> bytes:
        self.calls += 1
        return data


def intercept(metadata, streaming: bool = False, method: str = "/rollart.v1.Ledger/AddPrompts"):
    parser = CountingParser()

    async def behaviour(request, context):  # pragma: no cover - never reached when refused
        return request

    factory = grpc.stream_unary_rpc_method_handler if streaming else grpc.unary_unary_rpc_method_handler
    handler = factory(behaviour, request_deserializer=parser, response_serializer=bytes)

    async def continuation(details):
        return handler

    interceptor = TokenAuthInterceptor("secret")
    result = asyncio.run(interceptor.intercept_service(continuation, Details(method, tuple(metadata))))
    return result, parser


def test_token_less_and_wrong_token_calls_never_parse_the_request():
    for md in ([], [bearer("wrong")], [("authorization", "secret")]):
        for streaming in (False, True):
            refused, parser = intercept(md, streaming)
            assert refused.request_streaming == streaming
            assert refused.request_deserializer(b"\x0a" * 1_000_000) is None
            assert parser.calls == 0


def test_a_valid_token_keeps_the_service_parser():
    accepted, parser = intercept([bearer("secret")])
    assert accepted.request_deserializer(b"abc") == b"abc" and parser.calls == 1


def test_health_needs_no_token():
    handler, parser = intercept([], method="/grpc.health.v1.Health/Check")
    assert handler.request_deserializer(b"x") == b"x" and parser.calls == 1
