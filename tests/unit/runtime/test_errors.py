"""rollart.runtime.errors: the one error-to-status mapping, and the handler wrapper that applies it."""

from __future__ import annotations

import asyncio

import grpc
import pytest
from grpc import aio
from pydantic import BaseModel
from redis.exceptions import ConnectionError as RedisConnectionError

from rollart.runtime import errors
from rollart.runtime.server import TelemetryInterceptor


def test_typed_errors_carry_their_code():
    cases = {
        errors.NotFound("x"): grpc.StatusCode.NOT_FOUND,
        errors.AlreadyExists("x"): grpc.StatusCode.ALREADY_EXISTS,
        errors.FailedPrecondition("x"): grpc.StatusCode.FAILED_PRECONDITION,
        errors.Unavailable("x"): grpc.StatusCode.UNAVAILABLE,
        errors.ResourceExhausted("x"): grpc.StatusCode.RESOURCE_EXHAUSTED,
        errors.PermissionDenied("x"): grpc.StatusCode.PERMISSION_DENIED,
        errors.OutOfRange("x"): grpc.StatusCode.OUT_OF_RANGE,
        errors.Aborted("x"): grpc.StatusCode.ABORTED,
        errors.DeadlineExceeded("x"): grpc.StatusCode.DEADLINE_EXCEEDED,
        errors.InvalidArgument("f", "x"): grpc.StatusCode.INVALID_ARGUMENT,
    }
    for exc, code in cases.items():
        assert errors.status_of(exc)[0] == code


def test_invalid_argument_names_the_field():
    code, details, trailing = errors.status_of(errors.InvalidArgument("max_workers", "must be > 0"))
    assert details == "max_workers: must be > 0"
    assert (errors.MD_FIELD, "max_workers") in trailing
    # A message that already starts with the field is not prefixed twice.
    assert errors.InvalidArgument("limit", "limit must be >= 0").details() == "limit must be >= 0"
    assert errors.InvalidArgument("", "bad").details() == "bad"


def test_error_for_a_code_chosen_at_run_time():
    assert isinstance(errors.error_for("NOT_FOUND", "m"), errors.NotFound)
    assert isinstance(errors.error_for(grpc.StatusCode.INVALID_ARGUMENT, "m"), errors.InvalidArgument)
    assert errors.error_for("NO_SUCH_CODE", "m").code == grpc.StatusCode.UNKNOWN
    assert errors.error_for(grpc.StatusCode.DATA_LOSS, "m").code == grpc.StatusCode.DATA_LOSS


def test_library_errors_map_to_statuses():
    code, details, _ = errors.status_of(RedisConnectionError("connection refused"))
    assert code == grpc.StatusCode.UNAVAILABLE and "connection refused" in details

    class Spec(BaseModel):
        steps: int

    with pytest.raises(Exception) as info:
        Spec(steps="many")
    code, details, trailing = errors.status_of(info.value)
    assert code == grpc.StatusCode.INVALID_ARGUMENT
    assert details.startswith("steps: ") and (errors.MD_FIELD, "steps") in trailing
    assert errors.status_of(ValueError("plain")) is None
    assert not errors.is_mapped(KeyError("k"))


def test_details_and_metadata_are_bounded():
    huge = "x" * 100_000
    code, details, trailing = errors.status_of(errors.NotFound(huge, trailing=[("k", huge)]))
    assert len(details.encode()) <= errors.MAX_DETAILS_BYTES
    assert details.endswith("…(+100000 bytes)")
    assert all(len(v.encode()) <= errors.MAX_METADATA_VALUE_BYTES for _, v in trailing)
    # Multi-byte characters are never split.
    code, details, _ = errors.status_of(errors.NotFound("é" * 5000))
    assert len(details.encode()) <= errors.MAX_DETAILS_BYTES
    details.encode().decode()


def test_shorten_echoed_values():
    assert errors.shorten("job-1") == "'job-1'"
    long = "a" * 5000
    out = errors.shorten(long)
    assert out.endswith("…(5000 bytes)") and len(out) < 130
    assert errors.shorten(b"\x00" * 10) == repr(b"\x00" * 10)
    assert errors.shorten(12) == "12"


# --- applied centrally: a servicer raises, the wrapper ends the call with the status -----------------------


class _Raising:
    """A generic bytes-in/bytes-out service whose methods raise what the request names."""

    RAISES = {
        b"notfound": errors.NotFound("no pool named 'p'"),
        b"invalid": errors.InvalidArgument("job_id", "must match [A-Za-z0-9]"),
        b"redis": RedisConnectionError("refused"),
        b"huge": errors.Unavailable("y" * 50_000),
        b"unmapped": KeyError("bug"),
    }

    async def unary(self, request: bytes, context: aio.ServicerContext) -> bytes:
        if request in self.RAISES:
            raise self.RAISES[request]
        return b"ok:" + request

    async def stream(self, request: bytes, context: aio.ServicerContext):
        yield b"first"
        if request in self.RAISES:
            raise self.RAISES[request]
        yield b"second"

    def handler(self) -> grpc.GenericRpcHandler:
        return grpc.method_handlers_generic_handler(
            "test.Raising",
            {
                "Unary": grpc.unary_unary_rpc_method_handler(self.unary),
                "Stream": grpc.unary_stream_rpc_method_handler(self.stream),
            },
        )


@pytest.mark.parametrize("interceptor", [TelemetryInterceptor("test"), errors.StatusInterceptor()], ids=["serve", "bare"])
def test_raised_errors_become_statuses_through_the_server_wrapper(interceptor):
    async def scenario() -> None:
        server = aio.server(interceptors=[interceptor])
        server.add_generic_rpc_handlers([_Raising().handler()])
        port = server.add_insecure_port("127.0.0.1:0")
        await server.start()
        try:
            async with aio.insecure_channel(f"127.0.0.1:{port}") as ch:
                unary = ch.unary_unary("/test.Raising/Unary")
                stream = ch.unary_stream("/test.Raising/Stream")
                assert await unary(b"fine") == b"ok:fine"

                with pytest.raises(aio.AioRpcError) as info:
                    await unary(b"notfound")
                assert info.value.code() == grpc.StatusCode.NOT_FOUND
                assert info.value.details() == "no pool named 'p'"

                with pytest.raises(aio.AioRpcError) as info:
                    await unary(b"invalid")
                assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
                assert info.value.details() == "job_id: must match [A-Za-z0-9]"
                assert (errors.MD_FIELD, "job_id") in tuple(info.value.trailing_metadata())

                with pytest.raises(aio.AioRpcError) as info:
                    await unary(b"redis")
                assert info.value.code() == grpc.StatusCode.UNAVAILABLE

                with pytest.raises(aio.AioRpcError) as info:
                    await unary(b"huge")
                assert info.value.code() == grpc.StatusCode.UNAVAILABLE
                assert len(info.value.details().encode()) <= errors.MAX_DETAILS_BYTES

                with pytest.raises(aio.AioRpcError) as info:
                    await unary(b"unmapped")
                assert info.value.code() == grpc.StatusCode.UNKNOWN  # a bug stays a bug

                got: list[bytes] = []
                with pytest.raises(aio.AioRpcError) as info:
                    async for item in stream(b"notfound"):
                        got.append(item)
                assert got == [b"first"] and info.value.code() == grpc.StatusCode.NOT_FOUND
        finally:
            await server.stop(0)

    asyncio.run(scenario())
