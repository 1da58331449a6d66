"""Regions of a local cluster (``cluster.regions`` of a job file): each service instance in a named region, and
every connection between two regions through an emulated link (docs/regions.md).

Region i (1-based, in the order the job file places them) binds its services on 127.0.i.1 and its forwarders
on 127.0.i.2. A forwarder (one :class:`rollart.netem.wan.WanEmulator` per caller region and callee endpoint, all
in one ``python -m rollart.netem.links`` process) listens in the caller's region and forwards to the callee's
real address through that ordered pair's link. Ports are chosen before anything starts, so every address a
service is handed is known up front: the launcher rewrites each instance's environment, replacing a peer's
address in another region with the forwarder of the instance's own region, then checks that no address of
another region is left (:func:`RegionPlan.audit`).

The trainer's checkpoint folder (``ROLLART_WEIGHT_SOURCE__CHECKPOINT_STORE`` when it is a local folder) is served
read-only by a static file server in the trainer's region (busybox httpd, else python's http.server), started and
restarted by the links process; instances of other regions get ``ROLLART_CHECKPOINT_ROUTES`` mapping that folder
to the server through their region's forwarder, so full checkpoints (``weight_sync: full_checkpoint``, catch-up
and joiners) cross the link as HTTP GETs instead of being read from the shared file system.
"""

from __future__ import annotations

import json
import math
import os
import re
import shutil
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .processes import ManagedProcess, ProcessError, free_port, pid_alive

REGION_NAME = re.compile(r"^[A-Za-z][A-Za-z0-9_-]{0,31}$")
MAX_REGIONS = 250  # 127.0.1.x .. 127.0.250.x
LINK_KEYS = {"rate_mbps", "rtt_ms", "jitter_ms", "loss", "flow_mbps"}
HOST = re.compile(r"127\.0\.(\d{1,3})\.(\d{1,3}):(\d{1,5})")
# Services with a second, striped-transport listener (ROLLART_DATA_LISTEN) that peers dial.
DATA_SERVICES = ("relay", "trainer")
# Environment keys whose addresses are not peer routes (docs/regions.md): a service's own Redis store, and its
# Prometheus endpoint (the operator's scraper and `rollart run` read it, outside the regions).
PRIVATE_KEYS = ("ROLLART_REDIS_URL", "ROLLART_METRICS_LISTEN")
CHECKPOINTS = "checkpoints"  # the static file server over the trainer's checkpoint folder
STORE_ENV = "ROLLART_WEIGHT_SOURCE__CHECKPOINT_STORE"


def file_server_argv(directory: str, listen: str, kind: str = "auto") -> list[str]:
    """A read-only static file server over ``directory`` on ``listen``. busybox httpd when installed (C, one
    forked process per connection, no Python interpreter competing for the job's cores; ``-c /dev/null``: no
    system httpd.conf applies), else python's http.server (threaded). ``kind``: auto, busybox or python."""
    host, port = listen.rsplit(":", 1)
    if kind not in ("auto", "busybox", "python"):
        raise ValueError(f"file server kind {kind!r}: auto, busybox or python")
    busybox = shutil.which("busybox") if kind != "python" else None
    if busybox:
        return [busybox, "httpd", "-f", "-p", listen, "-h", directory, "-c", "/dev/null"]
    if kind == "busybox":
        raise ProcessError("busybox is not installed (the checkpoint file server)")
    return [sys.executable, "-m", "http.server", "--bind", host, "--directory", directory, port]


class RegionError(ValueError):
    """A bad ``cluster.regions``; the message names the field."""


@dataclass(frozen=True)
class Link:
    """One direction of the link between two regions."""

    rate_mbps: float
    rtt_ms: float = 0.0
    jitter_ms: float = 0.0
    loss: float = 0.0
    flow_mbps: float | None = None  # each connection's own cap (one TCP flow's window / RTT); None: no cap

    def to_dict(self) -> dict[str, float]:
        out = {"rate_mbps": self.rate_mbps, "rtt_ms": self.rtt_ms, "jitter_ms": self.jitter_ms, "loss": self.loss}
        if self.flow_mbps is not None:
            out["flow_mbps"] = self.flow_mbps
        return out


@dataclass
class Regions:
    place: dict[str, list[str]]  # region -> service or instance names, as the job file writes them
    links: dict[tuple[str, str], Link] = field(default_factory=dict)
    compression: str = "gzip"  # every instance's gRPC requests (ROLLART_GRPC_COMPRESSION): gzip, deflate or none

    @property
    def names(self) -> list[str]:
        return list(self.place)

    def index(self, region: str) -> int:
        return self.names.index(region) + 1

    def host(self, region: str) -> str:
        return f"127.0.{self.index(region)}.1"

    def forwarder_host(self, region: str) -> str:
        return f"127.0.{self.index(region)}.2"

    def region_of(self, instance: str) -> str | None:
        """The region of an instance: its own name placed, else its service's (``actor`` places every actor)."""
        base = re.sub(r"-\d+$", "", instance)
        for wanted in (instance, base):
            for region, names in self.place.items():
                if wanted in names:
                    return region
        return None


def _number(raw: Any, where: str, *, low: float, high: float = math.inf, low_open: bool = False) -> float:
    if isinstance(raw, bool) or not isinstance(raw, int | float):
        raise RegionError(f"{where}: expected a number, got {raw!r}")
    value = float(raw)
    if not math.isfinite(value) or value < low or (low_open and value == low) or value > high:
        bound = f"> {low:g}" if low_open else f">= {low:g}"
        upper = "" if high == math.inf else f" and <= {high:g}"
        raise RegionError(f"{where}: expected a number {bound}{upper}, got {raw!r}")
    return value


def parse_link(raw: Any, where: str) -> Link:
    if not isinstance(raw, Mapping):
        raise RegionError(f"{where}: expected a mapping with rate_mbps, rtt_ms, jitter_ms, loss, flow_mbps")
    unknown = set(raw) - LINK_KEYS
    if unknown:
        raise RegionError(f"{where}.{sorted(unknown)[0]}: unknown key (known: {', '.join(sorted(LINK_KEYS))})")
    if "rate_mbps" not in raw:
        raise RegionError(f"{where}.rate_mbps: required")
    rtt = _number(raw.get("rtt_ms", 0.0), f"{where}.rtt_ms", low=0.0, high=60_000.0)
    jitter = _number(raw.get("jitter_ms", 0.0), f"{where}.jitter_ms", low=0.0, high=60_000.0)
    if jitter > rtt / 2:
        raise RegionError(
            f"{where}.jitter_ms: at most half the rtt_ms ({rtt / 2:g}): a one-way delay cannot be negative"
        )
    rate = _number(raw["rate_mbps"], f"{where}.rate_mbps", low=0.0, high=1e6, low_open=True)
    flow = raw.get("flow_mbps")
    return Link(
        rate_mbps=rate,
        rtt_ms=rtt,
        jitter_ms=jitter,
        loss=_number(raw.get("loss", 0.0), f"{where}.loss", low=0.0, high=0.5),
        flow_mbps=None if flow is None else _number(flow, f"{where}.flow_mbps", low=0.0, high=rate, low_open=True),
    )


def parse_regions(cluster: Mapping[str, Any], services: Sequence[str], actors: int = 2) -> Regions | None:
    """``cluster.regions`` checked (None when absent: one loopback region, today's cluster). ``services``: the
    cluster's service names; ``actors``: how many actor instances the job starts (``actor``, ``actor-2``, ...)."""
    raw = cluster.get("regions")
    if raw is None:
        return None
    where = "cluster.regions"
    if not isinstance(raw, Mapping):
        raise RegionError(f"{where}: expected a mapping with place and links")
    unknown = set(raw) - {"place", "links", "compression"}
    if unknown:
        raise RegionError(f"{where}.{sorted(unknown)[0]}: unknown key (known: compression, links, place)")
    compression = raw.get("compression", "gzip")
    if compression not in ("gzip", "deflate", "none"):
        raise RegionError(f"{where}.compression: {compression!r} (expected gzip, deflate or none)")
    place_raw = raw.get("place")
    if not isinstance(place_raw, Mapping) or not place_raw:
        raise RegionError(f"{where}.place: expected a mapping of region name -> list of services")
    if len(place_raw) > MAX_REGIONS:
        raise RegionError(f"{where}.place: at most {MAX_REGIONS} regions")
    place: dict[str, list[str]] = {}
    seen: dict[str, str] = {}
    for region, names in place_raw.items():
        if not isinstance(region, str) or not REGION_NAME.match(region):
            raise RegionError(f"{where}.place: bad region name {region!r} (a letter, then letters, digits, _ or -)")
        rw = f"{where}.place.{region}"
        if not isinstance(names, list) or not all(isinstance(n, str) for n in names):
            raise RegionError(f"{rw}: expected a list of service names")
        for name in names:
            base, _, num = name.rpartition("-") if re.search(r"-\d+$", name) else (name, "", "")
            if base not in services:
                raise RegionError(f"{rw}: unknown service {name!r} (known: {', '.join(services)})")
            if base == "actor" and num and int(num) > actors:
                raise RegionError(f"{rw}: {name!r} but the job starts {actors} actor(s)")
            if name in seen:
                raise RegionError(f"{rw}: {name!r} is already in region {seen[name]!r}")
            seen[name] = region
        place[region] = list(names)
    regions = Regions(place, compression=compression)
    actor_names = ["actor"] + [f"actor-{i}" for i in range(2, actors + 1)]
    for svc in services:
        wanted = actor_names if svc == "actor" else [svc]
        missing = [n for n in wanted if regions.region_of(n) is None]
        if missing:
            raise RegionError(f"{where}.place: {', '.join(missing)} in no region (every service needs one)")
    links_raw = raw.get("links") or {}
    if not isinstance(links_raw, Mapping):
        raise RegionError(f"{where}.links: expected a mapping of 'from->to' -> link")
    for key, link in links_raw.items():
        lw = f"{where}.links.{key}"
        src, sep, dst = str(key).partition("->")
        src, dst = src.strip(), dst.strip()
        if not sep:
            raise RegionError(f"{lw}: expected 'from->to' (an ordered pair of regions)")
        for r in (src, dst):
            if r not in place:
                raise RegionError(f"{lw}: region {r!r} is not defined in {where}.place")
        if src == dst:
            raise RegionError(f"{lw}: within a region is loopback, not a link")
        if (src, dst) in regions.links:
            raise RegionError(f"{lw}: a second link {src}->{dst}")
        regions.links[(src, dst)] = parse_link(link, lw)
    for a in place:
        for b in place:
            if a != b and (a, b) not in regions.links:
                raise RegionError(f"{where}.links: no link {a}->{b} (each direction of each pair needs one)")
    return regions


class RegionPlan:
    """Addresses and forwarders of one cluster start: every instance's listen address, and per caller region
    the forwarder to each endpoint of another region."""

    def __init__(
        self, regions: Regions, instances: Sequence[str], state_dir: Path, checkpoint_store: str | None = None
    ) -> None:
        """``checkpoint_store``: the trainer's checkpoint store (default ``$ROLLART_WEIGHT_SOURCE__CHECKPOINT_STORE``);
        a local folder is served to the other regions over HTTP (see the module's docstring)."""
        self.regions = regions
        self.state_dir = state_dir
        missing = [n for n in instances if regions.region_of(n) is None]
        if missing:
            raise ProcessError(f"cluster.regions.place: {', '.join(missing)} in no region (every service needs one)")
        self.region = {n: regions.region_of(n) or "" for n in instances}
        # instance -> endpoint kind ("address", "data") -> real address
        self.endpoints: dict[str, dict[str, str]] = {}
        for name in instances:
            host = regions.host(self.region[name])
            eps = {"address": f"{host}:{free_port(host)}"}
            if re.sub(r"-\d+$", "", name) in DATA_SERVICES:
                eps["data"] = f"{host}:{free_port(host)}"
            self.endpoints[name] = eps
        # (caller region, real address) -> forwarder address in the caller's region
        self.routes: dict[tuple[str, str], str] = {}
        self.forwarders: list[dict[str, str]] = []
        for name, eps in self.endpoints.items():
            callee = self.region[name]
            for kind, real in eps.items():
                for caller in regions.names:
                    if caller == callee:
                        continue
                    fhost = regions.forwarder_host(caller)
                    listen = f"{fhost}:{free_port(fhost)}"
                    self.routes[(caller, real)] = listen
                    suffix = "" if kind == "address" else f"/{kind}"
                    self.forwarders.append(
                        {"name": f"{caller}>{name}{suffix}", "listen": listen, "target": real,
                         "up": f"{caller}->{callee}", "down": f"{callee}->{caller}"}
                    )  # fmt: skip
        self.server: dict[str, str] | None = None
        store = os.environ.get(STORE_ENV, "") if checkpoint_store is None else checkpoint_store
        if store.startswith("file://"):
            store = store[len("file://") :]
        if store and "://" not in store and "trainer" in self.region:
            self.server = self._plan_server(os.path.abspath(store), self.region["trainer"])

    def _plan_server(self, directory: str, region: str) -> dict[str, str]:
        host = self.regions.host(region)
        address = f"{host}:{free_port(host)}"
        for caller in self.regions.names:
            if caller == region:
                continue
            fhost = self.regions.forwarder_host(caller)
            listen = f"{fhost}:{free_port(fhost)}"
            self.routes[(caller, address)] = listen
            self.forwarders.append(
                {"name": f"{caller}>{CHECKPOINTS}", "listen": listen, "target": address,
                 "up": f"{caller}->{region}", "down": f"{region}->{caller}"}
            )  # fmt: skip
        return {"name": CHECKPOINTS, "dir": directory, "address": address, "region": region}

    def route(self, caller: str, address: str) -> str:
        """What ``caller`` (an instance, or a region name) dials to reach ``address``."""
        region = self.region.get(caller, caller)
        return self.routes.get((region, address), address)

    def listen_env(self, name: str) -> dict[str, str]:
        """The instance's own listeners, on its region's address."""
        eps = self.endpoints[name]
        host = self.regions.host(self.region[name])
        env = {"ROLLART_LISTEN": eps["address"], "ROLLART_GRPC_COMPRESSION": self.regions.compression}
        if "data" in eps:
            env["ROLLART_DATA_LISTEN"] = eps["data"]
        if name == "llmproxy" or name.startswith("llmproxy-"):
            env["ROLLART_HTTP_LISTEN"] = f"{host}:0"
        server = self.server
        if server is not None and self.region[name] != server["region"]:
            # Its checkpoint store (the trainer's folder) read over HTTP through this region's link; a download
            # cache of its own, so each instance's bytes cross the link (none reuses another's file).
            url = f"http://{self.routes[(self.region[name], server['address'])]}/"
            env["ROLLART_CHECKPOINT_ROUTES"] = json.dumps({server["dir"]: url})
            env["ROLLART_CHECKPOINT_CACHE"] = str(self.state_dir / "checkpoint-cache" / name)
        if name == "trainer":
            # Actors that fall back to the trainer dial its advertised data endpoint: their region's forwarder,
            # when they are all in one other region.
            actor_regions = {r for n, r in self.region.items() if n.startswith("actor")} - {self.region[name]}
            if len(actor_regions) == 1:
                env["ROLLART_DATA_ADVERTISE"] = self.routes[(actor_regions.pop(), eps["data"])]
            # Each relay's data endpoint as the trainer must dial it (rewrite() turns both sides into the trainer
            # region's forwarders): the trainer's relay_data_endpoints setting.
            relays = {e["address"]: e["data"] for n, e in self.endpoints.items() if n.startswith("relay")}
            if relays:
                env["ROLLART_RELAY_DATA_ENDPOINTS"] = json.dumps(relays)
        return env

    def rewrite(self, name: str, env: dict[str, str]) -> dict[str, str]:
        """``env`` with every other region's address replaced by this instance's region's forwarder to it."""
        region = self.region[name]

        def sub(m: re.Match[str]) -> str:
            return self.routes.get((region, m.group(0)), m.group(0))

        return {k: HOST.sub(sub, v) if k.startswith("ROLLART_") else v for k, v in env.items()}

    def audit(self, name: str, env: Mapping[str, str]) -> list[str]:
        """Addresses in ``env`` that leave this instance's region other than through its forwarders (empty: none).
        127.0.0.x is the un-regioned loopback: only a service's private store (``PRIVATE_KEYS``) may use it."""
        own = self.regions.index(self.region[name])
        bad = []
        for key, value in env.items():
            if not key.startswith("ROLLART_") or key in PRIVATE_KEYS:
                continue
            if key == "ROLLART_DATA_ADVERTISE":  # what others dial: a forwarder to this instance's data endpoint
                data = self.endpoints[name].get("data")
                if not any(v == value and real == data for (_, real), v in self.routes.items()):
                    bad.append(f"{key}={value}")
                continue
            bad += [f"{key}={m.group(0)}" for m in HOST.finditer(value) if int(m.group(1)) != own]
            if "localhost:" in value:
                bad.append(f"{key}={value}")
        return bad

    def to_state(self) -> dict[str, Any]:
        return {
            "regions": {r: {"host": self.regions.host(r), "forwarder_host": self.regions.forwarder_host(r)}
                        for r in self.regions.names},
            "placement": self.region,
            "endpoints": self.endpoints,
            "links": {f"{a}->{b}": link.to_dict() for (a, b), link in self.regions.links.items()},
            "forwarders": self.forwarders,
            "servers": [self.server] if self.server else [],
        }  # fmt: skip

    def start_links(self, log: Callable[[str], None] = print, server_kind: str = "auto") -> ManagedProcess:
        """The forwarders' process, listening before any service starts (they dial their target per connection),
        with the checkpoint file server as its supervised child."""
        run_dir = self.state_dir / "run"
        run_dir.mkdir(parents=True, exist_ok=True)
        servers = []
        if self.server is not None:
            Path(self.server["dir"]).mkdir(parents=True, exist_ok=True)
            argv = file_server_argv(self.server["dir"], self.server["address"], server_kind)
            log_path = self.state_dir / "logs" / f"{CHECKPOINTS}.log"
            servers.append({**self.server, "argv": argv, "log": str(log_path)})
        plan = {
            "links": {f"{a}->{b}": link.to_dict() for (a, b), link in self.regions.links.items()},
            "forwarders": self.forwarders,
            "servers": servers,
            "ready_file": str(run_dir / "links.ready"),
            "counters_file": str(self.state_dir / "links.json"),
        }
        plan_file = self.state_dir / "links-plan.json"
        plan_file.write_text(json.dumps(plan, indent=1))
        proc = ManagedProcess(
            "links",
            [sys.executable, "-m", "rollart.netem.links", str(plan_file)],
            log_path=self.state_dir / "logs" / "links.log",
            ready_file=run_dir / "links.ready",
        ).start()
        proc.wait_ready(30.0)
        log(
            f"{'links':<16} {len(self.forwarders)} forwarders over {len(self.regions.links)} link directions "
            f"(pid {proc.pid})"
        )
        for srv in servers:
            log(f"{srv['name']:<16} http://{srv['address']}/ over {srv['dir']} ({Path(srv['argv'][0]).name})")
        return proc


def link_counters(state_dir: Path) -> dict[str, Any] | None:
    """Bytes through each link direction and forwarder, as the links process last wrote them (None: no regions)."""
    path = Path(state_dir) / "links.json"
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def route_from_state(state: Mapping[str, Any], caller: str, address: str) -> str:
    """What ``caller`` dials to reach ``address`` in a running cluster's state (``address`` itself without
    regions, or within the caller's region)."""
    plan = state.get("regions")
    if not plan or not address:
        return address
    region = plan["placement"].get(caller, caller)
    for f in plan["forwarders"]:
        if f["target"] == address and f["up"].split("->")[0] == region:
            return f["listen"]
    return address


def restart_links(state_dir: Path, ready_timeout: float = 30.0) -> dict[str, Any]:
    """The links process again from its plan (``links-plan.json``: the same forwarder and server addresses), for a
    supervisor; returns its new state entry (``state["links"]``)."""
    from . import cluster as local  # cluster imports this module

    state = local.read_state(state_dir)
    info = state.get("links")
    if not info:
        raise ProcessError(f"no links process in {state_dir}")
    if pid_alive(info["pid"]):
        raise ProcessError(f"links is running (pid {info['pid']})")
    plan_file = Path(state_dir) / "links-plan.json"
    plan = json.loads(plan_file.read_text())
    Path(plan["ready_file"]).parent.mkdir(parents=True, exist_ok=True)
    proc = ManagedProcess(
        "links",
        [sys.executable, "-m", "rollart.netem.links", str(plan_file)],
        log_path=Path(info["log"]),
        ready_file=Path(plan["ready_file"]),
    ).start()
    proc.wait_ready(ready_timeout)
    info = dict(info, pid=proc.pid, restarts=int(info.get("restarts", 0)) + 1)
    state = local.read_state(state_dir)
    state["links"] = info
    local.write_state(state_dir, state)
    return info
