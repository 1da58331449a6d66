"""Training checkpoints: exact round trip, pruning, damaged checkpoints, and SIGKILL at any point of a save."""

from __future__ import annotations

import copy
import os
import random
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from rollart_trainer.checkpoint import CheckpointManager, TrainerState  # noqa: E402
from rollart_trainer.grpo import GrpoSettings, TorchBackend, TrainBatch  # noqa: E402

from .test_loss import _random_batch, _set_behaviour  # noqa: E402


def _trained_backend(tiny_model: Path) -> tuple[TorchBackend, TrainBatch]:
    b = TorchBackend.from_pretrained(tiny_model, GrpoSettings(learning_rate=1e-3, micro_batch_size=4))
    samples = _random_batch(8)
    _set_behaviour(samples, b.action_logprobs(samples))
    batch = TrainBatch(samples, "batch-1")
    b.train_step(batch)
    return b, batch


def test_round_trip_restores_weights_optimizer_rng_and_state(tiny_model: Path, tmp_path: Path) -> None:
    b, batch = _trained_backend(tiny_model)
    mgr = CheckpointManager(tmp_path / "ckpt")
    state = TrainerState(
        job_id="job", step=1, policy_version=1, last_batch_id="batch-1", last_published_version=1, extra={"hash": "ab"}
    )
    published = b.weight_set(version=1)
    rec = mgr.save(b, state, published=published)
    assert rec is not None and rec.includes_optimizer and rec.path.name.startswith("ckpt-000000000001-")
    assert rec.has_published
    weights = b.model_state()
    opt = copy.deepcopy(b.optimizer_state())  # the live state moves on with the next step
    after_rng = (torch.rand(3), random.random(), np.random.rand())
    b.train_step(batch)  # moves weights, optimizer and RNG on
    assert not torch.equal(b.model_state()["lm_head.weight"], weights["lm_head.weight"])

    fresh = TorchBackend.from_pretrained(tiny_model, GrpoSettings(learning_rate=1e-3, micro_batch_size=4))
    restored = CheckpointManager(tmp_path / "ckpt").restore_latest(fresh)
    assert restored is not None
    got_state, got_rec = restored
    assert got_state == state and got_rec.checkpoint_id == rec.checkpoint_id
    pub = CheckpointManager(tmp_path / "ckpt").published_weights(got_rec)
    assert pub is not None and pub.version == 1 and pub.dtypes == published.dtypes
    for name, arr in published.arrays.items():
        np.testing.assert_array_equal(pub.arrays[name], arr)
    assert (torch.rand(3).tolist(), random.random(), np.random.rand()) == (after_rng[0].tolist(), *after_rng[1:])
    for name, t in fresh.model_state().items():
        assert torch.equal(t, weights[name]), name
    new_opt = fresh.optimizer_state()
    assert new_opt["optimizer_steps"] == opt["optimizer_steps"] == 1
    for k, v in opt["optimizer"]["state"].items():
        for field, t in v.items():
            assert torch.equal(new_opt["optimizer"]["state"][k][field], t)
    # the same next step from both
    s1, s2 = b, fresh
    s1.load_model_state(weights)
    s1.load_optimizer_state(opt)
    assert s1.train_step(batch).loss == s2.train_step(batch).loss
    info = rec.to_proto()
    assert info.step == 1 and info.version == 1 and info.includes_optimizer and len(info.hash) == 32


def test_keep_last_weights_only_and_damaged_newest(tiny_model: Path, tmp_path: Path) -> None:
    b, _ = _trained_backend(tiny_model)
    mgr = CheckpointManager(tmp_path, keep_last=2)
    for step in (1, 2, 3):
        mgr.save(b, TrainerState(step=step, policy_version=step), weights_only=step == 3)
    recs = mgr.list(verify=True)
    assert [r.step for r in recs] == [2, 3]
    assert [r.includes_optimizer for r in recs] == [True, False]
    assert mgr.published_weights(recs[0]) is None
    # flip one byte of the newest: it no longer verifies and restore falls back to the one before
    model_file = recs[-1].path / "model.safetensors"
    raw = bytearray(model_file.read_bytes())
    raw[-1] ^= 0xFF
    model_file.write_bytes(bytes(raw))
    assert mgr.latest().step == 2  # type: ignore[union-attr]
    # a directory that only looks like a checkpoint (no manifest) is ignored, leftovers are cleaned
    (tmp_path / "ckpt-000000000009-00000000000000000001").mkdir()
    (tmp_path / ".tmp-ckpt-000000000004-00000000000000000002").mkdir()
    assert mgr.latest().step == 2  # type: ignore[union-attr]
    mgr.save(b, TrainerState(step=4, policy_version=4))
    assert not any(p.name.startswith(".tmp-") for p in tmp_path.iterdir())
    assert mgr.latest().step == 4  # type: ignore[union-attr]


# ----------------------------------------------------------------------------------------------------
# SIGKILL while saving (a real writer process)
# ----------------------------------------------------------------------------------------------------

WRITER = textwrap.dedent(
    """
    import sys, time
    import torch
    from rollart_trainer.checkpoint import CheckpointManager, TrainerState

    root, kill_step, phase = sys.argv[1], int(sys.argv[2]), sys.argv[3]

    class Fake:  # the checkpoint contents of step s are a function of s
        is_writer = True
        step = 0
        def model_state(self):
            return {"w": torch.full((256, 512), float(self.step)), "b": torch.arange(1000.0) + self.step}
        def optimizer_state(self):
            st = {0: {"exp_avg": torch.full((128, 512), -float(self.step))}}
            return {"optimizer": {"state": st, "param_groups": [{"lr": 0.1, "params": [0]}]}, "optimizer_steps": self.step}

    fake = Fake()
    def hook(p):
        print(f"{fake.step} {p}", flush=True)
        if fake.step == kill_step and p == phase:
            print("ARMED", flush=True)
            time.sleep(120)

    mgr = CheckpointManager(root, keep_last=2, fault_hook=hook)
    latest = mgr.latest()
    step = 1 if latest is None else latest.step + 1   # a restarted writer carries on
    while True:
        fake.step = step
        mgr.save(fake, TrainerState(job_id="j", step=step, policy_version=step, last_batch_id=f"b{step}",
                                    last_published_version=step))
        step += 1
    """
)


class _Receiver:
    def __init__(self) -> None:
        self.model: dict[str, Any] = {}
        self.optim: Any = None

    def load_model_state(self, t: dict[str, Any]) -> None:
        self.model = dict(t)

    def load_optimizer_state(self, s: Any) -> None:
        self.optim = s


def _check_consistent(root: Path) -> int:
    """Every ckpt-* directory verifies; the newest holds exactly its step's contents. Returns its step."""
    mgr = CheckpointManager(root)
    names = sorted(p.name for p in root.iterdir() if p.name.startswith("ckpt-"))
    for n in names:
        mgr.read(root / n, verify=True)  # raises if any checkpoint directory is incomplete
    rec = mgr.latest()
    assert rec is not None
    r = _Receiver()
    state = mgr.load(rec, r, restore_rng_state=False)
    s = state.step
    assert state.last_batch_id == f"b{s}" and state.policy_version == s
    assert torch.equal(r.model["w"], torch.full((256, 512), float(s)))
    assert torch.equal(r.model["b"], torch.arange(1000.0) + s)
    assert torch.equal(r.optim["optimizer"]["state"][0]["exp_avg"], torch.full((128, 512), -float(s)))
    return s


def _start_writer(tmp_path: Path, root: Path, kill_step: int, phase: str) -> subprocess.Popen:
    script = tmp_path / "writer.py"
    script.write_text(WRITER)
    return subprocess.Popen(
        [sys.executable, str(script), str(root), str(kill_step), phase], stdout=subprocess.PIPE, text=True
    )


@pytest.mark.parametrize(
    ("phase", "survivor"),
    [("model", 2), ("state", 2), ("manifest", 2), ("renamed", 3), ("pruning", 3)],
)
def test_sigkill_during_save_leaves_old_or_new_checkpoint_complete(tmp_path: Path, phase: str, survivor: int) -> None:
    root = tmp_path / "ckpt"
    proc = _start_writer(tmp_path, root, 3, phase)
    try:
        assert proc.stdout is not None
        lines = []
        for line in proc.stdout:
            lines.append(line.strip())
            if line.strip() == "ARMED":
                break
        assert lines and lines[-1] == "ARMED", lines
        os.kill(proc.pid, signal.SIGKILL)
    finally:
        proc.kill()
        proc.wait(10)
    assert proc.returncode == -signal.SIGKILL
    assert _check_consistent(root) == survivor
    # a restarted writer cleans up and goes on
    mgr = CheckpointManager(root, keep_last=2)
    r = _Receiver()
    mgr.save(
        type("B", (), {"model_state": lambda s: {"w": torch.zeros(1)}, "optimizer_state": lambda s: {}})(),
        TrainerState(step=survivor + 1),
    )
    assert not [p for p in root.iterdir() if p.name.startswith((".tmp-", ".del-"))]
    assert mgr.load(mgr.latest(), r, restore_rng_state=False).step == survivor + 1  # type: ignore[arg-type]


def test_sigkill_at_random_moments_never_loses_the_last_complete_checkpoint(tmp_path: Path) -> None:
    root = tmp_path / "ckpt"
    rng = random.Random(0)
    last = 0
    for _ in range(3):
        proc = _start_writer(tmp_path, root, -1, "never")
        try:
            assert proc.stdout is not None
            for line in proc.stdout:  # wait until the (re)started writer has finished one checkpoint
                if line.endswith(" done\n"):
                    break
            time.sleep(rng.uniform(0.0, 0.4))
            os.kill(proc.pid, signal.SIGKILL)
        finally:
            proc.kill()
            proc.wait(10)
        step = _check_consistent(root)
        assert step > last  # at least the checkpoint we saw finish survived
        last = step
