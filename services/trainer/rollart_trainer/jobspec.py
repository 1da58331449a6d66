"""A trainer job's settings: the spec validated, with its mode's constraints applied (docs/trainer.md, "The
job"). A bad spec fails with a ``JobError`` naming the field."""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

from rollart.runtime import errors
from rollart.runtime.timeutil import seconds as _seconds
from rollart.v1 import common_pb2, trainer_pb2

from .config import TrainerConfig

T = trainer_pb2
SYNC, ONE_OFF, ASYNC, AREAL = T.STEP_MODE_SYNC, T.STEP_MODE_ONE_OFF, T.STEP_MODE_ASYNC, T.STEP_MODE_AREAL
DELTA, BUCKETS, FULL = T.WEIGHT_SYNC_MODE_DELTA, T.WEIGHT_SYNC_MODE_BUCKETS, T.WEIGHT_SYNC_MODE_FULL_CHECKPOINT


# The job spec's ``options`` that set the ledger's JobPolicy (docs/trainer.md, "The job"): counts, and durations in s.
LEDGER_NUMBERS = {"lease_ttl_multiplier": float, "max_lease_attempts": int, "buffer_capacity": int}
LEDGER_SECONDS = ("initial_lease_ttl", "min_lease_ttl", "max_lease_ttl", "actor_timeout")


class JobError(errors.Coded):
    """The job cannot go on; ``code`` is the gRPC status name reported by StartJob/GetJob (a
    ``runtime.errors.Coded`` error: raised from the servicer, the server's one mapper ends the call with it)."""


@dataclass
class Settings:
    """What the driver needs from a spec, validated and with the mode's constraints applied."""

    job_id: str
    mode: int
    alpha: int
    admission: common_pb2.AdmissionPolicy
    batch_size: int
    group_size: int
    redundancy: int
    max_steps: int
    weight_sync: int
    checkpoint_every_steps: int
    batch_timeout: float
    groups_per_step: int
    uniform_allocation: bool = False  # options[ledger.allocation] = uniform: the ledger splits batches evenly

    @classmethod
    def from_spec(cls, spec: T.TrainerJobSpec, cfg: TrainerConfig) -> Settings:
        def bad(msg: str) -> JobError:
            return JobError("INVALID_ARGUMENT", msg)

        if spec.job_id != cfg.job_id:
            raise JobError(
                "FAILED_PRECONDITION",
                f"this trainer publishes for job {cfg.job_id!r} (its relays and actors share that id and key); "
                f"the spec names {spec.job_id!r}",
            )
        if not spec.model:
            raise bad("spec.model is required (a checkpoint directory or a Hugging Face name)")
        if not (spec.endpoints.ledger or cfg.ledger):
            raise bad("no ledger endpoint: set spec.endpoints.ledger or the trainer's ledger config key")
        if spec.model.startswith(("/", "./", "../")) and not (Path(spec.model) / "config.json").is_file():
            raise bad(f"spec.model {spec.model} is not a checkpoint directory (no config.json)")
        if spec.batch_size < 1 or spec.group_size < 1:
            raise bad("batch_size and group_size must be >= 1")
        if spec.batch_size % spec.group_size:
            raise bad(f"batch_size ({spec.batch_size}) must be a multiple of group_size ({spec.group_size})")
        if spec.alpha < 0 or spec.redundancy < 0 or spec.max_steps < 0:
            raise bad("alpha, redundancy and max_steps must be >= 0")
        mode = spec.mode or ASYNC
        alpha = {SYNC: 0, ONE_OFF: 1}.get(mode, spec.alpha)
        admission = spec.admission or common_pb2.ADMISSION_POLICY_BOUNDED
        if mode == ONE_OFF:
            admission = common_pb2.ADMISSION_POLICY_BOUNDED  # trajectories may cross one version boundary
        if mode == AREAL:
            admission = common_pb2.ADMISSION_POLICY_AT_START  # staleness bounded at trajectory start only
        ws = spec.publish.weight_sync or DELTA
        if ws != DELTA and not spec.publish.checkpoint_store and ws == FULL:
            raise bad("weight_sync FULL_CHECKPOINT needs publish.checkpoint_store")
        timeout = _seconds(spec.batch_timeout) if spec.HasField("batch_timeout") else cfg.batch_timeout_seconds
        if timeout <= 0:
            raise bad("batch_timeout must be > 0")
        _check_ledger_options(spec.options, bad)
        allocation = spec.options.get("ledger.allocation", "proportional")
        if allocation not in ("proportional", "uniform"):
            raise bad(f"options[ledger.allocation] is {allocation!r}: proportional (by throughput) or uniform")
        return cls(
            job_id=spec.job_id,
            mode=mode,
            alpha=alpha,
            admission=admission,
            batch_size=spec.batch_size,
            group_size=spec.group_size,
            redundancy=spec.redundancy,
            max_steps=spec.max_steps,
            weight_sync=ws,
            checkpoint_every_steps=max(spec.checkpoint.every_steps, 1),
            batch_timeout=timeout,
            groups_per_step=spec.batch_size // spec.group_size,
            uniform_allocation=allocation == "uniform",
        )


def _check_ledger_options(options: Mapping[str, str], bad: Callable[[str], JobError]) -> None:
    """A ``ledger.*`` option that is unknown or not a positive number fails StartJob naming it (not the ledger's
    SetJobPolicy later, or a typo silently ignored)."""
    for key, raw in options.items():
        if not key.startswith("ledger.") or key == "ledger.allocation":
            continue
        name = key.removeprefix("ledger.")
        conv = LEDGER_NUMBERS.get(name) or (float if name in LEDGER_SECONDS else None)
        if conv is None:
            known = ["allocation", *LEDGER_NUMBERS, *LEDGER_SECONDS]
            raise bad(f"options[{key}] is not a ledger option (one of {', '.join('ledger.' + k for k in known)})")
        try:
            value = conv(raw)
            ok = 0 < value < math.inf
        except ValueError:
            ok = False
        if not ok:
            raise bad(f"options[{key}] is {raw!r}: a positive {'integer' if conv is int else 'number'}")
