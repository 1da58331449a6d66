"""What the serving benchmarks (``bench llmproxy``, ``bench control-scale``) share: starting RollArt service
processes and the simulated actors with one job token, reading a process's CPU time, percentiles.

Every process started here gets a clean ``ROLLART_*`` environment (the caller's own ``ROLLART_*`` settings would
change what is measured) and the repository on ``PYTHONPATH`` after whatever the caller's ``PYTHONPATH`` holds;
a ``PYTHONPATH=...`` passed to ``start`` replaces it (``bench llmproxy --baseline-ref`` puts an older proxy's
sources first that way).
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[2]
if str(REPO / "libs") not in sys.path:
    sys.path.insert(0, str(REPO / "libs"))

from rollart.local.processes import ManagedProcess  # noqa: E402
from rollart.runtime.auth import bearer  # noqa: E402
from rollart.v1 import common_pb2  # noqa: E402

TOKEN = "bench-serving-token-0123456789"
MD = (bearer(TOKEN),)
BIN = Path(sys.executable).parent
TICKS = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of a process (from /proc; its threads included)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / TICKS


def pct(values: list[float], q: float) -> float:
    return float(np.percentile(np.asarray(values), q)) if values else float("nan")


def sampling(n: int) -> common_pb2.SamplingParams:
    """``n`` tokens exactly (ignore_eos), greedy, with logprobs: every turn of a given size costs the same."""
    return common_pb2.SamplingParams(max_tokens=n, temperature=0.0, ignore_eos=True, logprobs=True)


def base_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("ROLLART_")}
    env.update(
        ROLLART_LISTEN="127.0.0.1:0",
        ROLLART_METRICS_LISTEN="127.0.0.1:0",
        ROLLART_JOB_TOKEN=TOKEN,
        ROLLART_LOG_FORMAT="text",
        ROLLART_LOG_LEVEL="WARNING",
        PYTHONPATH=os.pathsep.join(p for p in (os.environ.get("PYTHONPATH", ""), str(REPO)) if p),
    )
    env.update(extra)
    return env


def start(name: str, argv: list[str], tmp: Path, timeout: float, **env: str) -> tuple[ManagedProcess, dict]:
    """Start a service process and wait for its ready file; (process, the ready file's JSON)."""
    ready = tmp / "run" / f"{name}.ready"
    proc = ManagedProcess(
        name,
        argv,
        log_path=tmp / "logs" / f"{name}.log",
        env=base_env(ROLLART_READY_FILE=str(ready), **env),
        ready_file=ready,
    ).start()
    return proc, proc.wait_ready(timeout)


def start_sim(
    tmp: Path, n: int, ttft_ms: float, token_ms: float, coalesce: bool = False
) -> tuple[ManagedProcess, dict[str, str]]:
    """``n`` simulated actors (``bench/_support/sim_actor.py``) in one process of their own; (process, id -> address)."""
    ready = tmp / "run" / f"sim-{n}-{time.monotonic_ns()}.ready"
    ready.parent.mkdir(parents=True, exist_ok=True)
    argv = [
        sys.executable,
        str(REPO / "bench" / "_support" / "sim_actor.py"),
        "--actors",
        str(n),
        "--ttft-ms",
        str(ttft_ms),
        "--token-ms",
        str(token_ms),
        "--ready-file",
        str(ready),
        *(["--coalesce"] if coalesce else []),
    ]
    proc = ManagedProcess(
        f"sim-{n}", argv, log_path=tmp / "logs" / f"sim-{n}.log", env=base_env(), ready_file=ready
    ).start()
    deadline = time.monotonic() + 60
    while not ready.exists():
        if time.monotonic() > deadline or not proc.alive():
            raise RuntimeError(f"simulated actors did not start; see {tmp / 'logs'}")
        time.sleep(0.05)
    return proc, json.loads(ready.read_text())
