"""The listening side: accepts stripes, authenticates each (``handshake``) and hands it to the session its
``admit`` callback chose; a rejected dialer is told why."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable

from .errors import HandshakeError
from .framing import DEFAULT_MAX_FRAME_BYTES, Connection, _tune
from .handshake import Admit, server_handshake

log = logging.getLogger(__name__)


class TransportServer:
    """Accepts stripes: authenticates each, then hands it to the session ``admit`` chose."""

    def __init__(
        self,
        *,
        key_for: Callable[[str], bytes | None],
        admit: Admit,
        host: str = "127.0.0.1",
        port: int = 0,
        handshake_timeout: float = 10.0,
        max_frame_bytes: int = DEFAULT_MAX_FRAME_BYTES,
    ) -> None:
        self.key_for = key_for
        self.admit = admit
        self.host, self.port = host, port
        self.handshake_timeout = handshake_timeout
        self.max_frame_bytes = max_frame_bytes
        self.server: asyncio.base_events.Server | None = None
        self.rejected = 0
        self.accepted = 0
        self.last_rejection: str | None = None

    async def start(self) -> str:
        self.server = await asyncio.start_server(self._client, self.host, self.port, limit=1 << 20)
        self.port = self.server.sockets[0].getsockname()[1]
        return self.address

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"

    async def stop(self) -> None:
        if self.server is not None:
            self.server.close()
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self.server.wait_closed(), 2.0)

    async def _client(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        _tune(writer)
        try:
            hello, take = await asyncio.wait_for(
                server_handshake(reader, writer, self.key_for, self.admit), self.handshake_timeout
            )
        except (HandshakeError, TimeoutError, asyncio.IncompleteReadError, ConnectionError, OSError) as exc:
            self.rejected += 1
            self.last_rejection = f"{type(exc).__name__}: {exc}"
            log.warning("transport: rejected %s: %s", writer.get_extra_info("peername"), self.last_rejection)
            writer.close()
            return
        self.accepted += 1
        take(Connection(reader, writer, hello, self.max_frame_bytes))
