"""`rollart up --only resource-manager ledger actor`: without ROLLART_MODEL the actor builds the tiny model into
the state dir, serves it, registers with the resource manager and the ledger; `rollart down` leaves no process
behind (the engine core included)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import grpc
import pytest

pytest.importorskip("vllm")

from rollart.local.processes import pid_alive  # noqa: E402
from rollart.v1 import actor_pb2, actor_pb2_grpc, common_pb2, ledger_pb2, ledger_pb2_grpc  # noqa: E402
from rollart.v1 import resource_manager_pb2 as rm  # noqa: E402
from rollart.v1 import resource_manager_pb2_grpc as rm_grpc  # noqa: E402

ROLLART = str(Path(sys.executable).parent / "rollart")


def rollart(state: Path, *args: str, timeout: float = 900) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith("ROLLART_")}
    return subprocess.run(
        [ROLLART, "--state-dir", str(state), *args], capture_output=True, text=True, timeout=timeout, env=env
    )


def _engine_pids() -> set[int]:
    out = set()
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                if (d / "cmdline").read_bytes().startswith(b"VLLM::EngineCore"):
                    out.add(int(d.name))
            except OSError:
                pass
    return out


@pytest.mark.slow
def test_rollart_up_serves_the_tiny_model(tmp_path: Path) -> None:
    state_dir = tmp_path / "state"
    before = _engine_pids()
    up = rollart(state_dir, "up", "--only", "resource-manager", "ledger", "actor")
    assert up.returncode == 0, up.stderr + up.stdout
    try:
        assert (state_dir / "models" / "tiny" / "config.json").is_file()
        state = json.loads((state_dir / "state.json").read_text())
        actor = state["services"]["actor"]
        assert actor["model"] == "tiny" and actor["version"] == 0
        md = [("authorization", f"Bearer {(state_dir / 'job-token').read_text().strip()}")]
        with grpc.insecure_channel(actor["address"]) as ch:
            stub = actor_pb2_grpc.ActorStub(ch)
            req = actor_pb2.ActorGenerateRequest(
                request_id="up-1",
                input=common_pb2.ModelInput(messages=[common_pb2.ChatMessage(role="user", content="2+2?")]),
                sampling=common_pb2.SamplingParams(max_tokens=8, logprobs=True, ignore_eos=True),
                return_text=True,
            )
            chunks = list(stub.Generate(req, metadata=md, timeout=60))
        assert sum(len(c.token_ids) for c in chunks) == 8 and chunks[-1].finish_reason
        with grpc.insecure_channel(state["services"]["resource-manager"]["address"]) as ch:
            workers = rm_grpc.ResourceManagerStub(ch).ListWorkers(rm.ListWorkersRequest(role="actor"), metadata=md)
        assert [w.endpoint for w in workers.workers] == [actor["address"]]
        with grpc.insecure_channel(state["services"]["ledger"]["address"]) as ch:
            lstub = ledger_pb2_grpc.LedgerStub(ch)
            deadline = time.monotonic() + 30
            while True:
                listed = lstub.ListActors(ledger_pb2.ListActorsRequest(), metadata=md, timeout=5).actors
                if listed:
                    break
                assert time.monotonic() < deadline, "the actor never registered with the ledger"
                time.sleep(0.2)
        assert listed[0].actor_id == actor["actor_id"] and listed[0].endpoint == actor["address"]
        started = _engine_pids() - before
        assert started, "no engine core process"
    finally:
        down = rollart(state_dir, "down", timeout=120)
    assert down.returncode == 0, down.stdout
    assert not any(pid_alive(p["pid"]) for p in state["services"].values())
    deadline = time.monotonic() + 20
    while started & _engine_pids():
        assert time.monotonic() < deadline, "the engine core outlived `rollart down`"
        time.sleep(0.2)
