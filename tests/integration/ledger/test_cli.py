"""`rollart ledger status` against a real ledger."""

from __future__ import annotations

import json
import subprocess

from rollart.v1 import ledger_pb2 as lp
from tests.conftest import BIN, TOKEN

from .helpers import acquire, actor, heartbeat, policy, prompts, submit, version


def run(*args: str, env_dir=None) -> subprocess.CompletedProcess:
    env = {"PATH": "/usr/bin:/bin", "ROLLART_STATE_DIR": str(env_dir)} if env_dir else None
    return subprocess.run([str(BIN / "rollart"), *args], capture_output=True, text=True, timeout=60, env=env)


def test_ledger_status_table_and_json(ledger, tmp_path):
    s, md = ledger.stub, ledger.md
    policy(s, md, alpha=1, group_size=2)
    version(s, md, 0)
    actor(s, md, "actor-0", active=0, region="eu")
    heartbeat(s, md, "actor-0", active=0, tps=1234)
    s.PlanStep(lp.PlanStepRequest(step=1, version=0, batch_size=4), metadata=md)
    prompts(s, md, 2, group_size=2)
    leases = acquire(s, md, "env/0", 3)
    assert submit(s, md, leases[0]).admitted
    token_file = tmp_path / "token"
    token_file.write_text(TOKEN)

    out = run("ledger", "status", "--address", ledger.address, "--token-file", str(token_file))
    assert out.returncode == 0, out.stderr
    text = out.stdout
    assert "job job-1" in text and "alpha 1" in text and "current version n 0" in text
    assert "actor-0" in text and "ALIVE" in text and "1234" in text
    assert "pending 1  active 2  settled 1" in text and "admitted 1" in text
    assert "GENERATED  trained 0 (0 tok)" in text and "wasted 0.0% of 0 tokens" in text

    out = run("ledger", "status", "--json", "--address", ledger.address, "--token-file", str(token_file))
    data = json.loads(out.stdout)
    assert data["policy"]["job_id"] == "job-1" and data["actors"][0]["tau"] == 1234
    assert data["leases"]["active"] == "2" and data["buffer"]["samples"] == "1"

    bad = tmp_path / "bad"
    bad.write_text("not-the-token")
    out = run("ledger", "status", "--address", ledger.address, "--token-file", str(bad))
    assert out.returncode == 1 and "UNAUTHENTICATED" in out.stderr


def test_ledger_status_without_a_local_ledger_explains(tmp_path):
    out = run("ledger", "status", env_dir=tmp_path)
    assert out.returncode != 0 and "no ledger in the local cluster" in out.stderr
