"""Supervision of a local cluster (`rollart up`'s processes, as `rollart run` supervises them): redis-server,
the Mooncake master and a service SIGKILLed and started again on the same address, with the cause as an
event; the services recover (redis from its AOF). The job's loop group survives an envmanager SIGKILL: the
LoopKeeper asks the restarted process for it again."""

from __future__ import annotations

import asyncio
import os
import signal
import time
from pathlib import Path

import grpc
import pytest

from rollart.job.loops import LoopKeeper
from rollart.local import cluster as local
from rollart.local.mooncake import mooncake_master_binary
from rollart.local.processes import pid_alive
from rollart.local.supervisor import Supervisor
from rollart.runtime.auth import bearer
from rollart.v1 import envmanager_pb2 as em
from rollart.v1 import envmanager_pb2_grpc as em_grpc
from rollart.v1 import ledger_pb2 as lp
from rollart.v1 import ledger_pb2_grpc as lg
from rollart.v1 import resource_manager_pb2 as rm
from rollart.v1 import resource_manager_pb2_grpc as rm_grpc

pytestmark = pytest.mark.timeout(240)


@pytest.fixture
def cluster(tmp_path: Path, monkeypatch):
    for k in [k for k in os.environ if k.startswith("ROLLART_")]:
        monkeypatch.delenv(k)
    state_dir = tmp_path / "state"
    state = local.up(
        state_dir,
        only=["resource-manager", "ledger", "envmanager"],
        with_mooncake=mooncake_master_binary() is not None,
        log=lambda _m: None,
    )
    token = (state_dir / "job-token").read_text().strip()
    yield state_dir, state, token
    local.down(state_dir, log=lambda _m: None)


def _kill(pid: int) -> None:
    os.kill(pid, signal.SIGKILL)
    deadline = time.monotonic() + 10
    while pid_alive(pid) and time.monotonic() < deadline:
        time.sleep(0.05)


def _check_until(sup: Supervisor, n: int, timeout: float = 60.0) -> list:
    events: list = []
    deadline = time.monotonic() + timeout
    while len(events) < n and time.monotonic() < deadline:
        events += sup.check()
        time.sleep(0.1)
    return events


def test_redis_killed_comes_back_on_its_port_with_its_data(cluster):
    state_dir, state, token = cluster
    md = [bearer(token)]
    rm_addr = state["services"]["resource-manager"]["address"]
    with grpc.insecure_channel(rm_addr) as ch:
        rm_grpc.ResourceManagerStub(ch).RegisterPool(
            rm.RegisterPoolRequest(pool=rm.Pool(name="kept", kind=1, capacity=3)), metadata=md, timeout=10
        )
    old = state["redis"]
    _kill(old["pid"])
    with grpc.insecure_channel(rm_addr) as ch:  # the store is gone: retryable, not UNKNOWN
        with pytest.raises(grpc.RpcError) as err:
            rm_grpc.ResourceManagerStub(ch).ListPools(rm.ListPoolsRequest(), metadata=md, timeout=10)
    assert err.value.code() == grpc.StatusCode.UNAVAILABLE

    sup = Supervisor(state_dir)
    (ev,) = _check_until(sup, 1)
    assert (ev.process, ev.kind, ev.cause) == ("redis", "restarted", "killed by SIGKILL")
    assert ev.pid == old["pid"] and ev.new_pid != old["pid"] and pid_alive(ev.new_pid)
    now = local.read_state(state_dir)["redis"]
    assert now["url"] == old["url"] and now["restarts"] == 1
    # The services reconnect by themselves; the AOF brought back what they had written.
    deadline = time.monotonic() + 20
    while True:
        try:
            with grpc.insecure_channel(rm_addr) as ch:
                pools = rm_grpc.ResourceManagerStub(ch).ListPools(rm.ListPoolsRequest(), metadata=md, timeout=5)
            with grpc.insecure_channel(state["services"]["ledger"]["address"]) as ch:
                lg.LedgerStub(ch).GetStatus(lp.LedgerStatusRequest(), metadata=md, timeout=5)
            break
        except grpc.RpcError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)
    assert "kept" in [p.name for p in pools.pools]
    assert sup.check() == []  # nothing else died


@pytest.mark.skipif(mooncake_master_binary() is None, reason="mooncake_master is not installed")
def test_mooncake_master_killed_comes_back_on_its_ports(cluster):
    state_dir, state, _ = cluster
    old = state["mooncake"]
    _kill(old["pid"])
    (ev,) = _check_until(Supervisor(state_dir), 1)
    assert (ev.process, ev.kind, ev.cause) == ("mooncake", "restarted", "killed by SIGKILL")
    now = local.read_state(state_dir)["mooncake"]
    assert (now["address"], now["metrics_port"]) == (old["address"], old["metrics_port"]) and pid_alive(now["pid"])


def test_a_process_not_wanted_is_reported_dead_once(cluster):
    state_dir, state, _ = cluster
    _kill(state["services"]["ledger"]["pid"])
    sup = Supervisor(state_dir, wanted=lambda name: name != "ledger")
    (ev,) = _check_until(sup, 1)
    assert (ev.process, ev.kind) == ("ledger", "dead") and sup.dead == {"ledger"}
    assert sup.check() == []


def _groups(address: str, token: str) -> list[em.LoopGroup]:
    with grpc.insecure_channel(address) as ch:
        resp = em_grpc.EnvManagerStub(ch).ListLoopGroups(
            em.ListLoopGroupsRequest(include_stopped=True), metadata=[bearer(token)], timeout=10
        )
    return list(resp.groups)


def test_loop_group_survives_an_envmanager_sigkill(cluster):
    state_dir, state, token = cluster
    req = em.StartLoopsRequest(
        group_id="job-loops",
        env=em.EnvironmentSpec(environment="gymnasium:FrozenLake-v1", task="frozenlake"),
        count=3,
        lease_tasks=["frozenlake"],
    )
    events: list = []
    keeper = LoopKeeper(state_dir, token, req, on_event=events.append)
    address = state["services"]["envmanager"]["address"]
    with grpc.insecure_channel(address) as ch:
        em_grpc.EnvManagerStub(ch).StartLoops(req, metadata=[bearer(token)], timeout=30)
    assert asyncio.run(keeper.ensure()) is False  # running: nothing to do
    assert events == []

    _kill(state["services"]["envmanager"]["pid"])
    (ev,) = _check_until(Supervisor(state_dir), 1)
    assert (ev.process, ev.kind) == ("envmanager", "restarted")
    assert _groups(address, token) == []  # a new process starts with no loops...
    assert asyncio.run(keeper.ensure()) is True  # ...and is asked for the job's again
    (group,) = _groups(address, token)
    assert group.group_id == "job-loops" and group.count == 3 and group.state == em.LOOP_GROUP_STATE_RUNNING
    assert [e.kind for e in events] == ["loops-restored"]
    assert asyncio.run(keeper.ensure()) is False


def test_rollart_up_supervise_restarts_and_records_events(cluster):
    """`rollart up --supervise`'s loop: what dies comes back, each event logged and in events.jsonl."""
    import json

    from rollart.local.supervisor import supervise

    state_dir, state, _ = cluster
    _kill(state["redis"]["pid"])
    lines: list[str] = []
    sup = supervise(state_dir, log=lines.append, interval=0.1, stop=lambda: bool(lines))
    assert sup.restarts == {"redis": 1} and "redis" in lines[0] and "restarted" in lines[0]
    (event,) = [json.loads(x) for x in (state_dir / "events.jsonl").read_text().splitlines()]
    assert (event["process"], event["kind"], event["cause"]) == ("redis", "restarted", "killed by SIGKILL")
    assert pid_alive(local.read_state(state_dir)["redis"]["pid"])
