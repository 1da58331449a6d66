"""A Megatron trainer process killed with SIGKILL in the middle of writing a checkpoint resumes from the newest
complete one and ends on the same bits as a run that was never killed (model, AdamW moments, step count)."""

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


def run(model: Path, work: Path, kill_at: str = "") -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(ROOT))
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


if __name__ == "__main__":
    _main(Path(sys.argv[1]), Path(sys.argv[2]), sys.argv[3] if len(sys.argv) > 3 else "")
