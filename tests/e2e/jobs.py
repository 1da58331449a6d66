"""Running `rollart run` from tests: a short FrozenLake job (the default example, scaled down) in a child
process, with its outputs (summary.json, metrics.jsonl, the cluster's state) where the test can read them.

The warm-started tiny model is built once per machine into a fixed folder under the temp directory (its
recipe is the cache key), so the e2e and fault tests share it.
"""

from __future__ import annotations

import copy
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
MODEL_DIR = Path(tempfile.gettempdir()) / "rollart-test-models" / "frozenlake-small"


def job_file(tmp: Path, *, job: dict | None = None, run: dict | None = None, **top: Any) -> Path:
    """examples/frozenlake.yaml with a smaller model, batch and step count, plus the given overrides."""
    data = yaml.safe_load((REPO / "examples" / "frozenlake.yaml").read_text())
    data = copy.deepcopy(data)
    data["model"].update(dir=str(MODEL_DIR))  # the example's recipe: ~9% of episodes succeed from step 1
    data["job"].update(batch_size=16, max_steps=4, batch_timeout="120s")
    data["loops"] = 8
    data["run"] = {"timeout": "240s"}
    data["job"].update(job or {})
    data["run"].update(run or {})
    data.pop("eval", None)  # these tests time training; validation has its own (tests/faults/test_eval_kill.py)
    data.update(top)
    path = tmp / "job.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def start(cfg: Path, out: Path, *extra: str) -> subprocess.Popen:
    env = {k: v for k, v in os.environ.items() if not k.startswith("ROLLART_")}
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    out.mkdir(parents=True, exist_ok=True)
    log = open(out / "run.log", "wb")  # noqa: SIM115 - handed to the child
    try:
        return subprocess.Popen(
            [str(BIN / "rollart"), "run", str(cfg), "--out", str(out), *extra],
            stdout=log,
            stderr=subprocess.STDOUT,
            env=env,
            cwd=REPO,
            start_new_session=True,
        )
    finally:
        log.close()


def finish(proc: subprocess.Popen, out: Path, timeout: float) -> tuple[int, dict]:
    try:
        code = proc.wait(timeout)
    except subprocess.TimeoutExpired:
        proc.terminate()  # rollart run stops the job and the cluster on SIGTERM
        proc.wait(60)
        raise AssertionError(f"rollart run did not finish in {timeout}s:\n{tail(out)}") from None
    path = out / "summary.json"
    summary = json.loads(path.read_text()) if path.is_file() else {}
    return code, summary


def tail(out: Path, n: int = 60) -> str:
    path = out / "run.log"
    return "\n".join(path.read_text(errors="replace").splitlines()[-n:]) if path.is_file() else "(no log)"


def records(out: Path) -> list[dict]:
    path = out / "metrics.jsonl"
    rows = [json.loads(x) for x in path.read_text().splitlines()] if path.is_file() else []
    return [r for r in rows if "step" in r]  # step records only: validation rows have no "step"


def cluster_state(out: Path) -> dict:
    path = out / "cluster" / "state.json"
    return json.loads(path.read_text()) if path.is_file() else {}


def wait_for_step(proc: subprocess.Popen, out: Path, step: int, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if any(r["step"] >= step for r in records(out)):
            return
        if proc.poll() is not None:
            raise AssertionError(f"rollart run ended (code {proc.returncode}) before step {step}:\n{tail(out)}")
        time.sleep(0.2)
    raise AssertionError(f"step {step} not reached in {timeout}s:\n{tail(out)}")


def leftover_processes(process_groups: dict[str, int]) -> list[str]:
    """Processes (not zombies) still in the cluster's process groups."""
    groups = set(process_groups.values())
    left = []
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            stat = (d / "stat").read_text()
        except OSError:
            continue
        fields = stat.rsplit(") ", 1)[1].split()
        state, pgid = fields[0], int(fields[2])
        if pgid in groups and state != "Z":
            left.append(f"pid {d.name} (group {pgid}): {(d / 'cmdline').read_bytes()[:80]!r}")
    return left
