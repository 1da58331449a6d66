"""``rollart run A.yaml --join B.yaml``: two LoRA jobs on one fleet from one command (docs/lora.md).

A owns the cluster as in any run. Once A's job has started, each joined job file runs in a child process exactly
as ``rollart run B.yaml --fleet OUT_A --out OUT_A/joined/<name>`` would (fleet.py): its own trainer, ledger, relay,
reward and envmanager, its adapter attached to A's actors. ``OUT_A/joined.json`` lists the children (file, output
folder, pid). A's cluster stays up until every joined job has ended; Ctrl-C or SIGTERM (or A's timeout) stops
them first. A joined job that fails makes the command exit 1, A's own results kept.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .spec import SpecError, load_job_file

# How long a joined job has to stop after SIGTERM before it is killed (its teardown takes seconds).
STOP_GRACE_SECONDS = 120.0


@dataclass
class Joined:
    job_file: Path
    out: Path
    proc: subprocess.Popen | None = None
    exit: int | None = None

    @property
    def name(self) -> str:
        return self.out.name

    def to_dict(self) -> dict[str, Any]:
        pid = self.proc.pid if self.proc is not None else None
        return {"job_file": str(self.job_file), "out": str(self.out), "pid": pid, "exit": self.exit}


class JoinedJobs:
    """The joined jobs of one run (none: every method is a no-op)."""

    def __init__(self, files: list[Path], out_dir: Path, say: Callable[[str], None]) -> None:
        self.out_dir = out_dir
        self.say = say
        self.jobs: list[Joined] = []
        for f in files:
            if not f.is_file():
                raise SpecError(f"--join {f}: no such job file")
            name = f.stem
            if any(j.name == name for j in self.jobs):
                raise SpecError(f"--join {f}: two joined job files named {name!r} (their outputs would collide)")
            self.jobs.append(Joined(f, out_dir / "joined" / name))

    def check(self, owner_job_id: str, owner_lora: bool, fleet: bool) -> None:
        """Before anything starts: a joined job is a LoRA job with its own id, joining a LoRA owner."""
        if not self.jobs:
            return
        if fleet:
            raise SpecError("--join with --fleet: join the fleet's own run instead")
        if not owner_lora:
            raise SpecError("--join: only a LoRA job's actors serve other jobs (model.lora not set here)")
        for j in self.jobs:
            job = load_job_file(j.job_file).get("job") or {}
            if not job.get("lora"):
                raise SpecError(f"--join {j.job_file}: only LoRA jobs (model.lora) share a fleet's actors")
            if job.get("job_id") == owner_job_id:
                raise SpecError(f"--join {j.job_file}: job.job_id {owner_job_id!r} is this run's own job's")

    def start(self) -> None:
        """Each joined job's ``rollart run --fleet`` in its own session (a terminal's Ctrl-C reaches it from here)."""
        env = {k: v for k, v in os.environ.items() if not k.startswith("ROLLART_")}
        argv0 = [sys.executable, "-m", "rollart.cli.main"]
        for j in self.jobs:
            j.out.mkdir(parents=True, exist_ok=True)
            with (j.out.parent / f"{j.name}.log").open("wb") as log:
                j.proc = subprocess.Popen(
                    [*argv0, "run", str(j.job_file), "--fleet", str(self.out_dir), "--out", str(j.out), "--quiet"],
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    env=env,
                    start_new_session=True,
                )
            self.say(f"joined           {j.name}: {j.job_file} on this fleet (log {j.out.parent / (j.name + '.log')})")
        self._write()

    def interrupt(self) -> None:
        # SIGTERM, not SIGINT: `rollart run` stops on SIGTERM from its first line, while a SIGINT that its parent's
        # shell ignored (a background job) stays ignored until the job's event loop takes it over.
        for j in self.jobs:
            if j.proc is not None and j.proc.poll() is None:
                j.proc.send_signal(signal.SIGTERM)

    async def wait(self, stop: asyncio.Event) -> None:
        """Until every joined job has ended; ``stop`` set meanwhile interrupts them (killed after the grace)."""
        running = [j for j in self.jobs if j.proc is not None]
        if not running:
            return
        if any(j.proc is not None and j.proc.poll() is None for j in running):
            self.say(f"fleet            waiting for the joined job(s) to end: {', '.join(j.name for j in running)}")
        deadline: float | None = None
        while any(j.proc is not None and j.proc.poll() is None for j in running):
            if stop.is_set() and deadline is None:
                self.interrupt()
                deadline = time.monotonic() + STOP_GRACE_SECONDS
            if deadline is not None and time.monotonic() > deadline:
                for j in running:
                    if j.proc is not None and j.proc.poll() is None:
                        j.proc.kill()
            await asyncio.sleep(0.5)
        for j in running:
            assert j.proc is not None
            j.exit = j.proc.returncode
            self.say(f"joined           {j.name}: exit {j.exit} (results in {j.out})")
        self._write()

    def failed(self) -> list[Joined]:
        return [j for j in self.jobs if j.exit not in (None, 0)]

    def summary(self) -> list[dict[str, Any]]:
        return [j.to_dict() for j in self.jobs]

    def _write(self) -> None:
        if self.jobs:
            (self.out_dir / "joined.json").write_text(json.dumps(self.summary(), indent=2) + "\n")
