"""The links between a job's regions as one process: a TCP forwarder per (caller region, callee endpoint), each a
:class:`WanEmulator`, and every forwarder crossing the same ordered pair of regions sharing that direction's link
(one token bucket and window per direction of a pair, so a weight push and the lease traffic compete for it).

``python -m rollart.netem.links PLAN.json`` reads the plan ``rollart.local.regions`` writes::

    {"links": {"train->infer": {"rate_mbps": 40, "rtt_ms": 40, "jitter_ms": 2, "loss": 0.0}, ...},
     "forwarders": [{"name": "infer>ledger", "listen": "127.0.2.2:41001", "target": "127.0.1.1:40001",
                     "up": "infer->train", "down": "train->infer"}, ...],
     "servers": [{"name": "checkpoints", "argv": ["busybox", "httpd", "-f", ...], "address": "127.0.1.1:40100",
                  "log": ".../checkpoints.log"}],
     "ready_file": ".../links.ready", "counters_file": ".../links.json"}

``up`` is the caller's direction (client -> target). ``servers`` are processes of a region that its links carry
(the trainer region's checkpoint file server): started as children, ready once they accept a connection,
restarted when they die (each restart counted), stopped with this process. It writes the ready file once every
forwarder listens and every server accepts, and the counters (bytes per forwarder and per link direction,
connections, servers' pids and restarts) every second and when stopped.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from rollart.netem.wan import LinkSpec, RateWindow, TokenBucket, WanEmulator

MSS = 1448  # bytes of one TCP segment: the unit a loss probability applies to
MIN_RTO_S = 0.2  # Linux's minimum retransmission timeout: what one loss costs a flow at least


def path_spec(link: dict[str, Any]) -> LinkSpec:
    """One direction of a link as a LinkSpec: the rate is the link's (shared, no per-flow cap); a loss
    probability per segment becomes a stall of one RTO per 64 KiB chunk with the same odds of a loss in it."""
    rtt = float(link.get("rtt_ms", 0.0)) / 1000
    loss = float(link.get("loss", 0.0))
    chunk = LinkSpec.chunk
    stall_prob = 1 - (1 - loss) ** (chunk / MSS) if loss > 0 else 0.0
    return LinkSpec(
        link_rate=float(link["rate_mbps"]) * 1e6 / 8,
        rtt=rtt,
        jitter=float(link.get("jitter_ms", 0.0)) / 1000,
        stall_prob=stall_prob,
        stall_s=max(MIN_RTO_S, rtt),
    )


SERVER_READY_S = 15.0  # a server that does not accept a connection by then fails the links process's start
MAX_SERVER_RESTARTS = 20


class Server:
    """A child process serving on ``address`` (a region's file server), restarted when it dies."""

    def __init__(self, spec: dict[str, Any]) -> None:
        self.spec = spec
        self.proc: subprocess.Popen[bytes] | None = None
        self.restarts = 0
        self.last_exit: int | None = None

    def start(self) -> None:
        Path(self.spec["log"]).parent.mkdir(parents=True, exist_ok=True)
        with open(self.spec["log"], "ab") as log:
            self.proc = subprocess.Popen(self.spec["argv"], stdin=subprocess.DEVNULL, stdout=log, stderr=log)

    async def wait_ready(self, timeout: float = SERVER_READY_S) -> None:
        host, port = self.spec["address"].rsplit(":", 1)
        deadline = time.monotonic() + timeout
        while True:
            assert self.proc is not None
            if self.proc.poll() is not None:
                raise RuntimeError(f"{self.spec['name']}: exited with {self.proc.returncode} (see {self.spec['log']})")
            try:
                with socket.create_connection((host, int(port)), timeout=1.0):
                    return
            except OSError:
                if time.monotonic() > deadline:
                    raise RuntimeError(f"{self.spec['name']}: not accepting on {self.spec['address']}") from None
            await asyncio.sleep(0.05)

    async def check(self) -> None:
        """Start it again if it died (at most MAX_SERVER_RESTARTS times)."""
        if self.proc is None or self.proc.poll() is None or self.restarts >= MAX_SERVER_RESTARTS:
            return
        self.last_exit = self.proc.returncode
        self.restarts += 1
        self.start()
        with contextlib.suppress(RuntimeError):
            await self.wait_ready()

    def stop(self) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        self.proc.terminate()
        try:
            self.proc.wait(5.0)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()

    def counters(self) -> dict[str, Any]:
        alive = self.proc is not None and self.proc.poll() is None
        return {
            "address": self.spec["address"], "pid": self.proc.pid if self.proc else None, "alive": alive,
            "restarts": self.restarts, "last_exit": self.last_exit,
        }  # fmt: skip


class Links:
    """Every forwarder of a plan, in this event loop."""

    def __init__(self, plan: dict[str, Any]) -> None:
        self.plan = plan
        self.paths = {name: path_spec(link) for name, link in plan["links"].items()}
        self.emulators: dict[str, tuple[WanEmulator, dict[str, Any]]] = {}
        self.shared: dict[str, tuple[TokenBucket, RateWindow]] = {}
        self.servers = [Server(spec) for spec in plan.get("servers", [])]

    def _shared(self, name: str, emu: WanEmulator) -> tuple[TokenBucket, RateWindow]:
        if name not in self.shared:
            p = self.paths[name]
            assert p.link_rate is not None
            now = asyncio.get_running_loop().time()
            bucket = TokenBucket(p.link_rate, emu.qmin, p.slack_s, now)
            self.shared[name] = (bucket, RateWindow(p.link_rate, p.window_s))
        return self.shared[name]

    async def start(self) -> None:
        for srv in self.servers:
            srv.start()
        for srv in self.servers:
            await srv.wait_ready()
        for f in self.plan["forwarders"]:
            up, down = self.paths[f["up"]], self.paths[f["down"]]
            spec = LinkSpec(**{**up.__dict__, "down": down, "seed": len(self.emulators)})
            emu = WanEmulator(f["target"], spec, f["listen"])
            await emu.start()
            # The same quantum for every forwarder of a pair (its buckets are shared): the slowest link's.
            emu.dir_links = {"up": self._shared(f["up"], emu), "down": self._shared(f["down"], emu)}
            self.emulators[f["name"]] = (emu, f)

    def counters(self) -> dict[str, Any]:
        per_link: dict[str, int] = dict.fromkeys(self.plan["links"], 0)
        forwarders = {}
        for name, (emu, f) in self.emulators.items():
            up, down = emu.bytes_up, emu.bytes_down
            per_link[f["up"]] += up
            per_link[f["down"]] += down
            forwarders[name] = {
                "listen": f["listen"], "target": f["target"], "up_link": f["up"], "down_link": f["down"],
                "bytes_up": up, "bytes_down": down, "connections": len(emu.conns),
                "stalls": sum(c.stalls for c in emu.conns),
            }  # fmt: skip
        out = {"at": time.time(), "links": {k: {"bytes": v} for k, v in per_link.items()}, "forwarders": forwarders}
        if self.servers:
            out["servers"] = {s.spec["name"]: s.counters() for s in self.servers}
        return out

    def write_counters(self) -> None:
        path = Path(self.plan["counters_file"])
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(self.counters(), indent=1, sort_keys=True))
        tmp.replace(path)

    async def stop(self) -> None:
        for emu, _ in self.emulators.values():
            await emu.stop()
        for srv in self.servers:
            srv.stop()


async def serve(plan: dict[str, Any]) -> None:
    links = Links(plan)
    try:
        await links.start()
    except BaseException:
        await links.stop()
        raise
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    links.write_counters()
    ready = {"service": "links", "address": "", "forwarders": len(links.emulators)}
    Path(plan["ready_file"]).write_text(json.dumps(ready))
    while not stop.is_set():
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(stop.wait(), 1.0)
        for srv in links.servers:
            await srv.check()
        links.write_counters()
    await links.stop()
    links.write_counters()


def main(argv: list[str] | None = None) -> None:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        raise SystemExit("usage: python -m rollart.netem.links PLAN.json")
    plan = json.loads(Path(args[0]).read_text())
    asyncio.run(serve(plan))


if __name__ == "__main__":
    main()
