"""Faults during a real run (`rollart run`, the FrozenLake example scaled down, two vLLM-CPU actors).

One run, three faults injected by SIGKILL while it trains:
- after step 2, an actor: the run goes on with the other; its in-flight turns are retried on the other
  actor or their leases released and redone; the ledger declares it dead (it is not restarted);
- after step 4, the relay: the surviving actor falls back to the trainer's Relay API for every later
  delta (the relay is not restarted either);
- after step 6, the trainer: the supervisor of `rollart run` starts it again; it resumes the job from its
  last checkpoint by itself and republishes the interrupted version with identical bits.
The run must still complete every step with full batches, and the surviving actor must end on the newest
version with the trainer's hash.
"""

from __future__ import annotations

import os
import signal

import pytest

from tests.e2e.jobs import (
    cluster_state,
    finish,
    job_file,
    leftover_processes,
    records,
    start,
    tail,
    wait_for_step,
)

pytest.importorskip("vllm")
# The run (and its fixture) takes about 3 minutes here; the bound covers a busy machine.
pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]

STEPS, BATCH = 10, 16
FAULTS = [(2, "actor-2"), (4, "relay"), (6, "trainer")]


@pytest.fixture(scope="module")
def faulty_run(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("faults")
    cfg = job_file(
        tmp,
        job={"max_steps": STEPS, "batch_size": BATCH, "options": {"ledger.actor_timeout": "5"}},
        run={"timeout": "420s", "restart": ["trainer"]},
    )
    out = tmp / "out"
    proc = start(cfg, out)
    killed: dict[str, int] = {}
    try:
        for step, name in FAULTS:
            wait_for_step(proc, out, step, timeout=240)
            pid = cluster_state(out)["services"][name]["pid"]
            os.kill(pid, signal.SIGKILL)
            killed[name] = pid
        code, summary = finish(proc, out, timeout=420)
    finally:
        if proc.poll() is None:
            proc.terminate()
            proc.wait(60)
    return code, summary, out, killed


def test_run_completes_through_all_faults(faulty_run):
    code, summary, out, killed = faulty_run
    assert set(killed) == {"actor-2", "relay", "trainer"}
    assert code == 0 and summary["state"] == "COMPLETED", tail(out)
    steps = [r["step"] for r in records(out)]
    assert steps == list(range(1, STEPS + 1)), steps  # every step once, none lost or repeated
    assert all(r["samples"] == BATCH for r in records(out))
    assert leftover_processes(summary["process_groups"]) == []


def test_actor_killed_run_goes_on_with_the_other(faulty_run):
    _, summary, out, killed = faulty_run
    final = summary["final"]
    actors = final["actors"]
    survivors = {a: s for a, s in actors.items() if s["liveness"] == "ALIVE"}
    assert len(survivors) == 1, actors
    (state,) = survivors.values()
    assert state["active_version"] == STEPS
    assert state["active_hash"] == final["ledger"]["versions"][str(STEPS)]
    assert sorted(s["liveness"] for s in actors.values()) in (["ALIVE", "DEAD"], ["ALIVE", "LEFT"])
    # After the kill only the survivor serves the steps.
    later = [r for r in records(out) if r["step"] >= 5]
    assert later and all(len(r["actor_versions"]) == 1 for r in later), [r["actor_versions"] for r in later]
    assert "actor-2" in summary["dead"]


def test_relay_killed_actor_falls_back_to_the_trainer(faulty_run):
    _, summary, out, _ = faulty_run
    final = summary["final"]
    assert "relay" in summary["dead"] and "relay" not in summary["restarts"]
    # Versions published after the relay died still reached the surviving actor (from the trainer).
    versions = final["ledger"]["versions"]
    assert sorted(int(v) for v in versions) == list(range(STEPS + 1))
    (state,) = [s for s in final["actors"].values() if s["liveness"] == "ALIVE"]
    assert state["active_version"] == STEPS and state["active_hash"] == versions[str(STEPS)]


def test_trainer_killed_resumes_from_its_checkpoint(faulty_run):
    _, summary, out, _ = faulty_run
    assert summary["restarts"] == {"trainer": 1}
    log = (out / "cluster" / "logs" / "trainer.log").read_text()
    assert '"msg": "resumed"' in log
    final = summary["final"]
    # The restarted trainer republished what it had to with the hashes the ledger already had.
    published = final["trainer"]["published"]
    assert published and all(final["ledger"]["versions"][v] == h for v, h in published.items())
    assert final["trainer"]["failed_publications"] == 0
    assert final["ledger"]["latest_version"] == STEPS
