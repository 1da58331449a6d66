"""`rollart run A --join B` (rollart.job.joined): the checks made before anything starts, and the owner's wait for
its joined jobs (real child processes standing in for `rollart run --fleet`; the whole path runs in
tests/faults/test_lora_jobs.py)."""

from __future__ import annotations

import asyncio
import json
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from rollart.job.joined import Joined, JoinedJobs
from rollart.job.spec import SpecError

LORA = {"rank": 8, "alpha": 16}


def job(tmp: Path, name: str, job_id: str, lora: bool = True) -> Path:
    data = {
        "job": {"job_id": job_id, "model": "tiny"},
        "model": {"builder": "tiny", **({"lora": LORA} if lora else {})},
    }
    path = tmp / f"{name}.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def jobs(tmp: Path, *files: Path) -> JoinedJobs:
    return JoinedJobs(list(files), tmp / "out", say=lambda line: None)


def test_no_joined_jobs_checks_nothing(tmp_path: Path) -> None:
    jobs(tmp_path).check("a", owner_lora=False, fleet=True)


@pytest.mark.parametrize(
    "owner_lora, fleet, files, message",
    [
        (True, False, [("missing", "b", True, False)], "no such job file"),
        (False, False, [("b", "b", True, True)], "only a LoRA job's actors serve other jobs"),
        (True, True, [("b", "b", True, True)], "--join with --fleet"),
        (True, False, [("b", "b", False, True)], "only LoRA jobs (model.lora)"),
        (True, False, [("b", "a", True, True)], "is this run's own job's"),
    ],
)
def test_a_bad_join_is_refused_before_anything_starts(tmp_path, owner_lora, fleet, files, message) -> None:
    paths = []
    for name, job_id, lora, exists in files:
        paths.append(job(tmp_path, name, job_id, lora) if exists else tmp_path / f"{name}.yaml")
    with pytest.raises(SpecError, match=message.replace("(", r"\(").replace(")", r"\)")):
        jobs(tmp_path, *paths).check("a", owner_lora=owner_lora, fleet=fleet)


def test_two_joined_files_of_one_name_would_share_an_output(tmp_path: Path) -> None:
    (tmp_path / "x").mkdir()
    one, two = job(tmp_path, "b", "b1"), job(tmp_path / "x", "b", "b2")
    with pytest.raises(SpecError, match="two joined job files named 'b'"):
        jobs(tmp_path, one, two)


def child(code: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", code], start_new_session=True)


async def test_the_owner_waits_for_its_joined_jobs_and_names_the_failed(tmp_path: Path) -> None:
    j = jobs(tmp_path, job(tmp_path, "ok", "b"), job(tmp_path, "bad", "c"))
    j.jobs[0].proc = child("import time; time.sleep(0.5)")
    j.jobs[1].proc = child("raise SystemExit(3)")
    (tmp_path / "out").mkdir()
    await asyncio.wait_for(j.wait(asyncio.Event()), 10)
    assert [x.exit for x in j.jobs] == [0, 3] and [x.name for x in j.failed()] == ["bad"]
    written = json.loads((tmp_path / "out" / "joined.json").read_text())
    assert [(w["exit"], Path(w["out"]).name) for w in written] == [(0, "ok"), (3, "bad")]


async def test_a_stop_interrupts_the_joined_jobs(tmp_path: Path) -> None:
    j = jobs(tmp_path, job(tmp_path, "b", "b"))
    j.jobs[0].proc = child("import time; time.sleep(60)")
    (tmp_path / "out").mkdir()
    stop = asyncio.Event()
    waiting = asyncio.ensure_future(j.wait(stop))
    await asyncio.sleep(0.3)
    assert not waiting.done()
    stop.set()  # Ctrl-C, SIGTERM or the owner's timeout
    await asyncio.wait_for(waiting, 10)
    assert j.jobs[0].exit == -signal.SIGTERM and j.failed() == j.jobs


def test_a_joined_job_reports_its_file_folder_pid_and_exit(tmp_path: Path) -> None:
    entry = Joined(tmp_path / "b.yaml", tmp_path / "out" / "joined" / "b")
    assert entry.name == "b" and entry.to_dict() == {
        "job_file": str(tmp_path / "b.yaml"),
        "out": str(tmp_path / "out" / "joined" / "b"),
        "pid": None,
        "exit": None,
    }
