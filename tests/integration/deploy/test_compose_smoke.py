"""`make compose-smoke` as a test: images built, the compose cluster (mTLS, host loopback) runs a FrozenLake job
with both actors on the newest version, bad input (missing key or token, a certificate file that is not there,
a certificate from another CA) exits with one line naming the setting, everything is removed at the end.

Needs root (or a running Docker daemon) and docker-compose; skipped otherwise. Slow: `make test-fast` skips it.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[3]

pytestmark = [pytest.mark.slow, pytest.mark.compose]


def _docker_usable() -> str | None:
    if shutil.which("docker") is None or shutil.which("docker-compose") is None:
        return "docker and docker-compose are not installed (make setup installs them)"
    from rollart_envmanager.sandbox import docker as dk

    ok, reason = dk.availability(refresh=True)
    if not ok and (os.geteuid() != 0 or shutil.which("dockerd") is None):
        return f"no Docker daemon and none can be started here: {reason}"
    if shutil.which("mmdebstrap") is None:
        return "mmdebstrap is not installed (make setup installs it; the local base image needs it)"
    return None


SERVICE_IMAGES = ["resource-manager", "ledger", "relay", "trainer", "actor", "llmproxy", "envmanager", "reward"]


def _images_present(tag: str = "dev") -> bool:
    return all(
        subprocess.run(["docker", "image", "inspect", f"rollart/{s}:{tag}"], capture_output=True).returncode == 0
        for s in SERVICE_IMAGES
    )


@pytest.mark.timeout(3000)
def test_compose_cluster_runs_a_job(tmp_path):
    why = _docker_usable()
    if why:
        pytest.skip(why)
    # Building every image from nothing takes ~20 minutes on 2 shared cores (deploy/README.md), more than the
    # CI budget leaves; with the images present (`make images` before, or a CI cache of the Docker data
    # root) the build reuses its layers and the whole test takes minutes. ROLLART_COMPOSE_SMOKE=1 runs it
    # regardless, =0 never.
    wanted = os.environ.get("ROLLART_COMPOSE_SMOKE", "")
    if wanted == "0" or (wanted != "1" and not _images_present()):
        pytest.skip(
            "service images not built: a cold build exceeds the CI budget; run `make images` first, "
            "`make compose-smoke`, or set ROLLART_COMPOSE_SMOKE=1"
        )
    proc = subprocess.run(
        [sys.executable, str(REPO / "deploy" / "smoke" / "compose_smoke.py"), "--steps", "2", "--tls", "mtls"],
        capture_output=True,
        text=True,
        timeout=2900,
        cwd=REPO,
    )
    (tmp_path / "smoke.log").write_text(proc.stderr)
    assert proc.returncode == 0, proc.stderr[-6000:]
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert result["ok"] and result["tls"] == "mtls"
    assert result["job"]["versions"] >= 2 and len(result["job"]["actors"]) == 2
    assert set(result["bad_input"]) == {
        "missing job key",
        "missing job token",
        "missing certificate file",
        "wrong certificate",
    }
