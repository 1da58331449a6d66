"""Two LoRA jobs on one fleet, one of them SIGKILLed mid-step (issue 29), in a real run: `rollart run A --join B`
(the FrozenLake example scaled down with model.lora, two vLLM-CPU actors). A owns the fleet; B runs beside it as
`rollart run B --fleet`, and once B has trained a step every process of B (its `rollart run`, trainer, ledger,
relay, reward, envmanager, Redis) is SIGKILLed while its turns run on the shared actors.

A goes on: every step completes once, several of them after the kill, nothing trained twice; the command exits 1
naming the joined job that failed. No DetachJob ever came for B: the actors see its ledger stop answering and
detach it themselves (attached_job_orphan_seconds, short here), so its adapters do not hold an engine slot for good.
"""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path

import pytest
import yaml

from tests.e2e.jobs import cluster_state, finish, job_file, records, start, tail

pytest.importorskip("vllm")
pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]

STEPS_A, STEPS_B = 16, 40
JOB_B = "frozenlake-lora-b"
ORPHAN_SECONDS = 8.0


def lora_job(tmp: Path, name: str, job_id: str, seed: int, steps: int, **top) -> Path:
    made = job_file(tmp, job={"job_id": job_id, "seed": seed, "max_steps": steps}, run={"timeout": "480s"}, **top)
    path = made.rename(tmp / f"{name}.yaml")
    data = yaml.safe_load(path.read_text())
    data["model"]["lora"] = {"rank": 8, "alpha": 16, "dropout": 0.0}
    data["job"]["grpo"]["learning_rate"] = 5.0e-3
    if "cluster" not in top:
        data.pop("cluster", None)  # B: the fleet's actors (--fleet)
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def kill_job(pid: int, out: Path) -> list[int]:
    """SIGKILL the run and every process group of its cluster (each service leads its own); returns them."""
    groups = [pid]
    st = cluster_state(out)
    groups += [info["pid"] for info in st.get("services", {}).values()]
    groups += [st[extra]["pid"] for extra in ("redis", "mooncake", "links") if st.get(extra)]
    for pgid in groups:
        try:
            os.killpg(pgid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    return groups


@pytest.fixture(scope="module")
def two_jobs(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("lora-jobs")
    actor_env = {"actor": {"ROLLART_ATTACHED_JOB_ORPHAN_SECONDS": str(ORPHAN_SECONDS)}}
    cfg_a = lora_job(tmp, "a", "frozenlake-lora", 0, STEPS_A, cluster={"actors": 2, "env": actor_env})
    cfg_b = lora_job(tmp, "b", JOB_B, 1, STEPS_B)
    out_a = tmp / "out-a"
    out_b = out_a / "joined" / "b"
    a = start(cfg_a, out_a, "--join", str(cfg_b))
    try:
        deadline = time.monotonic() + 420
        while not records(out_b):  # B's first step, on A's actors
            assert a.poll() is None and time.monotonic() < deadline, f"B never trained a step:\n{tail(out_a)}"
            time.sleep(0.5)
        assert not records(out_a) or len(records(out_a)) < STEPS_A, "A ended before B was killed"
        time.sleep(1.0)  # into B's next step: its turns run on the shared actors
        (joined,) = json.loads((out_a / "joined.json").read_text())
        killed_at, b_steps = time.time(), len(records(out_b))
        kill_job(joined["pid"], out_b)
        code, summary = finish(a, out_a, timeout=480)
    finally:
        if a.poll() is None:
            a.terminate()
            a.wait(60)
    return code, summary, out_a, killed_at, b_steps


def test_the_other_job_completes_every_step_once(two_jobs):
    code, summary, out_a, killed_at, b_steps = two_jobs
    assert b_steps >= 1
    assert summary["state"] == "COMPLETED", tail(out_a)
    assert code == 1 and "joined job(s) failed: b" in (out_a / "run.log").read_text(), tail(out_a)
    assert [j["exit"] for j in summary["joined"]] == [-signal.SIGKILL]
    recs = records(out_a)
    assert [r["step"] for r in recs] == list(range(1, STEPS_A + 1))
    assert sum(r["finished_at"] > killed_at for r in recs) >= 3, [(r["step"], r["finished_at"]) for r in recs]
    trained = summary["accounting"]["trained"]["samples"]
    assert trained == sum(r["samples"] for r in recs)  # nothing trained twice, nothing of B's counted


def test_the_actors_detached_the_killed_job_by_themselves(two_jobs):
    _, _, out_a, _, _ = two_jobs
    logs = sorted((out_a / "cluster" / "logs").glob("actor*.log"))
    assert len(logs) == 2, logs
    for log in logs:
        text = log.read_text(errors="replace")
        assert f"job {JOB_B} attached" in text, log
        assert f"job {JOB_B}: its ledger has not answered" in text and f"job {JOB_B} detached" in text, log
