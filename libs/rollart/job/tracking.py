"""Experiment tracking: every step's metrics and sampled trajectories to TensorBoard, W&B and MLflow.

The job file's ``tracking`` section (rollart.job.tracking_settings) picks the backends: TensorBoard is on by default
(``<out>/tb``), W&B (offline unless ``mode: online``) and MLflow (a file store in ``<out>/mlruns`` unless a
``tracking_uri``) when their sub-section is given. :class:`Tracker` is the one call site the run loop feeds:
:meth:`Tracker.log_step` with a metrics.jsonl record, :meth:`Tracker.log_samples` with sampled trajectories
(rollart.job.samples). A backend that fails to start or to log says so in one line naming itself and the
run goes on with the others (the backends: rollart.job.tracking_backends). The names every backend gets are
rollart.job.tracking_names' ``metric_names`` (docs/tracking.md). The names below are importable from here.

Resume: ``<out>/tracking.json`` keeps the last step logged and the W&B and MLflow run ids, so a resumed run
continues the same runs (and the same TensorBoard folder) without logging a step twice.
"""

from __future__ import annotations

import contextlib
import json
import shutil
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from .tracking_backends import Backend, MlflowBackend, TensorBoardBackend, WandbBackend
from .tracking_names import EXTRA, FIELDS, metric_names, validation_names
from .tracking_settings import MlflowSettings, TrackingSettings, WandbSettings, sample_step, settings

__all__ = [
    "EXTRA", "FIELDS", "SAMPLES_FILE", "STATE_FILE", "MlflowSettings", "RunTracking", "Tracker",
    "TrackingSettings", "WandbSettings", "metric_names", "sample_step", "settings", "validation_names",
]

STATE_FILE = "tracking.json"
SAMPLES_FILE = "samples.jsonl"


# ---------------------------------------------------------------------------------------------- tracker


def _flat_params(data: Mapping[str, Any], prefix: str = "") -> dict[str, str]:
    out: dict[str, str] = {}
    for k, v in data.items():
        key = f"{prefix}.{k}" if prefix else str(k)
        if isinstance(v, Mapping):
            out.update(_flat_params(v, key))
        else:
            out[key] = json.dumps(v) if not isinstance(v, str) else v
    return out


class Tracker:
    """Feeds every configured backend from one place; ``<out>/tracking.json`` carries the resume state."""

    def __init__(
        self,
        s: TrackingSettings,
        out: Path,
        job_id: str,
        job_data: Mapping[str, Any] | None = None,
        *,
        fresh: bool = True,
        log: Callable[[str], None] = print,
    ) -> None:
        self.s = s
        self.out = out
        self.job_id = job_id
        self.job_data = dict(job_data or {})
        self.fresh = fresh
        self.say = log
        self.backends: list[Backend] = []
        self.state: dict[str, Any] = {}
        self.last_step = 0

    @property
    def state_path(self) -> Path:
        return self.out / STATE_FILE

    def _candidates(self) -> list[Backend]:
        out: list[Backend] = []
        if self.s.tensorboard:
            out.append(TensorBoardBackend(self.out / "tb"))
        if self.s.wandb is not None:
            out.append(WandbBackend(self.s.wandb, self.out, self.job_id, self.job_data))
        if self.s.mlflow is not None:
            params = _flat_params(self.job_data.get("job") or {})
            out.append(MlflowBackend(self.s.mlflow, self.out, self.job_id, params))
        return out

    def start(self) -> list[str]:
        """Start every backend (a fresh run first clears the previous one's TensorBoard folder, samples and
        resume state; W&B and MLflow keep their earlier runs beside the new one). Returns the started names."""
        self.out.mkdir(parents=True, exist_ok=True)
        if self.fresh:
            self.clear()
        elif self.state_path.is_file():
            try:
                self.state = json.loads(self.state_path.read_text())
            except ValueError:
                self.say(f"tracking         {self.state_path} is not JSON: starting new tracking runs")
                self.state = {}
        self.last_step = int(self.state.get("last_step", 0))
        for b in self._candidates():
            try:
                b.start(self.state)
            except Exception as exc:  # any library error: the run goes on without this backend
                self.say(f"tracking         {b.name} did not start ({_line(exc)}); going on without it")
                continue
            self.backends.append(b)
        self._save()
        if self.backends:
            self.say(f"tracking         {', '.join(self._describe(b) for b in self.backends)}")
        return [b.name for b in self.backends]

    def clear(self) -> None:
        """A fresh run's start: the previous run's TensorBoard folder, samples and resume state go (only on a
        fresh run: a resumed run with tracking off keeps them for the next resume with it on)."""
        if self.fresh:
            shutil.rmtree(self.out / "tb", ignore_errors=True)
            for name in (STATE_FILE, SAMPLES_FILE):
                (self.out / name).unlink(missing_ok=True)

    def _describe(self, b: Backend) -> str:
        if isinstance(b, TensorBoardBackend):
            return f"tensorboard {b.logdir}"
        if isinstance(b, WandbBackend):
            return f"wandb {b.s.mode} run {self.state.get('wandb', {}).get('id')}"
        if isinstance(b, MlflowBackend):
            return f"mlflow run {b.run_id} at {b.uri()}"
        return b.name

    def _save(self) -> None:
        self.state["last_step"] = self.last_step
        tmp = self.state_path.with_suffix(".tmp")
        tmp.write_text(json.dumps(self.state, indent=2, sort_keys=True) + "\n")
        tmp.replace(self.state_path)

    def _each(self, what: str, call: Callable[[Backend], None]) -> None:
        for b in list(self.backends):
            try:
                call(b)
            except Exception as exc:
                self.say(f"tracking         {b.name} failed to log {what} ({_line(exc)}); dropped")
                self.backends.remove(b)
                with contextlib.suppress(Exception):
                    b.close(ok=False)

    def log_step(self, record: Mapping[str, Any]) -> bool:
        """Log one metrics.jsonl record; False (nothing logged) when its step was logged before (a resume)."""
        step = int(record.get("step", 0))
        if step <= self.last_step:
            return False
        values = metric_names(record)
        wall = float(record.get("finished_at") or 0.0) or time.time()
        self._each(f"step {step}", lambda b: b.log(step, values, wall))
        self.last_step = step
        self._save()
        return True

    def log_validation(self, rec: Mapping[str, Any]) -> bool:
        """Log one validation record at its ``eval_step``; False when that task's step was logged before."""
        task = str(rec.get("task") or "default")
        step = int(rec.get("eval_step", 0))
        logged = self.state.setdefault("validation", {})
        if step <= int(logged.get(task, -1)):
            return False
        values = validation_names(rec)
        wall = float(rec.get("finished_at") or 0.0) or time.time()
        self._each(f"validation of step {step}", lambda b: b.validation(step, values, wall))
        logged[task] = step
        self._save()
        return True

    def log_samples(self, step: int, rows: list[dict[str, Any]]) -> None:
        """Sampled trajectories of ``step``: ``<out>/samples.jsonl`` and a table (text) in every backend."""
        if not rows:
            return
        with (self.out / SAMPLES_FILE).open("a") as fh:
            for row in rows:
                fh.write(json.dumps(row, sort_keys=True) + "\n")
        self._each(f"samples of step {step}", lambda b: b.samples(step, rows))

    def close(self, ok: bool = True) -> None:
        for b in self.backends:
            with contextlib.suppress(Exception):
                b.close(ok)
        self.backends = []


def _line(exc: BaseException) -> str:
    return f"{type(exc).__name__}: " + " ".join(str(exc).split())[:300]


# ------------------------------------------------------------------------------------------- rollart run


class RunTracking:
    """What ``rollart run`` calls: settings checked before the cluster starts, then the Prometheus targets of
    its cluster, the tracker, and each trainer event (step metrics; rollout samples of sampled steps)."""

    # Phases of step s that come after its batch was formed and before the trainer acknowledges it.
    SAMPLE_PHASES = ("STEP_PHASE_SUSPEND", "STEP_PHASE_TRAIN", "STEP_PHASE_CHECKPOINT")

    def __init__(
        self, data: Mapping[str, Any], out: Path, job_id: str, *, fresh: bool, say: Callable[[str], None]
    ) -> None:
        self.s = settings(data)
        self.data = data
        self.out = out
        self.job_id = job_id
        self.fresh = fresh
        self.say = say
        self.tracker: Tracker | None = None
        self.state_dir: Path | None = None
        self.ledger = ""
        self.token = ""
        self.batch_size = 0
        self.asked: set[int] = set()
        self.metrics_offset = 0  # validation lines of metrics.jsonl read so far (rollart.job.evaluation)
        # Seconds the run's loop spent in the tracker (start, events, close): tracking.json's loop_seconds.
        self.loop_seconds = 0.0

    def start(self, state_dir: Path, state: dict[str, Any], token: str, batch_size: int) -> None:
        from . import monitoring

        self.state_dir, self.token, self.batch_size = state_dir, token, batch_size
        self.ledger = state.get("services", {}).get("ledger", {}).get("address", "")
        try:  # any Prometheus can scrape the run's cluster from these (docs/tracking.md)
            monitoring.write_targets(state_dir, state)
            monitoring.write_config(state_dir)
            if self.s.prometheus:
                prom = monitoring.start(state_dir)
                self.say(f"prometheus       {prom['url']} (targets {monitoring.folder(state_dir) / 'targets.json'})")
        except Exception as exc:
            self.say(f"prometheus       did not start ({_line(exc)}); going on without it")
        tracker = Tracker(self.s, self.out, self.job_id, self.data, fresh=self.fresh, log=self.say)
        if not self.s.enabled:  # tracking: false: nothing started or written (a fresh run still clears the old)
            tracker.clear()
            self.say("tracking         off (tracking: false)")
            return
        t0 = time.perf_counter()
        self.tracker = tracker
        self.tracker.start()
        self.loop_seconds += time.perf_counter() - t0

    async def on_event(self, ev: Any) -> None:
        """A TrainerEvent of WatchJob: never raises (tracking must not stop the run's watch)."""
        if self.tracker is None:
            return
        kind = ev.WhichOneof("event")
        t0 = time.perf_counter()
        try:
            if kind == "step_finished":
                from .metrics import to_record

                self.tracker.log_step(to_record(ev.step_finished))
            elif kind == "phase":
                await self._sample(ev.phase.step, ev.phase.phase)
            self._validation()
        except Exception as exc:
            self.say(f"tracking         {kind} event not tracked ({_line(exc)})")
        self.loop_seconds += time.perf_counter() - t0

    def _validation(self) -> None:
        """Validation records appended to metrics.jsonl since the last look (whole lines only)."""
        path = self.out / "metrics.jsonl"
        if self.tracker is None or not path.is_file():
            return
        with path.open("rb") as fh:
            fh.seek(self.metrics_offset)
            chunk = fh.read()
        end = chunk.rfind(b"\n") + 1
        self.metrics_offset += end
        for line in chunk[:end].splitlines():
            try:
                rec = json.loads(line)
            except ValueError:
                continue
            if isinstance(rec, dict) and rec.get("kind") == "validation" and "eval_step" in rec:
                self.tracker.log_validation(rec)

    async def _sample(self, step: int, phase: int) -> None:
        from rollart.v1 import trainer_pb2

        from . import samples

        name = trainer_pb2.StepPhase.Name(phase) if phase in trainer_pb2.StepPhase.values() else ""
        if name not in self.SAMPLE_PHASES or step in self.asked or not sample_step(self.s, step) or not self.ledger:
            return
        if self.tracker is None or step <= self.tracker.last_step:  # a resumed run's steps logged before
            return
        self.asked.add(step)
        batch = await samples.read_batch(self.ledger, self.token, step, self.batch_size)
        if batch is None:
            self.say(f"tracking         step {step}: its batch was acknowledged before it could be sampled")
            return
        self.tracker.log_samples(step, samples.rows(batch, step, self.s.samples_per_task, self.s.samples_max_chars))

    def close(self, ok: bool) -> None:
        if self.tracker is not None:
            t0 = time.perf_counter()
            with contextlib.suppress(Exception):
                self._validation()  # the evaluation after the last step
            self.tracker.close(ok)
            self.loop_seconds += time.perf_counter() - t0
            self.tracker.state["loop_seconds"] = round(self.loop_seconds, 3)
            with contextlib.suppress(OSError):
                self.tracker._save()
            self.tracker = None

    def stop(self) -> None:
        """Stop the run's Prometheus (teardown; nothing when none was started)."""
        from . import monitoring

        if self.state_dir is not None and not monitoring.stop(self.state_dir):
            self.say("prometheus       STILL RUNNING")
