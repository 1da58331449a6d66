"""The driver's side of training checkpoints: what a step saves, and what a restarted trainer reads back (the
newest checkpoint, the published weights that are the next delta's base, when the step first started, the
metrics history). The checkpoint of step s is written before v_s is published (docs/trainer.md, "Restarts")."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from pathlib import Path
from typing import Any

from rollart.delta import WeightSet
from rollart.job.metrics import from_record, read_records
from rollart.runtime.telemetry import log_fields
from rollart.v1 import trainer_pb2

from .checkpoint import CheckpointManager, CheckpointRecord, TrainerState
from .jobspec import JobError

log = logging.getLogger(__name__)

T = trainer_pb2


async def restore(
    ckpt: CheckpointManager, backend: Any, job_id: str
) -> tuple[TrainerState, CheckpointRecord, WeightSet | None] | None:
    """Load the newest checkpoint into ``backend``: (state, its record, the published weights it holds), or
    None when there is none."""
    restored = await asyncio.to_thread(ckpt.restore_latest, backend)
    if restored is None:
        return None
    state, rec = restored
    if state.job_id and state.job_id != job_id:
        raise JobError("FAILED_PRECONDITION", f"checkpoint {rec.checkpoint_id} belongs to job {state.job_id!r}")
    prev: WeightSet | None = None
    pub = ckpt.published_weights(rec)
    if pub is not None:
        prev = pub.copy()  # out of the memory map: the checkpoint may be pruned later
    log.info("resumed", extra=log_fields(checkpoint=rec.checkpoint_id, step=state.step))
    return state, rec, prev


async def save(
    ckpt: CheckpointManager,
    backend: Any,
    state: TrainerState,
    *,
    published: WeightSet | None,
    weights_only: bool = False,
) -> CheckpointRecord | None:
    """Save in a thread (the event loop keeps serving); ``published``: the bf16 weights of the newest
    published version, the base of the next delta after a restart."""
    return await asyncio.to_thread(ckpt.save, backend, state, weights_only=weights_only, published=published)


def step_started(root: Path, job_id: str, s: int) -> tuple[float, int]:
    """(wall time step ``s`` first started, restarts since): kept in ``<root>/step-start.json``, written when a
    step starts, so a trainer restarted mid-step reports the step from its first start."""
    path = root / "step-start.json"
    try:
        kept = json.loads(path.read_text())
    except (OSError, ValueError):
        kept = {}
    if kept.get("job_id") == job_id and kept.get("step") == s:
        first, restarts = float(kept["started_at"]), int(kept.get("restarts", 0)) + 1
    else:
        first, restarts = time.time(), 0
    with contextlib.suppress(OSError):
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps({"job_id": job_id, "step": s, "started_at": first, "restarts": restarts}))
        tmp.replace(path)
    return first, restarts


def metrics_history(metrics_path: str, state: TrainerState) -> tuple[list[T.StepMetrics], T.StepMetrics | None]:
    """The steps up to the checkpoint's from the metrics file, and the checkpoint's own step's metrics when the
    file lost them (a kill between the checkpoint and the line)."""
    kept: list[T.StepMetrics] = []
    for rec in read_records(metrics_path) if metrics_path else ():
        with contextlib.suppress(Exception):
            m = from_record(rec)
            if m.step <= state.step:
                kept.append(m)
    saved = state.extra.get("metrics")
    if saved and state.step and all(m.step != state.step for m in kept):
        m = from_record(saved)
        if m.step == state.step:
            return kept, m
    return kept, None
