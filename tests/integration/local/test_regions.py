"""A local cluster in two regions: every service binds its region's address, the launcher hands out only
forwarder routes across regions (checked in what it wrote), and every service answers through each forwarder
from the other region with the link's delay, its bytes counted per direction."""

from __future__ import annotations

import json
import os
import re
import socket
import time
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from rollart.local import cluster as local
from rollart.local.regions import Link, Regions

pytestmark = pytest.mark.timeout(240)

RTT_MS = 60.0
REGIONS = Regions(
    {"train": ["resource-manager", "ledger"], "infer": ["relay", "reward", "envmanager"]},
    {
        ("train", "infer"): Link(rate_mbps=80, rtt_ms=RTT_MS, jitter_ms=2),
        ("infer", "train"): Link(rate_mbps=40, rtt_ms=RTT_MS, jitter_ms=2),
    },
)
ADDR = re.compile(r"127\.0\.(\d+)\.(\d+):(\d+)")


@pytest.fixture
def cluster(tmp_path: Path, monkeypatch):
    for k in [k for k in os.environ if k.startswith("ROLLART_")]:
        monkeypatch.delenv(k)
    state_dir = tmp_path / "state"
    state = local.up(
        state_dir,
        only=["resource-manager", "ledger", "relay", "reward", "envmanager"],
        log=lambda _m: None,
        regions=REGIONS,
    )
    yield state_dir, state
    local.down(state_dir, log=lambda _m: None)
    assert not (state_dir / "state.json").exists()


def _health(address: str) -> float:
    with grpc.insecure_channel(address) as ch:
        grpc.channel_ready_future(ch).result(timeout=20)
        t0 = time.monotonic()
        resp = health_pb2_grpc.HealthStub(ch).Check(health_pb2.HealthCheckRequest(), timeout=20)
        assert resp.status == health_pb2.HealthCheckResponse.SERVING
        return time.monotonic() - t0


def test_services_bind_their_region_and_only_forwarders_cross(cluster):
    state_dir, state = cluster
    plan = state["regions"]
    assert "mooncake" not in state  # its transfer engine's ports would cross regions outside the links
    forwarders = {f["listen"]: f for f in plan["forwarders"]}
    region_index = {r: int(v["host"].split(".")[2]) for r, v in plan["regions"].items()}
    assert region_index == {"train": 1, "infer": 2}
    for name, info in state["services"].items():
        own = region_index[plan["placement"][name]]
        assert info["address"].startswith(f"127.0.{own}.1:"), (name, info["address"])
        if name == "relay":
            assert info["data_endpoint"].startswith(f"127.0.{own}.1:")
    # What the launcher wrote (state.json's environment of every service, as `rollart status` and restarts
    # read it): every address of another region is a forwarder of the service's own region to that address.
    written = json.loads((state_dir / "state.json").read_text())
    crossings = 0
    for name, info in written["services"].items():
        own = region_index[plan["placement"][name]]
        for key, value in info["env"].items():
            if key in ("ROLLART_REDIS_URL", "ROLLART_METRICS_LISTEN"):
                continue  # the service's own store; its Prometheus endpoint, for the operator (docs/regions.md)
            for m in ADDR.finditer(value):
                third, fourth = int(m.group(1)), int(m.group(2))
                assert third == own, f"{name} {key}={m.group(0)}: an address outside its region"
                if fourth == 2:  # a forwarder: of this region, to a service of the other region
                    f = forwarders[m.group(0)]
                    target_region = int(f["target"].split(".")[2])
                    assert target_region != own and f["up"].split("->")[0] == plan["placement"][name]
                    crossings += 1
    env = written["services"]["envmanager"]["env"]
    ledger = state["services"]["ledger"]["address"]
    assert forwarders[env["ROLLART_LEDGER"]]["target"] == ledger and env["ROLLART_LEDGER"].startswith("127.0.2.2:")
    assert forwarders[env["ROLLART_RESOURCE_MANAGER"]]["target"] == state["services"]["resource-manager"]["address"]
    assert env["ROLLART_REWARD"] == state["services"]["reward"]["address"]  # same region: loopback
    assert crossings >= 4  # envmanager, relay, reward -> resource manager; envmanager -> ledger


def test_every_service_answers_through_each_forwarder_with_the_links_delay(cluster):
    state_dir, state = cluster
    plan = state["regions"]
    by_target = {}
    for f in plan["forwarders"]:
        by_target.setdefault(f["target"], []).append(f)
    for name, info in state["services"].items():
        routes = by_target[info["address"]]
        assert len(routes) == 1  # one other region
        f = routes[0]
        caller_host = plan["regions"][f["up"].split("->")[0]]["host"]
        # A TCP connection from the other region's address set, through the forwarder.
        with socket.create_connection(f["listen"].rsplit(":", 1), timeout=5, source_address=(caller_host, 0)) as s:
            assert s.getsockname()[0] == caller_host
        # A health check through it pays the round trip (one RTT for the request and its answer at least).
        assert _health(f["listen"]) >= RTT_MS / 1000 * 0.8, name
        # Directly (within the callee's region) it does not.
        assert _health(info["address"]) < RTT_MS / 1000 * 0.8, name
    time.sleep(2.5)  # the links process writes its counters every second
    counters = json.loads((state_dir / "links.json").read_text())
    for info in state["services"].values():
        f = by_target[info["address"]][0]
        c = counters["forwarders"][f["name"]]
        assert c["connections"] >= 2 and c["bytes_up"] > 0 and c["bytes_down"] > 0, (f["name"], c)
    assert counters["links"]["infer->train"]["bytes"] > 0 and counters["links"]["train->infer"]["bytes"] > 0
