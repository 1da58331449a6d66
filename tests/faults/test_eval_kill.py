"""Validation survives an envmanager SIGKILLed mid-evaluation (issue 25), in a real run (`rollart run`, the
FrozenLake example scaled down, two vLLM-CPU actors).

The initial policy's evaluation (held-out maps, n samples each) is running on the envmanager when it is killed:
the supervisor of `rollart run` starts it again, its loop group is restored, and the evaluation is retried on the
new process (or, had it not come back, reported failed with its cause). The job goes on: every step completes,
later evaluations happen, and summary.json carries the validation figures.
"""

from __future__ import annotations

import os
import signal
import time

import grpc
import pytest

from rollart.job.evaluation import eval_rows
from rollart.job.metrics import read_records
from rollart.v1 import envmanager_pb2 as em
from rollart.v1 import envmanager_pb2_grpc as emg
from tests.e2e.jobs import cluster_state, finish, job_file, start, tail

from .chaos import SCORE_DEADLINE_SECONDS

pytest.importorskip("vllm")
pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]

STEPS = 6
HELD_OUT = ["SFFF,FHFF,FFFH,FFFG", "SFFF,FHFH,FFFF,HFFG"]


def evaluation_in_flight(out) -> int:
    """The envmanager's pid once it lists a validation trajectory with a turn done (0 until then)."""
    st = cluster_state(out)
    info = st.get("services", {}).get("envmanager")
    if not info or not st.get("token_file"):
        return 0
    token = open(st["token_file"]).read().strip()
    with grpc.insecure_channel(info["address"]) as ch:
        try:
            got = emg.EnvManagerStub(ch).ListTrajectories(
                em.ListTrajectoriesRequest(), metadata=[("authorization", f"Bearer {token}")], timeout=5)
        except grpc.RpcError:
            return 0
    return info["pid"] if any(t.trajectory_id.startswith("eval-") and t.turns >= 1 for t in got.trajectories) else 0


@pytest.fixture(scope="module")
def killed_run(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("eval-kill")
    section = {"every": 3, "prompts": [{"options": {"desc": d}} for d in HELD_OUT], "samples": 4, "retries": 4,
               "timeout": "120s", "score_target": 0.5}  # fmt: skip
    # a training sample the kill leaves admitted but unscored is redone after the ledger's score deadline: short here
    ledger_env = {"ledger": {"ROLLART_SCORE_DEADLINE_SECONDS": str(SCORE_DEADLINE_SECONDS)}}
    cfg = job_file(tmp, job={"max_steps": STEPS}, run={"timeout": "480s"}, eval=section,
                   cluster={"actors": 2, "env": ledger_env})
    out = tmp / "out"
    proc = start(cfg, out)
    try:
        deadline, pid = time.monotonic() + 240, 0
        while not pid and time.monotonic() < deadline and proc.poll() is None:
            pid = evaluation_in_flight(out)
            time.sleep(0.1)
        assert pid, f"no evaluation seen in flight:\n{tail(out)}"
        os.kill(pid, signal.SIGKILL)
        code, summary = finish(proc, out, timeout=480)
    finally:
        if proc.poll() is None:
            proc.terminate()
            proc.wait(60)
    return code, summary, out, pid


def test_the_run_completes_and_the_killed_evaluation_was_retried(killed_run):
    code, summary, out, pid = killed_run
    assert code == 0 and summary["state"] == "COMPLETED", tail(out)
    assert [r["step"] for r in read_records(out / "metrics.jsonl")] == list(range(1, STEPS + 1))
    assert any(ev["process"] == "envmanager" and ev["kind"] == "restarted" for ev in summary["events"]), summary
    assert cluster_state(out) == {} or cluster_state(out)["services"]["envmanager"]["pid"] != pid
    rows = {r["eval_step"]: r for r in eval_rows(out / "metrics.jsonl")}
    assert sorted(rows) == [0, 3, 6], rows
    first = rows[0]
    # retried on the restarted envmanager (a failed row would have to say why, and the job still goes on)
    assert first["attempts"] >= 2 and first["retried"], first
    assert not first["failed"] and first["episodes_scored"] == 8, first
    assert all(not r["failed"] and r["episodes_scored"] == 8 for r in rows.values()), rows
    v = summary["validation"]["frozenlake"]
    assert v["evaluations"] == 3 and v["failed_evaluations"] == 0 and v["metric"] == "mean@4"
    assert v["final_step"] == STEPS and v["tokens_generated"] > 0
    # validation never trained: every trained sample is one of the job's batches
    trained = summary["accounting"]["trained"]["samples"]
    assert trained == sum(r["samples"] for r in read_records(out / "metrics.jsonl"))
