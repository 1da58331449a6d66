"""Ctrl-C in the middle of `rollart run`: the job stops, what was trained is written (metrics, curve, summary),
every process of the cluster is stopped, and the exit status says it was interrupted (130).
"""

from __future__ import annotations

import os
import signal
import time

import pytest

from tests.e2e.jobs import finish, job_file, leftover_processes, records, start, tail, wait_for_step

pytest.importorskip("vllm")
pytestmark = pytest.mark.slow


@pytest.mark.timeout(600)
def test_ctrl_c_stops_everything_and_keeps_the_results(tmp_path):
    cfg = job_file(tmp_path, job={"max_steps": 50})  # far more than it will run
    out = tmp_path / "out"
    proc = start(cfg, out)
    try:
        wait_for_step(proc, out, 1, timeout=400)
        t0 = time.monotonic()
        os.killpg(proc.pid, signal.SIGINT)  # what a terminal sends to the foreground group on Ctrl-C
        code, summary = finish(proc, out, timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    log = tail(out)
    assert code == 130, log
    assert time.monotonic() - t0 < 120
    assert summary["stop_reason"] == "interrupted" and summary["state"] in ("STOPPED", "STOPPING"), summary
    steps = [r["step"] for r in records(out)]
    assert steps and steps == list(range(1, len(steps) + 1)) and len(steps) < 50, steps
    assert summary["steps"] == len(steps) and (out / "reward.png").is_file()
    assert "cluster          stopped" in log
    assert leftover_processes(summary["process_groups"]) == []
