"""Shared fixtures of the weight-plane unit tests."""

from __future__ import annotations

import functools
import threading
from collections.abc import Callable, Iterator
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

ServeFolder = Callable[..., tuple[ThreadingHTTPServer, str]]


@pytest.fixture
def serve_folder() -> Iterator[ServeFolder]:
    """Starts an HTTP server on loopback over a folder, in this process: ``serve_folder(handler, root, **attrs)``
    (``attrs`` set on the server before it serves) returns the server and its URL; stopped after the test."""
    servers: list[ThreadingHTTPServer] = []

    def start(handler: type[SimpleHTTPRequestHandler], root: Path, **attrs: Any) -> tuple[ThreadingHTTPServer, str]:
        srv = ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(handler, directory=str(root)))
        for name, value in attrs.items():
            setattr(srv, name, value)
        servers.append(srv)
        threading.Thread(target=srv.serve_forever, daemon=True).start()
        return srv, f"http://127.0.0.1:{srv.server_address[1]}/"

    try:
        yield start
    finally:
        for srv in servers:
            srv.shutdown()
            srv.server_close()
