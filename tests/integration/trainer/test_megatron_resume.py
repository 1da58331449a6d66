"""A Megatron trainer process killed with SIGKILL in the middle of writing a checkpoint resumes from the newest
complete one and ends on the same bits as a run that was never killed (model, AdamW moments, step count).

With pipeline parallel 2 (two gloo processes under torchrun) one rank is killed at a bad moment: the last stage
in the middle of a step's pipeline (the first stage waits on its backward), or the writer while the checkpoint
files are half written. The world fails (torchrun's non-zero status, naming the rank), no checkpoint newer than
the last complete one is ever listed, and a new world resumes from it to the same bits as an unkilled run."""

from __future__ import annotations

import hashlib
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("torch")
pytest.importorskip("megatron.core")

ROOT = Path(__file__).resolve().parents[3]
STEPS = 4


#: What an in-process backend test leaves in os.environ (init_distributed's world of one): a child inheriting
#: them would join that world's store (its port is still held by this process) instead of making its own.
WORLD_ENV = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")


def run(model: Path, work: Path, kill_at: str = "") -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k not in WORLD_ENV}
    env.update(OMP_NUM_THREADS="1", PYTHONPATH=str(ROOT))
    cmd = [sys.executable, "-m", "tests.integration.trainer.test_megatron_resume", str(model), str(work), kill_at]
    return subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300, cwd=ROOT)


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from rollart_devtools.tiny_model import build_tiny_model

    out = tmp_path_factory.mktemp("megatron-resume") / "tiny"
    build_tiny_model(out, seed=0, pretrain_steps=0, layers=2, hidden=128, vocab_size=512)
    return out


@pytest.mark.slow
def test_sigkill_while_checkpointing_resumes_to_the_same_weights(model: Path, tmp_path: Path) -> None:
    clean = run(model, tmp_path / "clean")
    assert clean.returncode == 0, clean.stderr[-3000:]
    killed = run(model, tmp_path / "killed", kill_at="3:optimizer")  # step 3's model file written, no more
    assert killed.returncode == -signal.SIGKILL, killed.stderr[-3000:]
    resumed = run(model, tmp_path / "killed")
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    a, b = json.loads(clean.stdout.splitlines()[-1]), json.loads(resumed.stdout.splitlines()[-1])
    assert b["resumed_from"] == 2 and a["resumed_from"] == 0
    assert a["losses"][2:] == b["losses"]  # steps 3 and 4 again, the same numbers
    assert a["digest"] == b["digest"] and a["optimizer_steps"] == b["optimizer_steps"] == STEPS


def _main(model: Path, work: Path, kill_at: str) -> None:
    import numpy as np
    import torch

    from rollart_trainer.checkpoint import CheckpointManager, TrainerState
    from rollart_trainer.grpo import GrpoSettings
    from rollart_trainer.megatron.backend import MegatronBackend
    from tests.unit.trainer.fsdp_worker import batch

    torch.set_num_threads(1)
    step_to_kill, _, phase_to_kill = kill_at.partition(":")
    current = {"step": 0}

    def hook(phase: str) -> None:
        if kill_at and current["step"] == int(step_to_kill) and phase == phase_to_kill:
            os.kill(os.getpid(), signal.SIGKILL)

    backend = MegatronBackend.from_pretrained(model, GrpoSettings(learning_rate=1e-3, micro_batch_size=3))
    mgr = CheckpointManager(work, keep_last=2, fault_hook=hook)
    restored = mgr.restore_latest(backend)
    start = restored[0].step if restored else 0
    losses = []
    for step in range(start + 1, STEPS + 1):
        current["step"] = step
        losses.append(backend.train_step(batch(seed=step)).loss)
        mgr.save(backend, TrainerState(step=step, policy_version=step))
    h = hashlib.sha256()
    for name, arr in sorted(backend.export().items()):
        h.update(name.encode() + np.ascontiguousarray(arr).tobytes())
    for t in backend.optimizer_state()["exp_avg_sq"].values():
        h.update(t.numpy().tobytes())
    print(json.dumps({"resumed_from": start, "losses": losses, "digest": h.hexdigest(),
                      "optimizer_steps": backend.optimizer_steps}))


def run_pp2(model: Path, work: Path, kill_at: str = "") -> subprocess.CompletedProcess[str]:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(ROOT))
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node=2", f"--master-port={port}",
           "-m", "tests.integration.trainer.test_megatron_resume", "pp2", str(model), str(work), kill_at]
    return subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300, cwd=ROOT)


@pytest.fixture(scope="module")
def four_layer_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from rollart_devtools.tiny_model import build_tiny_model

    out = tmp_path_factory.mktemp("megatron-resume-pp") / "tiny"
    build_tiny_model(out, seed=0, pretrain_steps=0, layers=4, hidden=128, vocab_size=512)
    return out


@pytest.fixture(scope="module")
def clean_pp2(four_layer_model: Path, tmp_path_factory: pytest.TempPathFactory) -> dict:
    proc = run_pp2(four_layer_model, tmp_path_factory.mktemp("pp2-clean"))
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.mark.slow
@pytest.mark.parametrize(
    "kill_at",
    [
        "1:3:pipeline",  # the last stage, step 3, after its first micro-batch's forward
        "0:3:optimizer",  # the writer, step 3's checkpoint: model and optimizer files written, no manifest
    ],
)
def test_pp2_rank_killed_mid_step_resumes_from_the_last_complete_checkpoint(
    four_layer_model: Path, clean_pp2: dict, tmp_path: Path, kill_at: str
) -> None:
    from rollart_trainer.checkpoint import CheckpointManager

    work = tmp_path / "killed"
    killed = run_pp2(four_layer_model, work, kill_at)
    assert killed.returncode != 0
    rank = kill_at.split(":")[0]
    root = killed.stderr.rpartition("Root Cause")[2]  # torchrun's report names the killed rank first
    assert f"rank      : {rank} " in root and "(SIGKILL)" in root, killed.stderr[-3000:]
    record = CheckpointManager(work).latest()
    assert record is not None and record.state.step == 2  # step 3's checkpoint was never completed
    resumed = run_pp2(four_layer_model, work)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    b = json.loads(resumed.stdout.strip().splitlines()[-1])
    assert clean_pp2["resumed_from"] == 0 and b["resumed_from"] == 2
    assert clean_pp2["losses"][2:] == b["losses"]  # steps 3 and 4 again, the same numbers
    assert b["digest"] == clean_pp2["digest"] and b["optimizer_steps"] == STEPS


def _pp2_main(model: Path, work: Path, kill_at: str) -> None:
    """One rank of a PP2 run of STEPS steps with a checkpoint after each (``python -m`` under torchrun)."""
    import numpy as np
    import torch
    import torch.distributed as dist

    from rollart_trainer.checkpoint import CheckpointManager, TrainerState
    from rollart_trainer.grpo import GrpoSettings
    from rollart_trainer.megatron.backend import MegatronBackend
    from tests.unit.trainer.fsdp_worker import batch

    torch.set_num_threads(1)
    kill_rank, kill_step, kill_phase = (kill_at.split(":") + ["", "", ""])[:3] if kill_at else ("", "", "")
    current = {"step": 0}
    backend = MegatronBackend.from_pretrained(
        model, GrpoSettings(learning_rate=1e-3, micro_batch_size=3), pipeline_parallel_size=2
    )
    mine = kill_at and int(kill_rank) == backend.rank

    def kill_if(phase: str) -> None:
        if mine and current["step"] == int(kill_step) and phase == kill_phase:
            os.kill(os.getpid(), signal.SIGKILL)

    logprobs = backend.net.logprobs

    def logprobs_then_maybe_die(*args, **kwargs):  # the last stage, inside the 1F1B schedule
        out = logprobs(*args, **kwargs)
        kill_if("pipeline")
        return out

    backend.net.logprobs = logprobs_then_maybe_die
    mgr = CheckpointManager(work, keep_last=2, fault_hook=kill_if)
    restored = mgr.restore_latest(backend)
    start = restored[0].step if restored else 0
    losses = []
    for step in range(start + 1, STEPS + 1):
        current["step"] = step
        b = backend.share_batch(batch(seed=step) if backend.rank == 0 else None)
        losses.append(backend.train_step(b).loss)
        mgr.save(backend, TrainerState(step=step, policy_version=step))
    exported = backend.export()
    moments = backend.optimizer_state()["exp_avg_sq"]
    if backend.rank == 0:
        h = hashlib.sha256()
        for name, arr in sorted(exported.items()):
            h.update(name.encode() + np.ascontiguousarray(arr).tobytes())
        for t in moments.values():
            h.update(t.numpy().tobytes())
        print(json.dumps({"resumed_from": start, "losses": losses, "digest": h.hexdigest(),
                          "optimizer_steps": backend.optimizer_steps}), flush=True)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    if sys.argv[1] == "pp2":
        _pp2_main(Path(sys.argv[2]), Path(sys.argv[3]), sys.argv[4] if len(sys.argv) > 4 else "")
    else:
        _main(Path(sys.argv[1]), Path(sys.argv[2]), sys.argv[3] if len(sys.argv) > 3 else "")
