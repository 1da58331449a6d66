"""The EnvManager's API surface as a real process: authentication, malformed and invalid requests, idempotent
StartLoops/StopLoops, listings, health, and `rollart up` (registered with the resource manager as role
envmanager)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from rollart.local.processes import pid_alive
from rollart.runtime.auth import bearer
from rollart.v1 import common_pb2 as c
from rollart.v1 import envmanager_pb2 as em
from rollart.v1 import envmanager_pb2_grpc as emg
from rollart.v1 import resource_manager_pb2 as rm
from rollart.v1 import resource_manager_pb2_grpc as rm_grpc
from tests.conftest import BIN, Services

from .loop_cluster import CUSTOM_ENVS, MD, env_spec

ROLLART = str(Path(sys.executable).parent / "rollart")


@pytest.fixture(scope="module")
def manager(tmp_path_factory):
    """An envmanager whose peers are unreachable addresses: every check here happens before any call to them."""
    services = Services(tmp_path_factory.mktemp("envmanager-api"))
    _, info = services.start("envmanager", [str(BIN / "rollart-envmanager")], timeout=60,
                             ROLLART_LEDGER="127.0.0.1:9", ROLLART_LLMPROXY="127.0.0.1:9",
                             ROLLART_REWARD="127.0.0.1:9", ROLLART_ENVIRONMENTS=json.dumps(CUSTOM_ENVS),
                             ROLLART_MANAGER_ID="em-api", ROLLART_BACKOFF_SECONDS="5",
                             ROLLART_RPC_TIMEOUT_SECONDS="2")
    ch = grpc.insecure_channel(info["address"])
    yield emg.EnvManagerStub(ch), ch
    ch.close()
    services.stop_all()


def code_of(fn, *args, **kw) -> grpc.StatusCode:
    with pytest.raises(grpc.RpcError) as err:
        fn(*args, **kw)
    return err.value.code()


def test_every_rpc_requires_the_job_token(manager):
    stub, ch = manager
    calls = [
        (stub.ListEnvironments, em.ListEnvironmentsRequest()),
        (stub.StartLoops, em.StartLoopsRequest(group_id="g", env=env_spec("custom:echo"), count=1)),
        (stub.StopLoops, em.StopLoopsRequest(group_ids=["g"])),
        (stub.ListLoopGroups, em.ListLoopGroupsRequest()),
        (stub.ListLoops, em.ListLoopsRequest()),
        (stub.ListTrajectories, em.ListTrajectoriesRequest()),
        (stub.AbortTrajectories, em.AbortTrajectoriesRequest(trajectory_ids=["t"])),
        (stub.RunEpisode, em.RunEpisodeRequest(env=env_spec("custom:echo"))),
        (stub.GetStatus, em.EnvManagerStatusRequest()),
    ]
    for fn, req in calls:
        assert code_of(fn, req, timeout=5) == grpc.StatusCode.UNAUTHENTICATED, fn
        assert code_of(fn, req, metadata=[bearer("wrong-token")], timeout=5) == grpc.StatusCode.UNAUTHENTICATED
    # nothing changed, and health stays open to probes
    assert not stub.ListLoopGroups(em.ListLoopGroupsRequest(include_stopped=True), metadata=MD, timeout=5).groups
    health = health_pb2_grpc.HealthStub(ch).Check(health_pb2.HealthCheckRequest(), timeout=5)
    assert health.status == health_pb2.HealthCheckResponse.SERVING


def test_malformed_bytes_are_invalid_argument(manager):
    _, ch = manager
    for method in ("StartLoops", "RunEpisode", "GetStatus", "AbortTrajectories"):
        call = ch.unary_unary(f"/rollart.v1.EnvManager/{method}", request_serializer=lambda b: b,
                              response_deserializer=lambda b: b)
        assert code_of(call, b"\xff\xff\xff\xff\x0f", metadata=MD, timeout=5) == grpc.StatusCode.INVALID_ARGUMENT


@pytest.mark.parametrize("bad, code", [
    (dict(group_id="", count=1), "INVALID_ARGUMENT"),
    (dict(group_id="has space", count=1), "INVALID_ARGUMENT"),
    (dict(group_id="g", count=0), "INVALID_ARGUMENT"),
    (dict(group_id="g", count=1, max_trajectories_per_loop=-1), "INVALID_ARGUMENT"),
    (dict(group_id="g", count=1, env=em.EnvironmentSpec()), "INVALID_ARGUMENT"),
    (dict(group_id="g", count=1, env=env_spec("nope:nothing")), "INVALID_ARGUMENT"),
    (dict(group_id="g", count=1, env=env_spec("gymnasium:FrozenLake-v1", options={"bogus": "1"})), "INVALID_ARGUMENT"),
    # GEM seeds process-global RNGs: it never runs in-process
    (dict(group_id="g", count=1, env=env_spec("gem:game:Sokoban-v0-easy",
                                              sandbox=em.SandboxSpec(backend=em.SANDBOX_BACKEND_IN_PROCESS))),
     "INVALID_ARGUMENT"),
    (dict(group_id="g", count=1, env=env_spec("custom:echo", sandbox=em.SandboxSpec(backend=42))), "INVALID_ARGUMENT"),
    (dict(group_id="g", count=1, env=env_spec("custom:echo", interaction=7)), "INVALID_ARGUMENT"),
    (dict(group_id="g", count=1, env=env_spec("custom:echo", sandbox=em.SandboxSpec(memory_mib=-1))),
     "INVALID_ARGUMENT"),
    (dict(group_id="g", count=1, env=env_spec("custom:echo", latency=em.LatencyDistribution(
        kind=em.DISTRIBUTION_KIND_LOGNORMAL))), "INVALID_ARGUMENT"),
    (dict(group_id="g", count=1, env=env_spec("custom:echo", latency=em.LatencyDistribution(kind=99))),
     "INVALID_ARGUMENT"),
    (dict(group_id="g", count=1, env=env_spec("custom:echo", max_tokens=-5)), "INVALID_ARGUMENT"),
    (dict(group_id="g", count=1, env=env_spec("custom:echo"), holder_prefix="bad prefix"), "INVALID_ARGUMENT"),
    (dict(group_id="g", count=1, env=env_spec("custom:echo"), lease_tasks=[""]), "INVALID_ARGUMENT"),
    (dict(group_id="g", count=10**6, env=env_spec("custom:echo")), "RESOURCE_EXHAUSTED"),
    # unavailable here (gem-llm's own bug), not unknown
    (dict(group_id="g", count=1, env=env_spec("gem:game:FifteenPuzzle-v0-random")), "FAILED_PRECONDITION"),
])
def test_start_loops_rejects_bad_requests_without_starting_anything(manager, bad, code):
    stub, _ = manager
    req = em.StartLoopsRequest(**{"env": env_spec("custom:echo"), **bad})
    assert code_of(stub.StartLoops, req, metadata=MD, timeout=10).name == code
    assert not stub.ListLoopGroups(em.ListLoopGroupsRequest(include_stopped=True), metadata=MD, timeout=5).groups


def test_start_loops_is_idempotent_and_stop_loops_too(manager):
    stub, _ = manager
    req = em.StartLoopsRequest(group_id="idem", env=env_spec("custom:echo", task="nothing"), count=2)
    first = stub.StartLoops(req, metadata=MD, timeout=10)
    again = stub.StartLoops(req, metadata=MD, timeout=10)
    assert first.loop_ids == again.loop_ids == ["idem/0", "idem/1"] and first.started_at == again.started_at
    other = em.StartLoopsRequest(group_id="idem", env=env_spec("custom:echo", task="else"), count=2)
    assert code_of(stub.StartLoops, other, metadata=MD, timeout=10) == grpc.StatusCode.FAILED_PRECONDITION
    loops = stub.ListLoops(em.ListLoopsRequest(group_id="idem"), metadata=MD, timeout=5).loops
    assert [lo.holder for lo in loops] == ["em-api/idem/0", "em-api/idem/1"]
    # the ledger is unreachable: the loops back off with the reason, they do not crash
    status = stub.GetStatus(em.EnvManagerStatusRequest(), metadata=MD, timeout=5)
    assert status.manager_id == "em-api" and status.loops_active == 2
    assert code_of(stub.StopLoops, em.StopLoopsRequest(group_ids=["nope"]), metadata=MD, timeout=5) == \
        grpc.StatusCode.NOT_FOUND
    assert code_of(stub.StopLoops, em.StopLoopsRequest(), metadata=MD, timeout=5) == grpc.StatusCode.INVALID_ARGUMENT
    assert code_of(stub.ListLoops, em.ListLoopsRequest(states=[77]), metadata=MD, timeout=5) == \
        grpc.StatusCode.INVALID_ARGUMENT
    for _ in range(2):
        stopped = stub.StopLoops(em.StopLoopsRequest(group_ids=["idem"], mode=em.LOOP_STOP_MODE_ABORT, wait=True),
                                 metadata=MD, timeout=20)
        assert stopped.stopped and sorted(stopped.loop_ids) == ["idem/0", "idem/1"] and stopped.leases_released == 0
    groups = stub.ListLoopGroups(em.ListLoopGroupsRequest(include_stopped=True), metadata=MD, timeout=5).groups
    assert [(g.group_id, g.state) for g in groups] == [("idem", em.LOOP_GROUP_STATE_STOPPED)]
    assert not stub.ListLoopGroups(em.ListLoopGroupsRequest(), metadata=MD, timeout=5).groups
    loops = stub.ListLoops(em.ListLoopsRequest(group_id="idem"), metadata=MD, timeout=5).loops
    assert all(lo.state == em.LOOP_STATE_STOPPED and "AcquireLeases: UNAVAILABLE" in lo.last_error
               for lo in loops), loops


def test_run_episode_bad_requests_and_unreachable_proxy(manager):
    stub, _ = manager
    assert code_of(stub.RunEpisode, em.RunEpisodeRequest(), metadata=MD, timeout=5) == grpc.StatusCode.INVALID_ARGUMENT
    bad_id = em.RunEpisodeRequest(env=env_spec("custom:echo"), trajectory_id="no spaces allowed")
    assert code_of(stub.RunEpisode, bad_id, metadata=MD, timeout=5) == grpc.StatusCode.INVALID_ARGUMENT
    # no generation server: reported as an infrastructure failure with its cause, not as an RPC error or a reward
    req = em.RunEpisodeRequest(env=env_spec("custom:echo", sandbox=em.SandboxSpec(
        backend=em.SANDBOX_BACKEND_IN_PROCESS), generation_timeout=3), score=True)
    t = stub.RunEpisode(req, metadata=MD, timeout=30).trajectory
    assert t.status in (c.TRAJECTORY_STATUS_INFRA_FAILURE, c.TRAJECTORY_STATUS_TIMEOUT) and not t.scored
    assert "llmproxy" in t.failure_cause, t.failure_cause
    status = stub.GetStatus(em.EnvManagerStatusRequest(), metadata=MD, timeout=5)
    assert any(k.startswith("llmproxy") for k in status.failures_by_cause), status
    assert code_of(stub.AbortTrajectories, em.AbortTrajectoriesRequest(), metadata=MD, timeout=5) == \
        grpc.StatusCode.INVALID_ARGUMENT
    assert not stub.AbortTrajectories(em.AbortTrajectoriesRequest(trajectory_ids=["nobody"]), metadata=MD,
                                      timeout=5).aborted


def test_list_environments(manager):
    stub, _ = manager
    envs = stub.ListEnvironments(em.ListEnvironmentsRequest(source=em.ENV_SOURCE_CUSTOM), metadata=MD, timeout=10)
    assert [e.id for e in envs.environments] == ["custom:echo"]  # registered from the configuration
    games = stub.ListEnvironments(em.ListEnvironmentsRequest(source=em.ENV_SOURCE_TEXTARENA), metadata=MD, timeout=10)
    assert "textarena:TicTacToe-v0" in {e.id for e in games.environments}
    assert code_of(stub.ListEnvironments, em.ListEnvironmentsRequest(source=99), metadata=MD, timeout=5) == \
        grpc.StatusCode.INVALID_ARGUMENT


def test_rollart_up_registers_the_envmanager(tmp_path):
    state_dir = tmp_path / "state"
    env = {k: v for k, v in os.environ.items() if not k.startswith("ROLLART_")}
    up = subprocess.run([ROLLART, "--state-dir", str(state_dir), "up", "--only", "resource-manager", "ledger",
                         "envmanager"], capture_output=True, text=True, timeout=120, env=env)
    assert up.returncode == 0, up.stderr + up.stdout
    pids: list[int] = []
    try:
        state = json.loads((state_dir / "state.json").read_text())
        pids = [s["pid"] for s in state["services"].values()]
        md = [bearer((state_dir / "job-token").read_text().strip())]
        address = state["services"]["envmanager"]["address"]
        with grpc.insecure_channel(state["services"]["resource-manager"]["address"]) as ch:
            workers = rm_grpc.ResourceManagerStub(ch).ListWorkers(rm.ListWorkersRequest(role="envmanager"),
                                                                  metadata=md, timeout=10).workers
        assert [w.endpoint for w in workers] == [address] and workers[0].pool == "cpu"
        with grpc.insecure_channel(address) as ch:
            stub = emg.EnvManagerStub(ch)
            assert stub.GetStatus(em.EnvManagerStatusRequest(), metadata=md, timeout=10).manager_id == \
                workers[0].worker_id
            # the ledger that `up` started is its lease source: a loop waits for leases there, without errors
            stub.StartLoops(em.StartLoopsRequest(group_id="up", env=env_spec("gymnasium:FrozenLake-v1"), count=1),
                            metadata=md, timeout=10)
            time.sleep(1.5)
            (loop,) = stub.ListLoops(em.ListLoopsRequest(group_id="up"), metadata=md, timeout=10).loops
            assert loop.state == em.LOOP_STATE_ACQUIRING and not loop.last_error, loop
        environ = Path(f"/proc/{state['services']['envmanager']['pid']}/environ").read_bytes().split(b"\0")
        assert f"ROLLART_LEDGER={state['services']['ledger']['address']}".encode() in environ
    finally:
        down = subprocess.run([ROLLART, "--state-dir", str(state_dir), "down"], capture_output=True, text=True,
                              timeout=60, env=env)
    assert down.returncode == 0, down.stdout + down.stderr
    assert not any(pid_alive(p) for p in pids)

