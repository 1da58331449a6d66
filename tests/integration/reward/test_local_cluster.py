"""`rollart up --only resource-manager reward`: the reward service starts, is healthy, registers with the
resource manager, answers, and `rollart down` stops everything."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import grpc

from rollart.local.processes import pid_alive
from rollart.v1 import common_pb2 as c
from rollart.v1 import resource_manager_pb2 as rm
from rollart.v1 import resource_manager_pb2_grpc as rm_grpc
from rollart.v1 import reward_pb2 as r
from rollart.v1 import reward_pb2_grpc

ROLLART = str(Path(sys.executable).parent / "rollart")


def rollart(state: Path, *args: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith("ROLLART_")}
    return subprocess.run(
        [ROLLART, "--state-dir", str(state), *args], capture_output=True, text=True, timeout=90, env=env
    )


def test_rollart_up_with_reward(tmp_path):
    state_dir = tmp_path / "state"
    up = rollart(state_dir, "up", "--only", "resource-manager", "reward")
    assert up.returncode == 0, up.stderr + up.stdout
    try:
        state = json.loads((state_dir / "state.json").read_text())
        status = rollart(state_dir, "status", "--json")
        assert status.returncode == 0, status.stdout + status.stderr
        rows = {row["service"]: row["status"] for row in json.loads(status.stdout)}
        assert rows["redis"] == "RUNNING" and rows["resource-manager"] == rows["reward"] == "SERVING"

        md = [("authorization", f"Bearer {(state_dir / 'job-token').read_text().strip()}")]
        with grpc.insecure_channel(state["services"]["resource-manager"]["address"]) as ch:
            workers = rm_grpc.ResourceManagerStub(ch).ListWorkers(rm.ListWorkersRequest(role="reward"), metadata=md)
        assert [w.endpoint for w in workers.workers] == [state["services"]["reward"]["address"]]
        assert workers.workers[0].pool == "reward"

        with grpc.insecure_channel(state["services"]["reward"]["address"]) as ch:
            t = c.Trajectory(
                trajectory_id="up-1", task="math", turns=[c.Turn(action="\\boxed{4}")], metadata={"answer": "4"}
            )
            res = reward_pb2_grpc.RewardStub(ch).Score(r.ScoreRequest(trajectory=t), metadata=md, timeout=60)
        assert res.status == r.SCORE_STATUS_OK and res.outcome.reward == 1.0
    finally:
        down = rollart(state_dir, "down")
    assert down.returncode == 0, down.stdout
    assert not any(pid_alive(p["pid"]) for p in state["services"].values())
