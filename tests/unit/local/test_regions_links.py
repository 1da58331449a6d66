"""The links process's forwarders: each direction its own link (rate, delay), forwarders of one direction share
its capacity, and the counters see the bytes per direction."""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path

import pytest

from rollart.netem.links import Links

pytestmark = pytest.mark.timeout(60)


async def _sink(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    """Reads everything, then answers one byte per 1000 read, and a last b"!" (a download of a known size)."""
    n = 0
    while data := await reader.read(65536):
        n += len(data)
        if data.endswith(b"."):
            break
    writer.write(b"d" * (n // 1000) + b"!")
    await writer.drain()
    writer.close()


async def _roundtrip(endpoint: str, payload: bytes) -> tuple[float, bytes]:
    host, port = endpoint.rsplit(":", 1)
    reader, writer = await asyncio.open_connection(host, int(port))
    t0 = time.monotonic()
    writer.write(payload + b".")
    await writer.drain()
    answer = await reader.read()
    writer.close()
    return time.monotonic() - t0, answer


def test_directions_and_shared_capacity(tmp_path: Path):
    async def main() -> dict:
        srv = await asyncio.start_server(_sink, "127.0.1.1", 0)
        target = f"127.0.1.1:{srv.sockets[0].getsockname()[1]}"
        plan = {
            "links": {"a->b": {"rate_mbps": 16, "rtt_ms": 100, "jitter_ms": 5}, "b->a": {"rate_mbps": 4, "rtt_ms": 100}},
            "forwarders": [
                {"name": f"b>x{i}", "listen": "127.0.2.2:0", "target": target, "up": "b->a", "down": "a->b"}
                for i in range(2)
            ],
            "ready_file": str(tmp_path / "ready"),
            "counters_file": str(tmp_path / "links.json"),
        }  # fmt: skip
        links = Links(plan)
        await links.start()
        eps = [emu.endpoint for emu, _ in links.emulators.values()]
        # One byte each way: a round trip of the link's RTT.
        dt, answer = await _roundtrip(eps[0], b"")
        assert answer == b"!" and 0.1 <= dt < 0.5
        # 400 kB up at 4 Mbit/s (b->a): at least 0.8 s; the answer (400 B) comes back on a->b.
        dt, answer = await _roundtrip(eps[0], b"u" * 400_000)
        assert answer == b"d" * 400 + b"!" and dt >= 0.8 + 0.1 * 0.9
        # Two forwarders of the same direction share it: 2 x 200 kB at once take as long as 400 kB.
        t0 = time.monotonic()
        await asyncio.gather(*(_roundtrip(ep, b"u" * 200_000) for ep in eps))
        assert time.monotonic() - t0 >= 0.8
        links.write_counters()
        await links.stop()
        srv.close()
        return json.loads(Path(plan["counters_file"]).read_text())

    counters = asyncio.run(main())
    up = sum(f["bytes_up"] for f in counters["forwarders"].values())
    down = sum(f["bytes_down"] for f in counters["forwarders"].values())
    assert up == 1 + 400_001 + 2 * 200_001 and counters["links"]["b->a"]["bytes"] == up
    assert down == 1 + 401 + 2 * 201 and counters["links"]["a->b"]["bytes"] == down
    assert counters["forwarders"]["b>x0"]["connections"] == 3 and counters["forwarders"]["b>x1"]["connections"] == 1


def test_restart_links_from_its_plan(tmp_path: Path):
    """A dead links process started again on the same forwarder addresses; a live one is not started twice."""
    import socket
    import subprocess
    import sys

    from rollart.local import cluster as local
    from rollart.local.processes import ProcessError, free_port, stop_pid
    from rollart.local.regions import restart_links

    listen = f"127.0.2.2:{free_port('127.0.2.2')}"
    plan = {
        "links": {"a->b": {"rate_mbps": 8}, "b->a": {"rate_mbps": 8}},
        "forwarders": [{"name": "b>x", "listen": listen, "target": "127.0.1.1:9", "up": "b->a", "down": "a->b"}],
        "ready_file": str(tmp_path / "run" / "links.ready"),
        "counters_file": str(tmp_path / "links.json"),
    }  # fmt: skip
    (tmp_path / "links-plan.json").write_text(json.dumps(plan))
    with pytest.raises(ProcessError, match="no links process"):
        restart_links(tmp_path)
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    local.write_state(tmp_path, {"links": {"pid": dead.pid, "log": str(tmp_path / "links.log")}})
    info = restart_links(tmp_path)
    try:
        assert info["restarts"] == 1 and local.read_state(tmp_path)["links"]["pid"] == info["pid"]
        host, port = listen.rsplit(":", 1)
        socket.create_connection((host, int(port)), timeout=2).close()  # the same address listens again
        with pytest.raises(ProcessError, match="is running"):
            restart_links(tmp_path)
    finally:
        assert stop_pid(info["pid"])
