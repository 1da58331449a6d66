"""Faults injected into a real run (`rollart run` of the FrozenLake example, scaled down) at chosen steps, and
what they cost: shared by tests/faults/test_chaos.py and `python -m bench faults`.

Faults (by name): ``redis`` (SIGKILL redis-server), ``envmanager`` (SIGKILL), ``hang-actor`` (SIGSTOP
``actor-2`` for :data:`HANG_SECONDS`, then SIGCONT), and any service name (SIGKILL it).
"""

from __future__ import annotations

import json
import os
import signal
import statistics
import threading
import time
from pathlib import Path
from typing import Any

from tests.e2e.jobs import cluster_state, finish, job_file, records, start, wait_for_step

HANG_SECONDS = 12.0  # longer than the proxy's hang bound (~6 s), shorter than the ledger's actor timeout (15 s)
HUNG_ACTOR = "actor-2"
START_SECONDS = 600.0  # budget of the cluster's start before the first step (not part of run.timeout)
# The ledger's score deadline for these runs (default 240 s): a sample the envmanager admitted but had not yet
# scored when it was SIGKILLed is failed and leased again after this, well inside the job's 120 s batch timeout
# (FrozenLake's rule-based rewards take milliseconds, so no legitimate scoring comes near it).
SCORE_DEADLINE_SECONDS = 30.0


def _pid(out: Path, name: str) -> int:
    state = cluster_state(out)
    if name in ("redis", "mooncake"):
        return int(state[name]["pid"])
    return int(state["services"][name]["pid"])


def inject(out: Path, fault: str) -> dict[str, Any]:
    """Injects ``fault`` now; returns what was done (the hang is undone in the background)."""
    at = time.time()
    if fault == "hang-actor":
        pid = _pid(out, HUNG_ACTOR)
        os.kill(pid, signal.SIGSTOP)

        def wake() -> None:
            time.sleep(HANG_SECONDS)
            try:
                os.kill(pid, signal.SIGCONT)
            except ProcessLookupError:
                pass

        threading.Thread(target=wake, daemon=True).start()
        return {"fault": fault, "process": HUNG_ACTOR, "pid": pid, "at": at, "seconds": HANG_SECONDS}
    pid = _pid(out, fault)
    os.kill(pid, signal.SIGKILL)
    return {"fault": fault, "process": fault, "pid": pid, "at": at}


def run(
    tmp: Path,
    schedule: list[tuple[int, str]],
    *,
    steps: int,
    batch: int = 16,
    timeout: float = 330.0,
    seed: int = 0,
) -> dict[str, Any]:
    """One run with ``schedule`` ([(after step, fault)]); returns code, summary, records, faults, wall time."""
    tmp.mkdir(parents=True, exist_ok=True)
    cfg = job_file(
        tmp,
        job={"max_steps": steps, "batch_size": batch, "seed": seed},
        run={"timeout": f"{timeout}s"},
        cluster={"actors": 2, "env": {"ledger": {"ROLLART_SCORE_DEADLINE_SECONDS": str(SCORE_DEADLINE_SECONDS)}}},
    )
    out = tmp / "out"
    t0 = time.time()
    proc = start(cfg, out)
    faults: list[dict[str, Any]] = []
    try:
        for i, (step, fault) in enumerate(schedule):
            # The first wait also covers the cluster's start (engines, model load): minutes on a busy host.
            wait_for_step(proc, out, step, timeout=timeout + (START_SECONDS if i == 0 else 0))
            faults.append(inject(out, fault) | {"after_step": step})
        code, summary = finish(proc, out, timeout=timeout + (60 if schedule else START_SECONDS + 60))
    finally:
        if proc.poll() is None:
            proc.terminate()
            proc.wait(60)
    recs = sorted(records(out), key=lambda r: r["step"])
    (out / "faults.json").write_text(json.dumps(faults, indent=2) + "\n")  # when each fault was injected
    return {
        "code": code,
        "summary": summary,
        "records": recs,
        "faults": faults,
        "out": out,
        "wall_seconds": time.time() - t0,
        "steps_seconds": (recs[-1]["finished_at"] - recs[0]["started_at"]) if recs else None,
    }


def recovery(result: dict[str, Any]) -> list[dict[str, Any]]:
    """For each fault: seconds from the fault to the next completed step, and that step's own time."""
    out = []
    for f in result["faults"]:
        after = [r for r in result["records"] if r.get("finished_at", 0) > f["at"]]
        nxt = min(after, key=lambda r: r["finished_at"]) if after else None
        out.append(
            {
                "fault": f["fault"],
                "after_step": f["after_step"],
                "to_next_step_seconds": round(nxt["finished_at"] - f["at"], 2) if nxt else None,
                "next_step": nxt["step"] if nxt else None,
                "next_step_seconds": round(nxt.get("step_seconds", 0.0), 2) if nxt else None,
            }
        )
    return out


def median(values: list[float]) -> float | None:
    return statistics.median(values) if values else None


# What the fault tests check of a finished run's summary (messages given: this module's asserts are not rewritten).
LEASE_STATES = ("active", "settled", "rejected", "expired", "cancelled", "released")


def check_settled_once(ledger: dict[str, Any], untrained: tuple[str, ...] = ("evicted", "failed")) -> None:
    """No trajectory settled twice; a slot settled again only as often as samples left the buffer untrained (the
    fates ``untrained``), which re-issues their slots by design."""
    assert ledger["settled_slots"] == ledger["settled_distinct_trajectories"], ledger
    acct = ledger.get("accounting", {})
    left_untrained = sum(int(acct.get(fate, {}).get("samples", 0)) for fate in untrained)
    assert ledger["settled_slots"] - ledger["settled_distinct_slots"] <= left_untrained, ledger


def check_accounting(ledger: dict[str, Any], settled_at_least: int) -> None:
    """check_settled_once, at least ``settled_at_least`` slots settled, the ledger's counters equal to its leases
    state by state, and nothing left reserved in the buffer."""
    check_settled_once(ledger)
    assert ledger["settled_slots"] >= settled_at_least, ledger
    counts, listed = ledger["lease_counts"], ledger["leases_listed"]
    for state in LEASE_STATES:
        assert int(counts.get(state, 0)) == listed.get(state, 0), (state, counts, listed)
    assert ledger["buffer_reserved"] == 0, ledger


def check_actors_on_last_version(final: dict[str, Any], steps: int, actors: int = 2) -> None:
    """Every version 0..steps published by the trainer, none failed, and the ``actors`` live actors on the last
    one with the trainer's hash."""
    versions = final["ledger"]["versions"]
    assert sorted(int(v) for v in versions) == list(range(steps + 1)), versions
    assert final["trainer"]["published"] == versions and final["trainer"]["failed_publications"] == 0, final["trainer"]
    live = {a: s for a, s in final["actors"].items() if s["liveness"] == "ALIVE"}
    assert len(live) == actors, final["actors"]
    for state in live.values():
        assert state["active_version"] == steps and state["active_hash"] == versions[str(steps)], (state, versions)
