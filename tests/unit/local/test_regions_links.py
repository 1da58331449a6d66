"""The links process's forwarders: each direction its own link (rate, delay), forwarders of one direction share
its capacity, and the counters see the bytes per direction."""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import AsyncIterator, Callable
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


@contextlib.asynccontextmanager
async def _running(plan_for: Callable[..., dict], links: dict, **kw) -> AsyncIterator[tuple[Links, dict]]:
    """A Links process on loopback with the plan ``plan_for(target, links, **kw)`` in front of a ``_sink``."""
    srv = await asyncio.start_server(_sink, "127.0.1.1", 0)
    plan = plan_for(f"127.0.1.1:{srv.sockets[0].getsockname()[1]}", links, **kw)
    running = Links(plan)
    await running.start()
    try:
        yield running, plan
    finally:
        await running.stop()
        srv.close()


def test_directions_and_shared_capacity(links_plan):
    async def main() -> dict:
        directions = {"a->b": {"rate_mbps": 16, "rtt_ms": 100, "jitter_ms": 5}, "b->a": {"rate_mbps": 4, "rtt_ms": 100}}
        async with _running(links_plan, directions, names=("b>x0", "b>x1")) as (links, plan):
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
        return json.loads(Path(plan["counters_file"]).read_text())

    counters = asyncio.run(main())
    up = sum(f["bytes_up"] for f in counters["forwarders"].values())
    down = sum(f["bytes_down"] for f in counters["forwarders"].values())
    assert up == 1 + 400_001 + 2 * 200_001 and counters["links"]["b->a"]["bytes"] == up
    assert down == 1 + 401 + 2 * 201 and counters["links"]["a->b"]["bytes"] == down
    assert counters["forwarders"]["b>x0"]["connections"] == 3 and counters["forwarders"]["b>x1"]["connections"] == 1


def test_flow_cap_per_connection_under_the_shared_link(links_plan):
    """flow_mbps caps each connection (one TCP flow's window/RTT bound): one connection gets the flow's rate,
    four at once get four times it, within the link's rate."""

    async def main() -> tuple[float, float]:
        directions = {"a->b": {"rate_mbps": 8, "flow_mbps": 2}, "b->a": {"rate_mbps": 8, "flow_mbps": 2}}
        async with _running(links_plan, directions) as (links, _plan):
            ep = links.emulators["b>x"][0].endpoint
            one = (await _roundtrip(ep, b"u" * 400_000))[0]  # 400 kB at 2 Mbit/s: 1.6 s
            t0 = time.monotonic()
            await asyncio.gather(*(_roundtrip(ep, b"u" * 100_000) for _ in range(4)))  # 4 x 2 Mbit/s: 0.4 s
            four = time.monotonic() - t0
        return one, four

    one, four = asyncio.run(main())
    assert one >= 1.6 * 0.95, one
    assert 0.4 * 0.95 <= four < 1.2, four


def test_restart_links_from_its_plan(tmp_path: Path, links_plan_file: str):
    """A dead links process started again on the same forwarder addresses; a live one is not started twice."""
    import socket
    import subprocess
    import sys

    from rollart.local import cluster as local
    from rollart.local.processes import ProcessError, stop_pid
    from rollart.local.regions import restart_links

    with pytest.raises(ProcessError, match="no links process"):
        restart_links(tmp_path)
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    local.write_state(tmp_path, {"links": {"pid": dead.pid, "log": str(tmp_path / "links.log")}})
    info = restart_links(tmp_path)
    try:
        assert info["restarts"] == 1 and local.read_state(tmp_path)["links"]["pid"] == info["pid"]
        host, port = links_plan_file.rsplit(":", 1)
        socket.create_connection((host, int(port)), timeout=2).close()  # the same address listens again
        with pytest.raises(ProcessError, match="is running"):
            restart_links(tmp_path)
    finally:
        assert stop_pid(info["pid"])


def test_control_actions_are_checked():
    from rollart.netem.links import check_action

    links = {"a->b": {}, "b->a": {}}
    assert check_action({"down_s": 30}, links) == {"link": "*", "down_s": 30.0}
    assert check_action({"link": "a->b", "rate_factor": 0.1, "for_s": 60}, links) == {
        "link": "a->b", "rate_factor": 0.1, "for_s": 60.0}  # fmt: skip
    for bad, msg in [
        ({"link": "a->c", "down_s": 1}, "no link"),
        ({"down_s": 1, "rate_mbps": 2}, "exactly one"),
        ({}, "exactly one"),
        ({"down_s": 0}, "out of range"),
        ({"rate_factor": "x"}, "not a number"),
        ({"down_s": 1, "for_s": 2}, "own duration"),
        ({"down": 1}, "unknown key"),
        ([1], "an object"),
    ]:
        with pytest.raises(ValueError, match=msg):
            check_action(bad, links)


def test_control_takes_a_link_down_and_cuts_its_rate_for_a_while(tmp_path: Path, links_plan):
    """A link down for 1 s holds a round trip ~1 s (the connection stays open); its rate / 10 for 2 s makes
    100 kB take ~10x as long, and then the plan's rate is back. A bad control file is refused, recorded."""
    from rollart.netem.links import control_dir, request

    async def main() -> tuple[dict, dict]:
        directions = {"a->b": {"rate_mbps": 8, "rtt_ms": 10}, "b->a": {"rate_mbps": 8, "rtt_ms": 10}}
        async with _running(links_plan, directions) as (links, plan):
            ep = links.emulators["b>x"][0].endpoint
            times = {"base": (await _roundtrip(ep, b"u" * 100_000))[0]}
            folder = control_dir(plan)
            assert folder == tmp_path / "links-control"
            request(folder, [{"down_s": 1.0}])
            links.poll_control()
            assert list(folder.glob("*")) == []  # consumed
            dt, answer = await _roundtrip(ep, b"")
            times["down"] = dt
            assert answer == b"!"
            request(folder, [{"link": "b->a", "rate_factor": 0.1, "for_s": 2.0}])
            (folder / "bad.json").write_text('[{"link": "nowhere", "down_s": 1}]')
            links.poll_control()
            times["slow"] = (await _roundtrip(ep, b"u" * 100_000))[0]
            await asyncio.sleep(max(0.0, 2.2 - times["slow"]))
            times["after"] = (await _roundtrip(ep, b"u" * 100_000))[0]
            links.write_counters()
        return times, json.loads(Path(plan["counters_file"]).read_text())

    times, counters = asyncio.run(main())
    assert times["base"] < 0.5 and times["after"] < 0.5, times
    assert 0.9 <= times["down"] < 2.0, times
    assert times["slow"] >= 0.9 and times["slow"] > 4 * times["base"], times
    faults = counters["faults"]
    assert faults[0]["down_s"] == 1.0 and sorted(faults[0]["links"]) == ["a->b", "b->a"]
    assert any("refused" in f and "nowhere" in f["refused"] for f in faults)
    assert any(f.get("rate_factor") == 0.1 and f["links"] == ["b->a"] for f in faults)
    assert any(f.get("restored_mbps") == 8.0 and f["link"] == "b->a" for f in faults)
