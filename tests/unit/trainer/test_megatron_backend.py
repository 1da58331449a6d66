"""The Megatron backend against the torch backend on the same batch from the same weights (fp32), its
checkpoints, and tensor parallel 2 over two CPU processes (gloo) against tensor parallel 1.

Tolerances (fp32; the two backends add the same terms in different orders): loss and gradient norm within
1e-5 relative, weights after two AdamW steps at lr 1e-3 within 1e-4 absolute (a tenth of one step).
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("megatron.core")

from rollart_trainer.checkpoint import CheckpointManager, TrainerState  # noqa: E402
from rollart_trainer.grpo import GrpoSettings, TorchBackend  # noqa: E402
from rollart_trainer.megatron.backend import MegatronBackend  # noqa: E402

from .fsdp_worker import batch  # noqa: E402

SETTINGS = {"learning_rate": 1e-3, "micro_batch_size": 3}


TP_WEIGHT_ATOL = 2e-3  # two AdamW steps of lr 1e-3


def f32(x: np.ndarray) -> np.ndarray:
    """bf16 bit patterns (uint16) as float32 values."""
    return (x.astype(np.uint32) << 16).view(np.float32)


def bf16_close(a: dict, b: dict) -> bool:
    """Exported bf16 weights equal up to the weight tolerance plus one rounding step (2^-8 relative)."""
    return sorted(a) == sorted(b) and all(
        bool(np.all(np.abs(f32(a[k]) - f32(b[k])) <= 1e-4 + 2**-7 * np.abs(f32(b[k])))) for k in a
    )


def max_abs(a: dict, b: dict) -> float:
    assert sorted(a) == sorted(b)
    return max(float((a[k].float() - b[k].float()).abs().max()) for k in a)


@pytest.mark.parametrize("tied", [False, True])
def test_same_step_as_the_torch_backend(tiny_model: Path, tiny_tied_model: Path, tied: bool) -> None:
    path = tiny_tied_model if tied else tiny_model
    m = MegatronBackend.from_pretrained(path, GrpoSettings(**SETTINGS, kl_coef=0.05 if tied else 0.0))
    t = TorchBackend.from_pretrained(path, GrpoSettings(**SETTINGS, kl_coef=0.05 if tied else 0.0))
    em, et = m.export(), t.export()
    assert sorted(em) == sorted(et)  # the same HF names, so the publisher's engine names are the same too
    assert all(np.array_equal(em[k], et[k]) for k in et)  # loaded exactly
    b = batch()
    for _ in range(2):
        sm, st = m.train_step(b), t.train_step(b)
        assert sm.tokens_trained == st.tokens_trained > 0
        assert sm.loss == pytest.approx(st.loss, rel=1e-5, abs=1e-7)
        assert sm.kl == pytest.approx(st.kl, rel=1e-4, abs=1e-8)
        assert sm.grad_norm == pytest.approx(st.grad_norm, rel=1e-5)
        assert sm.entropy == pytest.approx(st.entropy, rel=1e-5)
    assert max_abs(m.model_state(), t.model_state()) <= 1e-4
    assert bf16_close(m.export(), t.export())
    lm = m.action_logprobs(b.samples[:4])
    lt = t.action_logprobs(b.samples[:4])
    for x, y in zip(lm, lt, strict=True):
        np.testing.assert_allclose(x, y, atol=1e-4)


def test_checkpoint_restores_the_same_training(tiny_model: Path, tmp_path: Path) -> None:
    """Save after one step, train on, restore: the next step is the same bits (model, AdamW moments, step)."""
    m = MegatronBackend.from_pretrained(tiny_model, GrpoSettings(**SETTINGS))
    b = batch()
    m.train_step(b)
    mgr = CheckpointManager(tmp_path / "ckpt")
    mgr.save(m, TrainerState(step=1, policy_version=1))
    first = m.train_step(b)
    after = m.export()
    record = mgr.latest()
    assert record is not None
    mgr.load(record, m)
    again = m.train_step(b)
    assert again.loss == first.loss and again.grad_norm == first.grad_norm
    assert all(np.array_equal(after[k], v) for k, v in m.export().items())
    # The checkpoint holds HF names (the same files as the torch backend's, any tensor-parallel size).
    from safetensors import safe_open

    with safe_open(str(record.path / "model.safetensors"), framework="pt") as f:
        assert sorted(f.keys()) == sorted(after)


@pytest.fixture(scope="module")
def tiny_gqa_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny Qwen3 with 4 query heads in 2 key/value groups (tensor parallel 2 splits whole groups)."""
    from rollart_devtools.tiny_model import build_tiny_model

    out = tmp_path_factory.mktemp("trainer-model-gqa") / "tiny"
    build_tiny_model(out, seed=2, pretrain_steps=0, layers=2, hidden=128, heads=4, kv_heads=2, vocab_size=512)
    return out


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.mark.slow
def test_tensor_parallel_2_matches_tensor_parallel_1(tiny_gqa_model: Path, tmp_path: Path) -> None:
    """Two gloo CPU ranks split every matrix; the step is the TP=1 step up to float reduction order."""
    out = tmp_path / "tp2"
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(Path(__file__).resolve().parents[3]))
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node=2", f"--master-port={_port()}",
           "-m", "tests.unit.trainer.test_megatron_backend", str(tiny_gqa_model), str(out)]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=400, cwd=env["PYTHONPATH"])
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    result = json.loads((out / "result.json").read_text())
    tp2 = dict(np.load(out / "export.npz"))
    m = MegatronBackend.from_pretrained(tiny_gqa_model, GrpoSettings(**SETTINGS))
    b = batch()
    stats = [m.train_step(b) for _ in range(2)]
    # Step 1 from the same weights: the same loss and gradient norm up to float reduction order.
    assert result["loss"][0] == pytest.approx(stats[0].loss, rel=1e-5, abs=1e-7)
    assert result["grad_norm"][0] == pytest.approx(stats[0].grad_norm, rel=1e-4)
    # After an AdamW step the weights differ by the normalised step of near-zero gradient entries (whose
    # rounding differs between the layouts): within TP_WEIGHT_ATOL, and step 2 within 1e-3 relative.
    assert result["loss"][1] == pytest.approx(stats[1].loss, rel=1e-3)
    assert result["grad_norm"][1] == pytest.approx(stats[1].grad_norm, rel=1e-3)
    tp1 = m.export()
    assert sorted(tp1) == sorted(tp2)
    for k in tp1:  # plus one bf16 rounding step (2^-8 relative, either side)
        a, c = f32(tp1[k]), f32(tp2[k])
        assert np.all(np.abs(a - c) <= TP_WEIGHT_ATOL + 2**-7 * np.abs(c)), k
    # A TP=2 checkpoint resumes under TP=1 (HF names, full tensors): the third step matches.
    record = CheckpointManager(out / "ckpt").latest()
    assert record is not None
    CheckpointManager(out / "ckpt").load(record, m)
    assert m.train_step(b).loss == pytest.approx(result["third_loss"], rel=1e-3)


def _tp2_worker(model: Path, out: Path) -> None:
    """One rank of the TP=2 check (``python -m`` under torchrun)."""
    import torch.distributed as dist

    torch.set_num_threads(1)
    m = MegatronBackend.from_pretrained(model, GrpoSettings(**SETTINGS), tensor_parallel_size=2)
    b = m.share_batch(batch() if m.rank == 0 else None)
    stats = [m.train_step(b) for _ in range(2)]
    exported = m.export()
    mgr = CheckpointManager(out / "ckpt")
    mgr.save(m, TrainerState(step=2, policy_version=2))
    dist.barrier()
    third = m.train_step(b)
    if m.rank == 0:
        out.mkdir(parents=True, exist_ok=True)
        np.savez(out / "export.npz", **exported)
        result = {"loss": [s.loss for s in stats], "grad_norm": [s.grad_norm for s in stats], "third_loss": third.loss}
        (out / "result.json").write_text(json.dumps(result))
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    _tp2_worker(Path(sys.argv[1]), Path(sys.argv[2]))
