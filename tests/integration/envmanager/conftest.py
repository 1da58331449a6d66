"""Docker for the envmanager tests: uses a running daemon, or starts one (root, dockerd installed) and stops it."""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterator

import pytest

from rollart_envmanager.sandbox import docker as dk
from rollart_envmanager.sandbox.base import SandboxLimits

_STATE: dict[str, object] = {}


def _ensure_docker() -> tuple[bool, str]:
    """Once per session: a daemon that answers, started here when none runs (stopped at the end)."""
    if "ok" not in _STATE:
        ok, reason = dk.availability(refresh=True)
        if not ok and not os.environ.get("ROLLART_NO_DOCKERD") and dk.docker_cli() is not None:
            try:
                _STATE["daemon"] = dk.start_daemon(os.path.join(tempfile.gettempdir(), "rollart-dockerd", "log"))
                ok, reason = True, ""
            except dk.SandboxFailure as exc:
                reason = f"{reason}; starting dockerd failed: {exc.message}"
        _STATE["ok"], _STATE["reason"] = ok, reason
    return bool(_STATE["ok"]), str(_STATE["reason"])


@pytest.fixture(scope="session")
def docker_ok() -> Iterator[str]:
    ok, reason = _ensure_docker()
    if not ok:
        pytest.skip(f"docker unavailable: {reason}")
    yield "ok"
    daemon = _STATE.pop("daemon", None)
    if daemon is not None:
        dk.stop_daemon(daemon)  # a daemon this session started
        _STATE.clear()


def _image(build) -> str:
    try:
        return build()
    except dk.SandboxFailure as exc:  # e.g. no static busybox: Debian's busybox-static is not installed
        pytest.skip(f"docker sandbox image cannot be built here: {exc.message}")


@pytest.fixture(scope="session")
def docker_python_image(docker_ok) -> str:
    return _image(dk.python_image)


@pytest.fixture(scope="session")
def docker_busybox_image(docker_ok) -> str:
    return _image(dk.busybox_image)


@pytest.fixture
def small_limits() -> SandboxLimits:
    return SandboxLimits(step_timeout_s=3, time_budget_s=60, memory_mib=256, pids_limit=32, workspace_mib=16,
                         file_size_mib=4)


@pytest.fixture
def loopback_server() -> Iterator[int]:
    """A TCP server on the host's 127.0.0.1 (a sandbox must not reach it)."""
    import socket
    import threading

    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(8)
    srv.settimeout(0.2)
    stop = threading.Event()

    def serve() -> None:
        while not stop.is_set():
            try:
                conn, _ = srv.accept()
                conn.sendall(b"host-secret\n")
                conn.close()
            except OSError:
                continue

    t = threading.Thread(target=serve, daemon=True)
    t.start()
    yield srv.getsockname()[1]
    stop.set()
    t.join(2)
    srv.close()
