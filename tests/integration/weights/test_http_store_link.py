"""Full checkpoints over an emulated link: a real static file server (busybox httpd when installed, else python's
http.server, as ``cluster.regions`` starts it) over a directory store, read by the HTTP store through a links
forwarder. The download pays the link's rate, its bytes are counted on the link's down direction, a link cut
mid-download leaves nothing in the cache and the next read succeeds, and a killed server is started again."""

from __future__ import annotations

import asyncio
import os
import signal
import time
from pathlib import Path

import numpy as np
import pytest

from rollart.delta import WeightSet
from rollart.local.processes import free_port
from rollart.local.regions import file_server_argv
from rollart.netem.links import Links
from rollart.weights.checkpoint_store import CheckpointError, DirectoryStore
from rollart.weights.http_store import HttpStore

pytestmark = pytest.mark.timeout(90)

RATE_MBPS = 4.0  # 500 kB/s down: a 600 kB checkpoint takes >= 1.2 s
RTT_MS = 40.0


def _plan(tmp_path: Path, folder: Path) -> dict:
    address = f"127.0.1.1:{free_port('127.0.1.1')}"
    link = {"rate_mbps": RATE_MBPS, "rtt_ms": RTT_MS, "jitter_ms": 0.0, "loss": 0.0}
    return {
        "links": {"train->infer": link, "infer->train": link},
        "forwarders": [
            {"name": "infer>checkpoints", "listen": "127.0.2.2:0", "target": address,
             "up": "infer->train", "down": "train->infer"},
        ],
        "servers": [{"name": "checkpoints", "address": address, "argv": file_server_argv(str(folder), address),
                     "log": str(tmp_path / "checkpoints.log")}],
        "ready_file": str(tmp_path / "ready"),
        "counters_file": str(tmp_path / "links.json"),
    }  # fmt: skip


def test_checkpoint_through_the_link(tmp_path: Path):
    folder = tmp_path / "weights"
    store = DirectoryStore(folder)
    rng = np.random.default_rng(0)
    ws = WeightSet.from_arrays({"w": rng.integers(0, 1 << 16, (300, 1000), dtype=np.uint16)}, {"w": "BF16"})
    info = store.put(1, ws)
    assert info.size > 600_000

    async def main() -> None:
        links = Links(_plan(tmp_path, folder))
        await links.start()
        try:
            emu, _ = links.emulators["infer>checkpoints"]
            remote = HttpStore(f"http://{emu.endpoint}/", cache_dir=tmp_path / "cache", timeout=20.0)
            assert await asyncio.to_thread(remote.versions) == [1]
            t0 = time.monotonic()
            got = await asyncio.to_thread(remote.open, 1)
            took = time.monotonic() - t0
            assert got.arrays["w"].tobytes() == ws.arrays["w"].tobytes()
            assert took >= info.size * 8 / (RATE_MBPS * 1e6) * 0.85, took  # the link's rate, not loopback's
            down = links.counters()["links"]["train->infer"]["bytes"]
            assert down >= info.size

            # The link cut mid-download: an error, no partial file in the cache; the next read succeeds.
            store.put(2, ws)
            task = asyncio.ensure_future(asyncio.to_thread(remote.local_path, 2))
            await asyncio.sleep(0.5)
            for c in list(emu._conns):
                c.abort()
            with pytest.raises(CheckpointError, match="short read|failed"):
                await task
            vdir = tmp_path / "cache" / remote.cache_root.relative_to(tmp_path / "cache") / "v000000000002"
            assert not list(vdir.glob("model.safetensors*")) and not list(vdir.glob(".*"))
            assert (await asyncio.to_thread(remote.open, 2)).arrays["w"].shape == (300, 1000)

            # The server killed: the links process starts it again, and reads go on.
            srv = links.servers[0]
            assert srv.proc is not None
            os.kill(srv.proc.pid, signal.SIGKILL)
            srv.proc.wait()
            await srv.check()
            assert srv.restarts == 1 and links.counters()["servers"]["checkpoints"]["alive"]
            assert (await asyncio.to_thread(remote.info, 2)).sha256 == store.info(2).sha256
        finally:
            await links.stop()
        assert links.servers[0].proc is not None and links.servers[0].proc.poll() is not None  # stopped with it

    asyncio.run(main())
