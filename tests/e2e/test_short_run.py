"""The main job end to end, short: `rollart run` starts the whole local cluster (redis, Mooncake master,
resource manager, ledger, relay, trainer, reward, two vLLM-CPU actors, LLMProxy, envmanager), trains the
FrozenLake example for a few steps with the asynchronous protocol, and stops everything.

Checked: versions advance (one per step, registered with the ledger with the trainer's hashes), both
actors end on the newest version with the trainer's hash, every step trained a full batch of admitted,
scored samples, rewards were computed, the metrics/curve/summary files exist, and no process is left.
"""

from __future__ import annotations

import math

import pytest

from tests.e2e.jobs import finish, job_file, leftover_processes, records, start, tail

pytest.importorskip("vllm")
pytestmark = pytest.mark.slow

STEPS, BATCH = 4, 16


@pytest.mark.timeout(600)
def test_short_run(tmp_path):
    cfg = job_file(tmp_path, job={"max_steps": STEPS, "batch_size": BATCH})
    out = tmp_path / "out"
    code, summary = finish(start(cfg, out), out, timeout=560)
    log = tail(out)
    assert code == 0, log
    assert summary["state"] == "COMPLETED" and summary["steps"] == STEPS, log

    final = summary["final"]
    ledger, trainer = final["ledger"], final["trainer"]
    # Versions advance: v0 (the loaded policy) and one per step, each published by the trainer with the
    # hash the ledger registered.
    assert ledger["latest_version"] == STEPS
    assert sorted(int(v) for v in ledger["versions"]) == list(range(STEPS + 1))
    assert trainer["published"] == ledger["versions"] and trainer["failed_publications"] == 0
    # Both actors end on the newest version, with its hash (what they verified and applied).
    live = {a: s for a, s in final["actors"].items() if s["liveness"] == "ALIVE"}
    assert len(live) == 2, final["actors"]
    for state in live.values():
        assert state["active_version"] == STEPS and state["active_hash"] == ledger["versions"][str(STEPS)]
        assert state["settled_tokens"] > 0  # both generated admitted tokens

    # Samples admitted and trained on, rewards computed.
    recs = records(out)
    assert [r["step"] for r in recs] == list(range(1, STEPS + 1))
    for r in recs:
        assert r["samples"] == BATCH and r["groups"] == BATCH // 8
        if r["extra"]["zero_advantage_groups"] < r["groups"]:  # a group with a preference: it was trained on
            assert r["tokens_trained"] > 0
        assert r["version_trained"] == r["step"] - 1 and r["staleness_max"] <= 1  # alpha = 1
        assert 0.0 <= r["reward_min"] <= r["reward_mean"] <= r["reward_max"] <= 1.0
        assert math.isfinite(r["loss"]) and r["step_seconds"] > 0
    assert ledger["admitted"] >= STEPS * BATCH and ledger["buffer_reserved"] == 0
    assert final["envmanager"]["trajectories"] >= STEPS * BATCH
    assert sum(r["reward_max"] for r in recs) > 0  # some episode reached the goal: rewards are real
    assert (out / "reward.png").stat().st_size > 1000 and summary["reward_png"]
    assert "reward" in log and "actors" in log  # the progress lines

    # Nothing is left running.
    assert leftover_processes(summary["process_groups"]) == []
