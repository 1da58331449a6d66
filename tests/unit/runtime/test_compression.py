"""ROLLART_GRPC_COMPRESSION: a channel's requests are compressed as asked (a real server decodes them; a counting
TCP relay between them sees the bytes shrink), and a bad value is refused naming the variable."""

from __future__ import annotations

import asyncio

import grpc
import pytest
from grpc import aio

from rollart.runtime.client import COMPRESSION_ENV, channel, channel_compression


def test_values(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(COMPRESSION_ENV, raising=False)
    assert channel_compression() is None
    for raw, want in (("gzip", grpc.Compression.Gzip), (" Deflate ", grpc.Compression.Deflate), ("none", None)):
        monkeypatch.setenv(COMPRESSION_ENV, raw)
        assert channel_compression() == want
    monkeypatch.setenv(COMPRESSION_ENV, "zstd")
    with pytest.raises(ValueError, match="ROLLART_GRPC_COMPRESSION='zstd'"):
        channel_compression()


async def _counting_relay(port: int, counted: list[int]) -> asyncio.Server:
    """Forwards to 127.0.0.1:port, adding the client->server bytes to counted[0]."""

    async def pipe(r: asyncio.StreamReader, w: asyncio.StreamWriter, count: bool) -> None:
        while data := await r.read(65536):
            if count:
                counted[0] += len(data)
            w.write(data)
            await w.drain()
        w.close()

    async def handle(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        ur, uw = await asyncio.open_connection("127.0.0.1", port)
        await asyncio.gather(pipe(r, uw, True), pipe(ur, w, False), return_exceptions=True)

    return await asyncio.start_server(handle, "127.0.0.1", 0)


async def test_a_compressed_request_reaches_a_real_server_whole(monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[int] = []

    async def echo(request: bytes, context: aio.ServicerContext) -> bytes:
        seen.append(len(request))
        return request[:16]

    server = aio.server()
    handler = grpc.method_handlers_generic_handler("t.Echo", {"Call": grpc.unary_unary_rpc_method_handler(echo)})
    server.add_generic_rpc_handlers((handler,))
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    sent: dict[str, int] = {}
    try:
        payload = b"token 17 version 3 " * 5000  # repetitive, as a trajectory's ids and versions are
        for mode in ("gzip", "none"):
            counted = [0]
            relay = await _counting_relay(port, counted)
            monkeypatch.setenv(COMPRESSION_ENV, mode)
            ch = channel(f"127.0.0.1:{relay.sockets[0].getsockname()[1]}", token=None)
            call = ch.unary_unary("/t.Echo/Call")
            assert await call(payload, timeout=10) == payload[:16]
            await ch.close()
            relay.close()
            sent[mode] = counted[0]
        assert seen == [len(payload)] * 2  # decoded whole by the server both times
        assert sent["none"] > len(payload) > 20 * sent["gzip"], sent
    finally:
        await server.stop(None)
