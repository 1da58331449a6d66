"""ROLLART_CPUS confines a local-cluster service (and what it starts) to a CPU list."""

from __future__ import annotations

import shutil
import subprocess
import sys

import pytest

from rollart.local.cluster import pinned

PROBE = [sys.executable, "-c", "import os; print(sorted(os.sched_getaffinity(0)))"]


def test_unset_leaves_the_command_alone():
    assert pinned(["svc"], {}) == ["svc"]
    assert pinned(["svc"], {"ROLLART_CPUS": " "}) == ["svc"]


@pytest.mark.skipif(shutil.which("taskset") is None, reason="taskset (util-linux) missing")
def test_the_process_runs_on_the_given_cpus():
    out = subprocess.run(pinned(PROBE, {"ROLLART_CPUS": "0"}), capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[0]"


@pytest.mark.skipif(shutil.which("taskset") is None, reason="taskset (util-linux) missing")
def test_a_bad_cpu_list_fails_loudly():
    proc = subprocess.run(pinned(PROBE, {"ROLLART_CPUS": "not-a-cpu"}), capture_output=True, text=True)
    assert proc.returncode != 0 and proc.stderr
