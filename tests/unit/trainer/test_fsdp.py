"""FSDP2 backend: the same GRPO step as the single-device backend, parameters sharded over ranks; and the same for
a LoRA adapter on a frozen sharded base (docs/lora.md).

Runs on CUDA machines (NCCL, one rank per GPU, up to 2). Machines without a GPU skip it; set
ROLLART_TEST_FSDP_CPU=1 to run it with two CPU ranks over gloo instead (about 20 s on 2 cores).
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

HAS_CUDA = torch.cuda.is_available()


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.mark.slow
@pytest.mark.parametrize(
    "device",
    [
        pytest.param(
            "cuda",
            marks=pytest.mark.skipif(
                not HAS_CUDA, reason="FSDP2 is tested on CUDA GPUs (NCCL); this machine has no GPU"
            ),
        ),
        pytest.param(
            "cpu",
            marks=pytest.mark.skipif(
                os.environ.get("ROLLART_TEST_FSDP_CPU") != "1",
                reason="two gloo CPU ranks: opt in with ROLLART_TEST_FSDP_CPU=1",
            ),
        ),
    ],
)
def test_fsdp2_step_matches_single_device(tiny_model: Path, tiny_tied_model: Path, tmp_path: Path, device: str) -> None:
    ranks = min(2, torch.cuda.device_count()) if device == "cuda" else 2
    out = tmp_path / "result.json"
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(Path(__file__).resolve().parents[3]))
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        f"--nproc-per-node={ranks}",
        f"--master-port={_port()}",
        str(Path(__file__).with_name("fsdp_worker.py")),
        str(tiny_model),
        str(out),
        device,
        str(tiny_tied_model),  # the LoRA case's other base
    ]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=280)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    result = json.loads(out.read_text())
    fp32 = result["mixed=False"]
    assert fp32["world"] == ranks and fp32["names_equal"]
    assert fp32["tokens"] == fp32["ref_tokens"]
    for a, b in zip(fp32["loss"] + fp32["grad_norm"], fp32["ref_loss"] + fp32["ref_grad_norm"]):
        assert a == pytest.approx(b, rel=1e-4, abs=1e-5)
    assert fp32["max_ulps"] <= 8  # the same update up to the order of float reductions
    assert fp32["resume_loss"][0] == pytest.approx(fp32["resume_loss"][1], rel=1e-5, abs=1e-6)
    bf16 = result["mixed=True"]  # bf16 compute, fp32 master weights and reduction
    assert bf16["loss"][0] == pytest.approx(bf16["ref_loss"][0], abs=0.05)
    assert bf16["grad_norm"][0] == pytest.approx(bf16["ref_grad_norm"][0], rel=0.1)
    lora = result["lora"]  # fp32 compute, KL term on: the sharded adapter takes the single-device steps
    assert lora["names_equal"] and lora["base_hash_equal"] and lora["adapter_moved"]
    for a, b in zip(lora["loss"] + lora["grad_norm"], lora["ref_loss"] + lora["ref_grad_norm"]):
        assert a == pytest.approx(b, rel=1e-4, abs=1e-5)
    assert lora["max_abs_diff"] <= 1e-5  # 1% of a step (lr 1e-3): the same update up to float reduction order
    assert lora["base_bit_identical"]
    assert lora["reference_is_adapter_disabled"] and lora["reference_vs_base"] <= 1e-6
    assert lora["restored_equal"] and lora["resume_equal"]
    assert lora["resume_loss"][0] == lora["resume_loss"][1]
    assert "trained on base" in lora["other_base_refused"]
