"""Tracking on a real short run: `rollart run` (the FrozenLake example, 6 steps) with TensorBoard, W&B (offline),
MLflow (file store), rollout samples and Prometheus on its cluster. While it trains, every PromQL expression of
deploy/grafana/rollart-dashboard.json returns data from that Prometheus; afterwards TensorBoard's reader and its
HTTP data API (a started `tensorboard`) list the training reward, samples.jsonl holds the sampled trajectories
(`rollart samples` prints them), W&B and MLflow hold every step once, and Prometheus is gone with the cluster."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from rollart.job import monitoring
from rollart.local.processes import free_port, pid_alive
from tests.e2e.jobs import finish, job_file, records, start, tail
from tests.unit.job.test_tracking_backends import mlflow_client, tb_scalars, wandb_history

pytest.importorskip("vllm")
pytest.importorskip("tensorboard")
pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(shutil.which("prometheus") is None, reason="prometheus missing (apt-get install prometheus)"),
]
BIN = Path(sys.executable).parent
STEPS = 6  # long enough to query every panel while it trains


def _panels_with_data(url: str) -> tuple[list[str], list[str]]:
    ok, empty = [], []
    for title, expr in monitoring.dashboard_queries():
        (ok if monitoring.query(url, expr) else empty).append(f"{title}: {expr}")
    return ok, empty


@pytest.mark.timeout(900)
def test_a_short_run_feeds_every_backend_and_every_panel(tmp_path: Path):
    tracking = {"prometheus": True, "wandb": True, "mlflow": True, "samples": {"every": 2, "per_task": 2}}
    cfg = job_file(tmp_path, job={"max_steps": STEPS}, run={"timeout": "600s"}, tracking=tracking)
    out = tmp_path / "out"
    proc = start(cfg, out)
    prom_file = out / "cluster" / "prometheus" / "prometheus.json"
    empty: list[str] = ["(not queried)"]
    prom: dict = {}
    deadline = time.monotonic() + 700
    try:
        while proc.poll() is None and time.monotonic() < deadline:
            time.sleep(3)
            if not prom and prom_file.is_file():
                prom = json.loads(prom_file.read_text())
            if prom and len(records(out)) >= 2:
                try:
                    _ok, empty = _panels_with_data(prom["url"])
                except OSError:  # the run ended meanwhile and stopped its Prometheus
                    break
                if not empty:
                    break
    finally:
        code, summary = finish(proc, out, timeout=600)
    log = tail(out)
    assert code == 0 and summary["steps"] == STEPS, log
    assert prom, f"no Prometheus was started:\n{log}"
    assert not empty, "panels without data:\n" + "\n".join(empty)
    assert not pid_alive(int(prom["pid"])), "Prometheus outlived the run"

    scalars = tb_scalars(out / "tb")
    assert [s for s, _ in scalars["reward/mean"]] == list(range(1, STEPS + 1))
    assert {"timing_s/step", "generation/trained_samples", "train/entropy", "staleness/mean"} <= set(scalars)
    evaluated = {r["eval_step"] for r in records(out) if r.get("kind") == "validation" and not r.get("failed")}
    if evaluated:  # validation ran (the job's eval section): its score at each evaluated step
        assert {s for s, _ in scalars["val/frozenlake/score"]} == evaluated

    samples = [json.loads(x) for x in (out / "samples.jsonl").read_text().splitlines()]
    assert samples and {r["step"] for r in samples} <= {1, 2, 4, 6}
    assert all(r["task"] == "frozenlake" and r["turns"] and r["prompt"] for r in samples)
    printed = subprocess.run([str(BIN / "rollart"), "samples", str(out)], capture_output=True, text=True, check=True)
    assert "policy" in printed.stdout and "frozenlake" in printed.stdout

    _ids, history = wandb_history(out)
    assert [s for s, items in history if "reward/mean" in items] == list(range(1, STEPS + 1))
    state = json.loads((out / "tracking.json").read_text())
    run_ml = mlflow_client(out).get_metric_history(state["mlflow"]["run_id"], "reward/mean")
    assert sorted(m.step for m in run_ml) == list(range(1, STEPS + 1))

    # TensorBoard's own server lists the run's scalar tags through its HTTP data API.
    port = free_port()
    tb = subprocess.Popen([str(BIN / "tensorboard"), "--logdir", str(out / "tb"), "--port", str(port),
                           "--host=127.0.0.1"],
                          stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env={**os.environ})
    try:
        tags: dict = {}
        for _ in range(60):
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/data/plugin/scalars/tags", timeout=5) as r:
                    tags = json.loads(r.read())
                if tags:
                    break
            except OSError:
                pass
            time.sleep(1)
        assert "reward/mean" in tags.get(".", {}), tags
    finally:
        tb.terminate()
        tb.wait(30)
