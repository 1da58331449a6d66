"""``rollart run --fleet``: what a joining job reads of the running cluster, and the clear errors when there is
nothing to join (the attach itself runs against real actors in tests/integration/actor/test_actor_jobs.py)."""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path

import pytest

from rollart.job.fleet import Fleet
from rollart.local.processes import ProcessError


def cluster(tmp: Path, services: dict[str, int]) -> Path:
    folder = tmp / "run-a" / "cluster"
    folder.mkdir(parents=True)
    (folder / "job-token").write_text("fleet-token\n")
    state = {
        "state_dir": str(folder),
        "token_file": str(folder / "job-token"),
        "services": {
            n: {"pid": pid, "address": f"127.0.0.1:{5000 + i}", "env": {"ROLLART_MODEL": "/models/base"}}
            for i, (n, pid) in enumerate(services.items())
        },
    }
    (folder / "state.json").write_text(json.dumps(state))
    return tmp / "run-a"


def test_a_running_fleet_gives_its_proxy_actors_and_token(tmp_path: Path) -> None:
    me = os.getpid()  # alive
    run = cluster(tmp_path, {"llmproxy": me, "actor": me, "actor-2": me, "actor-3": 999_999_999, "ledger": me})
    fleet = Fleet(run)
    assert fleet.llmproxy == "127.0.0.1:5000" and sorted(fleet.actors) == ["actor", "actor-2"]  # actor-3 is dead
    assert fleet.token == "fleet-token" and fleet.model == "/models/base"
    assert fleet.service_env("job-b") == {
        "trainer": {"ROLLART_LLMPROXY": "127.0.0.1:5000", "ROLLART_LLMPROXY_JOB_ID": "job-b"},
        "envmanager": {"ROLLART_LLMPROXY": "127.0.0.1:5000", "ROLLART_LLMPROXY_JOB_ID": "job-b"},
    }
    mine = tmp_path / "run-b" / "cluster"
    fleet.adopt_token(mine)
    assert (mine / "job-token").read_text().strip() == "fleet-token"
    assert stat.S_IMODE((mine / "job-token").stat().st_mode) == 0o600
    assert Fleet(run / "cluster").llmproxy == fleet.llmproxy  # the cluster folder itself works too


@pytest.mark.parametrize(
    "services, says",
    [
        ({}, "no running cluster"),
        ({"actor": os.getpid()}, "its LLMProxy is not running"),
        ({"llmproxy": 999_999_999, "actor": os.getpid()}, "its LLMProxy is not running"),
        ({"llmproxy": os.getpid(), "actor": 999_999_999}, "no actor of it is running"),
    ],
)
def test_nothing_to_join_is_a_clear_error(tmp_path: Path, services: dict[str, int], says: str) -> None:
    run = cluster(tmp_path, services) if services else tmp_path / "empty"
    with pytest.raises(ProcessError, match=says):
        Fleet(run)
