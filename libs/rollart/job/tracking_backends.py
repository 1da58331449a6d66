"""Experiment tracking's backends: TensorBoard (its own event-file writer), W&B and MLflow, each behind
:class:`Backend`; and the samples table they share. rollart.job.tracking's Tracker starts and feeds them."""

from __future__ import annotations

import importlib
import os
import re
import secrets
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from .tracking_settings import MlflowSettings, WandbSettings


class Backend:
    """One tracking library. ``start`` raises when it cannot start; the tracker then drops it."""

    name = ""

    def start(self, state: dict[str, Any]) -> None:
        raise NotImplementedError

    def log(self, step: int, values: dict[str, float], wall_time: float) -> None:
        raise NotImplementedError

    def samples(self, step: int, rows: list[dict[str, Any]]) -> None:
        raise NotImplementedError

    def validation(self, step: int, values: dict[str, float], wall_time: float) -> None:
        """Validation figures at the step they evaluated (which may come after later steps' metrics)."""
        self.log(step, values, wall_time)

    def close(self, ok: bool) -> None:
        raise NotImplementedError


class TensorBoardBackend(Backend):
    """Event files in ``<out>/tb`` written with TensorBoard's own event-file writer (no TensorFlow, no torch)."""

    name = "tensorboard"

    def __init__(self, logdir: Path) -> None:
        self.logdir = logdir
        self.writer: Any = None

    def start(self, state: dict[str, Any]) -> None:
        writer = importlib.import_module("tensorboard.summary.writer.event_file_writer")
        self.pb = importlib.import_module("tensorboard.compat.proto.event_pb2")
        self.spb = importlib.import_module("tensorboard.compat.proto.summary_pb2")
        self.tpb = importlib.import_module("tensorboard.compat.proto.tensor_pb2")
        self.types = importlib.import_module("tensorboard.compat.proto.types_pb2")
        self.text_meta = importlib.import_module("tensorboard.plugins.text.metadata")
        self.logdir.mkdir(parents=True, exist_ok=True)
        # A resumed run appends a new event file to the same folder: TensorBoard reads them as one run.
        self.writer = writer.EventFileWriter(str(self.logdir), flush_secs=10)

    def log(self, step: int, values: dict[str, float], wall_time: float) -> None:
        value = [self.spb.Summary.Value(tag=k, simple_value=v) for k, v in values.items()]
        self.writer.add_event(self.pb.Event(wall_time=wall_time, step=step, summary=self.spb.Summary(value=value)))
        self.writer.flush()

    def samples(self, step: int, rows: list[dict[str, Any]]) -> None:
        md = self.text_meta.create_summary_metadata("", "")
        by_task: dict[str, list[str]] = {}
        for row in rows:
            by_task.setdefault(str(row.get("task", "")), []).append(markdown(row))
        value = []
        for task, texts in sorted(by_task.items()):
            tensor = self.tpb.TensorProto(dtype=self.types.DT_STRING, string_val=["\n\n---\n\n".join(texts).encode()])
            value.append(self.spb.Summary.Value(tag=f"samples/{task or 'default'}", metadata=md, tensor=tensor))
        self.writer.add_event(self.pb.Event(wall_time=time.time(), step=step, summary=self.spb.Summary(value=value)))
        self.writer.flush()

    def close(self, ok: bool) -> None:
        if self.writer is not None:
            self.writer.close()


class WandbBackend(Backend):
    """A W&B run: offline (``<out>/wandb/offline-run-*``, uploaded later with ``wandb sync``) unless online."""

    name = "wandb"

    def __init__(self, s: WandbSettings, out: Path, job_id: str, config: dict[str, Any]) -> None:
        self.s = s
        self.out = out
        self.job_id = job_id
        self.config = config
        self.run: Any = None
        self.step = 0

    def start(self, state: dict[str, Any]) -> None:
        if self.s.mode == "offline":
            os.environ["WANDB_MODE"] = "offline"  # nothing may reach the network unless the job file says online
        wandb = importlib.import_module("wandb")
        self.wandb = wandb
        run_id = self.s.id or state.get("wandb", {}).get("id") or secrets.token_hex(4)
        self.run = wandb.init(
            project=self.s.project,
            entity=self.s.entity or None,
            name=self.s.name or self.job_id,
            tags=self.s.tags or None,
            group=self.s.group or None,
            notes=self.s.notes or None,
            id=run_id,
            resume="allow",
            mode=self.s.mode,
            dir=str(self.out),
            config=self.config,
            # The run's own console and the system monitor would compete with the job for 2 cores.
            settings=wandb.Settings(console="off", x_disable_stats=True, silent=True),
        )
        # Validation arrives after later steps: its charts use its own x-axis (W&B refuses steps that go back).
        self.run.define_metric("val/step")
        self.run.define_metric("val/*", step_metric="val/step")
        state["wandb"] = {"id": run_id, "dir": str(self.run.dir), "mode": self.s.mode}

    def log(self, step: int, values: dict[str, float], wall_time: float) -> None:
        self.run.log(values, step=step)
        self.step = max(self.step, step)

    def validation(self, step: int, values: dict[str, float], wall_time: float) -> None:
        self.run.log({**values, "val/step": step}, step=max(step, self.step))

    def samples(self, step: int, rows: list[dict[str, Any]]) -> None:
        cols, data = table(rows)
        # W&B drops what is logged below its current step: samples read after their step's metrics go to that
        # row (the table's step column keeps their own step).
        self.run.log({"samples": self.wandb.Table(columns=cols, data=data)}, step=max(step, self.step))

    def close(self, ok: bool) -> None:
        if self.run is not None:
            self.run.finish(exit_code=0 if ok else 1)


def _mlflow_name(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9_\-. :/]", "_", name)  # the characters MLflow accepts in a metric name


class MlflowBackend(Backend):
    """An MLflow run in a file store (``<out>/mlruns``) unless a tracking URI is configured."""

    name = "mlflow"

    def __init__(self, s: MlflowSettings, out: Path, job_id: str, params: dict[str, str]) -> None:
        self.s = s
        self.out = out
        self.job_id = job_id
        self.params = params
        self.client: Any = None
        self.run_id = ""

    def uri(self) -> str:
        return self.s.tracking_uri or (self.out / "mlruns").resolve().as_uri()

    def start(self, state: dict[str, Any]) -> None:
        uri = self.uri()
        if uri.startswith("file:") or "://" not in uri:
            # MLflow 3 keeps the file store in maintenance mode behind this switch; a local folder needs no server.
            os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")
        tracking = importlib.import_module("mlflow.tracking")
        self.entities = importlib.import_module("mlflow.entities")
        self.client = tracking.MlflowClient(tracking_uri=uri)
        run_id = self.s.run_id or state.get("mlflow", {}).get("run_id", "")
        if run_id:
            run = self.client.get_run(run_id)  # raises when the store does not have it
            self.client.update_run(run_id, status="RUNNING")
        else:
            name = self.s.experiment or self.job_id or "rollart"
            exp = self.client.get_experiment_by_name(name)
            exp_id = exp.experiment_id if exp is not None else self.client.create_experiment(name)
            run = self.client.create_run(exp_id, run_name=self.s.run_name or self.job_id, tags=self.s.tags)
            run_id = run.info.run_id
            params = [self.entities.Param(_mlflow_name(k)[:250], v[:6000]) for k, v in sorted(self.params.items())]
            for i in range(0, len(params), 100):
                self.client.log_batch(run_id, params=params[i : i + 100])
        self.run_id = run_id
        state["mlflow"] = {"run_id": run_id, "tracking_uri": uri, "experiment_id": run.info.experiment_id}

    def log(self, step: int, values: dict[str, float], wall_time: float) -> None:
        ts = int(wall_time * 1000)
        metrics = [self.entities.Metric(_mlflow_name(k), v, ts, step) for k, v in values.items()]
        for i in range(0, len(metrics), 1000):
            self.client.log_batch(self.run_id, metrics=metrics[i : i + 1000])

    def samples(self, step: int, rows: list[dict[str, Any]]) -> None:
        cols, data = table(rows)
        # MLflow's table artifact layout (columns + data), without the pandas that log_table needs.
        self.client.log_dict(self.run_id, {"columns": cols, "data": data}, f"samples/step_{step:06d}.json")

    def close(self, ok: bool) -> None:
        if self.client is not None and self.run_id:
            self.client.set_terminated(self.run_id, status="FINISHED" if ok else "KILLED")


# ---------------------------------------------------------------------------------------------- samples

COLUMNS = ["step", "task", "reward", "version", "staleness", "turns", "prompt", "conversation", "trajectory_id"]


def conversation(row: Mapping[str, Any]) -> str:
    """The turns of a sample as plain text (observation, then the policy's action)."""
    parts = []
    for i, t in enumerate(row.get("turns") or []):
        parts.append(f"[{i}] env: {t.get('observation', '')}\n[{i}] policy: {t.get('action', '')}")
    return "\n".join(parts)


def table(rows: list[dict[str, Any]]) -> tuple[list[str], list[list[Any]]]:
    data = [
        [
            r.get("step"),
            r.get("task", ""),
            r.get("reward"),
            r.get("version"),
            r.get("staleness"),
            len(r.get("turns") or []),
            r.get("prompt", ""),
            conversation(r),
            r.get("trajectory_id", ""),
        ]
        for r in rows
    ]
    return list(COLUMNS), data


def markdown(row: Mapping[str, Any]) -> str:
    head = (
        f"**{row.get('task', '')}** reward {row.get('reward')} · version {row.get('version')} · "
        f"staleness {row.get('staleness')} · {len(row.get('turns') or [])} turns · `{row.get('trajectory_id', '')}`"
    )
    body = "\n\n".join(
        f"*env:* `{_md(t.get('observation', ''))}`\n\n*policy:* `{_md(t.get('action', ''))}`"
        for t in row.get("turns") or []
    )
    return head + "\n\n" + body


def _md(text: str) -> str:
    return " ".join(str(text).replace("`", "'").split())
