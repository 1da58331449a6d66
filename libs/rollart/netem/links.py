"""The links between a job's regions as one process: a TCP forwarder per (caller region, callee endpoint), each a
:class:`WanEmulator`, and every forwarder crossing the same ordered pair of regions sharing that direction's link
(one token bucket and window per direction of a pair, so a weight push and the lease traffic compete for it).

``python -m rollart.netem.links PLAN.json`` reads the plan ``rollart.local.regions`` writes::

    {"links": {"train->infer": {"rate_mbps": 40, "rtt_ms": 40, "jitter_ms": 2, "loss": 0.0, "flow_mbps": 10}, ...},
     "forwarders": [{"name": "infer>ledger", "listen": "127.0.2.2:41001", "target": "127.0.1.1:40001",
                     "up": "infer->train", "down": "train->infer"}, ...],
     "servers": [{"name": "checkpoints", "argv": ["busybox", "httpd", "-f", ...], "address": "127.0.1.1:40100",
                  "log": ".../checkpoints.log"}],
     "ready_file": ".../links.ready", "counters_file": ".../links.json"}

``up`` is the caller's direction (client -> target). ``servers`` are processes of a region that its links carry
(the trainer region's checkpoint file server): started as children, ready once they accept a connection,
restarted when they die (each restart counted), stopped with this process. It writes the ready file once every
forwarder listens and every server accepts, and the counters (bytes per forwarder and per link direction,
connections, servers' pids and restarts, link faults applied) every second and when stopped.

**Link faults at run time.** Each second it reads, then deletes, the JSON files in its control folder
(``control_dir``, default ``links-control`` beside the counters file; write one with :func:`request`), each a
list of actions on a link direction (``link``: ``"train->infer"``, or ``"*"``, the default, for every one)::

    [{"link": "*", "down_s": 30}, {"link": "train->infer", "rate_factor": 0.1, "for_s": 60}]

``down_s``: nothing crosses for that long (connections stay open, bytes wait and TCP back-pressure reaches the
senders, as on a path whose packets are all lost; new connections are accepted but carry nothing).
``rate_mbps`` or ``rate_factor`` (of the plan's rate) for ``for_s`` seconds (absent: until the next change).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
import os
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
MIN_QUANTUM = 1024  # the smallest release of a WanEmulator (its quantum's floor)


def path_spec(link: dict[str, Any]) -> LinkSpec:
    """One direction of a link as a LinkSpec: the rate is the link's (shared by its connections); ``flow_mbps``
    (optional) each connection's own cap below it, one TCP flow's window/RTT bound, so S connections can get S
    times one; a loss probability per segment becomes a stall of one RTO per 64 KiB chunk with the same odds of
    a loss in it."""
    rtt = float(link.get("rtt_ms", 0.0)) / 1000
    loss = float(link.get("loss", 0.0))
    chunk = LinkSpec.chunk
    stall_prob = 1 - (1 - loss) ** (chunk / MSS) if loss > 0 else 0.0
    flow = float(link.get("flow_mbps") or 0) * 1e6 / 8
    rate = float(link["rate_mbps"]) * 1e6 / 8
    return LinkSpec(
        rate=flow or None,
        link_rate=rate,
        # A release is at least MIN_QUANTUM bytes: a window must hold two, or a slow flow never releases.
        window_s=max(LinkSpec.window_s, 2 * MIN_QUANTUM / min(flow or rate, rate)),
        rtt=rtt,
        jitter=float(link.get("jitter_ms", 0.0)) / 1000,
        stall_prob=stall_prob,
        stall_s=max(MIN_RTO_S, rtt),
    )


class LinkBucket(TokenBucket):
    """A link direction's shared bucket that the control can take down (nothing released before ``down_until``)
    and re-rate. Its window keeps its byte cap and stretches instead, so a whole quantum still fits one window
    at a tenth of the rate (a shorter cap would never admit a quantum) and no window releases above the rate."""

    def __init__(self, rate: float, burst: float, slack: float, now: float, window: RateWindow) -> None:
        super().__init__(rate, burst, slack, now)
        self.slack = slack
        self.window_ = window
        self.base_rate = rate
        self.down_until = -math.inf

    def available(self, now: float) -> float:
        return 0.0 if now < self.down_until else super().available(now)

    def ready_at(self, n: float, now: float) -> float:
        return super().ready_at(n, max(now, self.down_until))

    def set_rate(self, rate: float, now: float) -> None:
        self._refill(now)  # what elapsed so far accrued at the old rate
        self.rate = rate
        self.cap = self.burst + rate * self.slack
        self.tokens = min(self.tokens, self.cap)
        self.window_.window = self.window_.cap / rate


CONTROL_KEYS = {"link", "down_s", "rate_mbps", "rate_factor", "for_s"}
MAX_FAULT_S = 24 * 3600.0


def check_action(action: Any, links: Any) -> dict[str, Any]:
    """One control action, checked (ValueError naming what is wrong); ``link`` defaults to "*" (every one)."""
    if not isinstance(action, dict):
        raise ValueError(f"an action is an object, not {action!r}")
    unknown = set(action) - CONTROL_KEYS
    if unknown:
        raise ValueError(f"unknown key(s) {sorted(unknown)} (known: {sorted(CONTROL_KEYS)})")
    out: dict[str, Any] = {"link": str(action.get("link", "*"))}
    if out["link"] != "*" and out["link"] not in links:
        raise ValueError(f"no link {out['link']!r} (links: {', '.join(sorted(links))}, or *)")
    what = [k for k in ("down_s", "rate_mbps", "rate_factor") if k in action]
    if len(what) != 1:
        raise ValueError("an action has exactly one of down_s, rate_mbps, rate_factor")
    for k in (*what, *(["for_s"] if "for_s" in action else [])):
        try:
            v = float(action[k])
        except (TypeError, ValueError):
            raise ValueError(f"{k}: {action[k]!r} is not a number") from None
        if not (0 < v <= (MAX_FAULT_S if k in ("down_s", "for_s") else 1e6)):
            raise ValueError(f"{k}: {v} is out of range")
        out[k] = v
    if "down_s" in out and "for_s" in out:
        raise ValueError("down_s is its own duration (no for_s)")
    return out


def control_dir(plan: dict[str, Any]) -> Path:
    return Path(plan.get("control_dir") or Path(plan["counters_file"]).with_name("links-control"))


def request(folder: Path | str, actions: list[dict[str, Any]]) -> Path:
    """Hands ``actions`` to a running links process (its control folder): one file, written whole then renamed,
    so the process never reads half of it and two requests never overwrite each other."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    name = f"{time.time_ns()}-{os.getpid()}"
    tmp = folder / f".{name}.tmp"
    tmp.write_text(json.dumps(actions))
    path = folder / f"{name}.json"
    tmp.replace(path)
    return path


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
        self.shared: dict[str, tuple[LinkBucket, RateWindow]] = {}
        self.servers = [Server(spec) for spec in plan.get("servers", [])]
        self.faults: list[dict[str, Any]] = []  # control actions applied (and refused), in order
        self._rate_change: dict[str, int] = {}  # per link: the latest rate change (an older one's end is moot)

    def _shared(self, name: str, emu: WanEmulator) -> tuple[LinkBucket, RateWindow]:
        if name not in self.shared:
            p = self.paths[name]
            assert p.link_rate is not None
            now = asyncio.get_running_loop().time()
            window = RateWindow(p.link_rate, p.window_s)
            self.shared[name] = (LinkBucket(p.link_rate, emu.qmin, p.slack_s, now, window), window)
        return self.shared[name]

    def apply(self, action: dict[str, Any]) -> dict[str, Any]:
        """One checked action (:func:`check_action`) now; returns its record (also kept in ``faults``)."""
        loop = asyncio.get_running_loop()
        now = loop.time()
        names = list(self.shared) if action["link"] == "*" else [action["link"]]
        rec = {"at": time.time(), **action, "links": names}
        for name in names:
            bucket = self.shared[name][0] if name in self.shared else None
            if bucket is None:
                continue  # no forwarder crosses it
            if "down_s" in action:
                bucket.down_until = max(bucket.down_until, now + action["down_s"])
                continue
            rate = action["rate_mbps"] * 1e6 / 8 if "rate_mbps" in action else bucket.base_rate * action["rate_factor"]
            bucket.set_rate(rate, now)
            seq = self._rate_change[name] = self._rate_change.get(name, 0) + 1
            if "for_s" in action:
                loop.call_later(action["for_s"], self._restore, name, seq)
        self.faults.append(rec)
        self._wake()
        return rec

    def _restore(self, name: str, seq: int) -> None:
        if self._rate_change.get(name) != seq:
            return  # changed again since: that change rules
        bucket = self.shared[name][0]
        bucket.set_rate(bucket.base_rate, asyncio.get_running_loop().time())  # its window's length too
        self.faults.append({"at": time.time(), "link": name, "restored_mbps": bucket.base_rate * 8 / 1e6})
        self._wake()

    def _wake(self) -> None:
        """Every emulator's pacer recomputes its next release under the new limits now."""
        for emu, _ in self.emulators.values():
            if emu._pacer.active:
                emu._pacer._schedule(emu._loop.time())

    def poll_control(self) -> None:
        """Applies the files in the control folder (oldest first) and deletes them; a bad file is refused whole
        (recorded in ``faults`` with its error)."""
        folder = control_dir(self.plan)
        if not folder.is_dir():
            return
        for path in sorted(folder.glob("*.json")):
            try:
                doc = json.loads(path.read_text())
                actions = [check_action(a, self.plan["links"]) for a in (doc if isinstance(doc, list) else [doc])]
            except (OSError, ValueError) as exc:
                self.faults.append({"at": time.time(), "file": path.name, "refused": str(exc)})
                print(f"links: control file {path.name} refused: {exc}", file=sys.stderr, flush=True)
            else:
                for a in actions:
                    self.apply(a)
            path.unlink(missing_ok=True)

    async def start(self) -> None:
        for srv in self.servers:
            srv.start()
        for srv in self.servers:
            await srv.wait_ready()
        for f in self.plan["forwarders"]:
            up, down = self.paths[f["up"]], self.paths[f["down"]]
            window_s = max(up.window_s, down.window_s)  # one window per emulator: the longer fits both
            spec = LinkSpec(**{**up.__dict__, "down": down, "seed": len(self.emulators), "window_s": window_s})
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
        if self.faults:
            out["faults"] = self.faults
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
        links.poll_control()
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
