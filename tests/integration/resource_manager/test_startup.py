"""The resource manager started against a Redis that does not answer: one log line naming the setting (the URL
without its password), exit status 1, no traceback: a restarting container repeats one clear line."""

from __future__ import annotations

import json
import socket
import subprocess
import time

import pytest

from rollart.local.processes import start_redis
from tests.conftest import BIN

pytestmark = pytest.mark.timeout(120)


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _run(services, url: str, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [str(BIN / "rollart-resource-manager")],
        env=services.env(ROLLART_REDIS_URL=url, **env),
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_unreachable_redis_is_one_line_naming_the_setting(services):
    url = f"redis://:hunter2-secret@127.0.0.1:{_closed_port()}/0"
    t0 = time.monotonic()
    out = _run(services, url)
    assert out.returncode == 1 and time.monotonic() - t0 < 30
    text = out.stdout + out.stderr
    assert "Traceback" not in text and "hunter2" not in text
    errors = [json.loads(ln) for ln in text.splitlines() if ln.startswith("{") and '"ERROR"' in ln]
    assert len(errors) == 1, text
    msg = errors[0]["msg"]
    assert msg.startswith("startup failed: cannot reach Redis at redis://:***@127.0.0.1:"), errors[0]
    assert "ROLLART_REDIS_URL" in msg
    # Text logs too: still one line.
    out = _run(services, url, ROLLART_LOG_FORMAT="text")
    lines = [ln for ln in (out.stdout + out.stderr).splitlines() if "startup failed" in ln]
    assert out.returncode == 1 and len(lines) == 1 and "Traceback" not in out.stderr


def test_redis_killed_before_start_then_back(services, tmp_path):
    """Redis dies between the container's PING check and the resource manager's start: it exits with the line;
    started again once Redis is back (what a restart policy does), it serves."""
    redis, url = start_redis(tmp_path / "store")
    port = int(url.rsplit(":", 1)[1].split("/")[0])
    redis.kill()
    out = _run(services, url)
    assert out.returncode == 1 and "cannot reach Redis" in out.stderr + out.stdout
    redis, _ = start_redis(tmp_path / "store", port=port)
    try:
        _, address = services.resource_manager(url)
        assert address.startswith("127.0.0.1:")
    finally:
        redis.stop()
