"""The tracking backends written for real and read back with each library's own reader: TensorBoard's
EventAccumulator, the W&B offline run (its .wandb records through W&B's own protobuf schema, and `wandb sync
--dry-run` finding it), MLflow's client on the file store. A resumed tracker continues the same runs without a
duplicated step; a backend that cannot start is named and the others go on."""

from __future__ import annotations

import json
import os
import struct
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from rollart.job.tracking import STATE_FILE, Tracker, settings

pytest.importorskip("tensorboard")
pytest.importorskip("wandb")
pytest.importorskip("mlflow")

BIN = Path(sys.executable).parent


def _record(step: int) -> dict[str, Any]:
    return {
        "step": step,
        "reward_mean": step / 10,
        "entropy": 1.0 + step,
        "step_seconds": 2.0,
        "samples": 32,
        "finished_at": 1_700_000_000.0 + step,
        "tasks": {"frozenlake": {"reward_mean": step / 10, "samples": 32}},
        "eval": {"frozenlake": {"mean@4": step / 20}},
    }


def _val(step: int) -> dict[str, Any]:
    """A validation line of metrics.jsonl as rollart.job.evaluation writes it."""
    return {"kind": "validation", "eval_step": step, "task": "frozenlake", "score": step / 8, "n": 4,
            "mean_at_n": step / 8, "pass_at_n": 0.5, "tokens_generated": 100, "eval_seconds": 2.0, "failed": False,
            "finished_at": 1_700_000_000.5 + step}


def _row(step: int) -> dict[str, Any]:
    return {"step": step, "task": "frozenlake", "reward": 1.0, "version": step - 1, "staleness": 0,
            "trajectory_id": f"t{step}", "prompt": "S F F", "turns": [{"observation": "S F F", "action": "right"}]}


def _tracker(out: Path, fresh: bool, lines: list[str], **extra: Any) -> Tracker:
    section = {"wandb": {"project": "rollart-test", "tags": ["unit"]}, "mlflow": True, **extra}
    return Tracker(settings({"tracking": section}), out, "frozenlake", {"job": {"job_id": "frozenlake", "alpha": 1}},
                   fresh=fresh, log=lines.append)


def tb_scalars(logdir: Path) -> dict[str, list[tuple[int, float]]]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    ea = EventAccumulator(str(logdir), size_guidance={"scalars": 0, "tensors": 0})
    ea.Reload()
    return {tag: [(e.step, e.value) for e in ea.Scalars(tag)] for tag in ea.Tags()["scalars"]}


def tb_text(logdir: Path, tag: str) -> list[tuple[int, str]]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    ea = EventAccumulator(str(logdir), size_guidance={"tensors": 0})
    ea.Reload()
    return [(e.step, e.tensor_proto.string_val[0].decode()) for e in ea.Tensors(tag)]


def wandb_records(path: Path) -> list[Any]:
    """The records of a .wandb file: W&B's header (":W&B", magic, version) then the LevelDB log format (32 KiB
    blocks of chunks: CRC, length, type), each record a wandb_internal_pb2.Record."""
    from wandb.proto import wandb_internal_pb2 as pb

    data = path.read_bytes()
    assert data[:4] == b":W&B"
    out, pending, pos, block = [], b"", 7, 32768
    while pos + 7 <= len(data):
        left = block - pos % block
        if left < 7:  # a block's tail too short for a header is padding
            pos += left
            continue
        _crc, length, kind = struct.unpack("<IHB", data[pos : pos + 7])
        if kind == 0 and length == 0:
            pos += left
            continue
        chunk = data[pos + 7 : pos + 7 + length]
        pos += 7 + length
        pending = chunk if kind in (1, 2) else pending + chunk
        if kind in (1, 4):  # FULL or LAST: a whole record
            r = pb.Record()
            r.ParseFromString(pending)
            out.append(r)
            pending = b""
    return out


def wandb_history(out: Path) -> tuple[set[str], list[tuple[int, dict[str, Any]]]]:
    """(run ids, [(step, {key: value})]) over every offline run directory of ``out``."""
    ids, history = set(), []
    for f in sorted((out / "wandb").glob("offline-run-*/run-*.wandb")):
        for r in wandb_records(f):
            kind = r.WhichOneof("record_type")
            if kind == "run":
                ids.add(r.run.run_id)
            elif kind == "history":
                # A metric name is one key ("reward/mean"); a logged table is flattened below its name.
                items = {i.key or "/".join(i.nested_key): json.loads(i.value_json) for i in r.history.item}
                history.append((r.history.step.num, items))
    return ids, history


def mlflow_client(out: Path) -> Any:
    os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")
    from mlflow.tracking import MlflowClient

    return MlflowClient(tracking_uri=(out / "mlruns").resolve().as_uri())


def test_every_backend_writes_what_its_reader_reads_back_and_resume_adds_no_duplicate(tmp_path: Path):
    out = tmp_path / "runs" / "frozenlake"
    lines: list[str] = []
    t = _tracker(out, fresh=True, lines=lines)
    assert t.start() == ["tensorboard", "wandb", "mlflow"], lines
    assert t.log_validation(_val(0))  # the evaluation before training
    for s in (1, 2, 3):
        assert t.log_step(_record(s))
        if s == 2:
            assert t.log_validation(_val(2))
    t.log_samples(1, [_row(1)])  # samples read after later steps' metrics
    t.close()
    state = json.loads((out / STATE_FILE).read_text())
    assert state["last_step"] == 3 and state["wandb"]["mode"] == "offline"

    # A resumed run: the trainer's event stream starts again at step 1; steps 1-3 are not logged twice.
    t = _tracker(out, fresh=False, lines=lines)
    t.start()
    assert [t.log_step(_record(s)) for s in (1, 2, 3, 4, 5)] == [False, False, False, True, True]
    t.log_samples(5, [_row(5)])
    assert [t.log_validation(_val(s)) for s in (0, 2, 4)] == [False, False, True]  # 4 finishes after step 5
    t.close()

    scalars = tb_scalars(out / "tb")
    assert scalars["reward/mean"] == [(s, pytest.approx(s / 10)) for s in (1, 2, 3, 4, 5)]
    assert {"train/entropy", "timing_s/step", "perf/samples_per_s", "task/frozenlake/reward_mean",
            "val/frozenlake/mean@4"} <= set(scalars)
    assert scalars["val/frozenlake/score"] == [(s, pytest.approx(s / 8)) for s in (0, 2, 4)]
    assert [s for s, _ in scalars["val/frozenlake/pass@4"]] == [0, 2, 4]
    text = tb_text(out / "tb", "samples/frozenlake")
    assert [s for s, _ in text] == [1, 5] and "right" in text[0][1]

    ids, history = wandb_history(out)
    assert ids == {state["wandb"]["id"]}  # the resumed run is the same W&B run
    steps = [s for s, items in history if "reward/mean" in items]
    assert steps == [1, 2, 3, 4, 5]
    assert any(items.get("samples/_type") == "table-file" for _, items in history)
    # Validation on its own x-axis (val/step), each evaluated step once.
    assert [items["val/step"] for _, items in history if "val/frozenlake/score" in items] == [0, 2, 4]
    tables = list((out / "wandb").glob("offline-run-*/files/media/table/*.table.json"))
    assert tables and "right" in tables[0].read_text()
    dry = subprocess.run([str(BIN / "wandb"), "sync", "--dry-run", str(out / "wandb")], capture_output=True,
                         text=True, env={**os.environ, "WANDB_MODE": "offline"})
    assert state["wandb"]["id"] in dry.stdout + dry.stderr

    client = mlflow_client(out)
    run = client.get_run(state["mlflow"]["run_id"])
    assert run.info.status == "FINISHED" and run.data.params["alpha"] == "1"
    history_ml = client.get_metric_history(run.info.run_id, "reward/mean")
    assert sorted(m.step for m in history_ml) == [1, 2, 3, 4, 5]
    assert "val/frozenlake/mean_4" in run.data.metrics  # '@' is not allowed in an MLflow name
    assert sorted(m.step for m in client.get_metric_history(run.info.run_id, "val/frozenlake/score")) == [0, 2, 4]
    exp = client.get_experiment(run.info.experiment_id)
    assert exp.name == "frozenlake" and len(client.search_runs([exp.experiment_id])) == 1
    arts = {a.path for a in client.list_artifacts(run.info.run_id, "samples")}
    assert arts == {"samples/step_000001.json", "samples/step_000005.json"}

    samples = [json.loads(x) for x in (out / "samples.jsonl").read_text().splitlines()]
    assert [r["step"] for r in samples] == [1, 5]


def test_a_fresh_run_starts_new_runs_beside_the_old_ones(tmp_path: Path):
    out = tmp_path / "run"
    lines: list[str] = []
    t = _tracker(out, fresh=True, lines=lines)
    t.start()
    t.log_step(_record(1))
    t.close()
    first = json.loads((out / STATE_FILE).read_text())
    t = _tracker(out, fresh=True, lines=lines)
    t.start()
    t.log_step(_record(1))
    t.close()
    second = json.loads((out / STATE_FILE).read_text())
    assert first["wandb"]["id"] != second["wandb"]["id"]
    assert first["mlflow"]["run_id"] != second["mlflow"]["run_id"]
    assert tb_scalars(out / "tb")["reward/mean"] == [(1, pytest.approx(0.1))]  # the old folder was cleared
    client = mlflow_client(out)
    assert len(client.search_runs([second["mlflow"]["experiment_id"]])) == 2


def test_a_backend_that_cannot_start_is_named_and_the_others_go_on(tmp_path: Path):
    lines: list[str] = []
    t = _tracker(tmp_path, fresh=True, lines=lines, mlflow={"run_id": "doesnotexist"})
    assert t.start() == ["tensorboard", "wandb"]
    assert any(line.split()[:3] == ["tracking", "mlflow", "did"] for line in lines), lines
    assert t.log_step(_record(1))
    t.close()
    assert tb_scalars(tmp_path / "tb")["reward/mean"] == [(1, pytest.approx(0.1))]
