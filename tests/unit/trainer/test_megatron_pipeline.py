"""Pipeline parallel on CPU (gloo): PP2, TP2xPP1 and TP2xPP2 against PP1 on the same batch from the same weights.

The converter split by stage is checked in-process (no ranks needed); the training runs are torchrun worlds of
2 or 4 gloo processes (``python -m`` this module) that write their step statistics, bf16 export and a checkpoint.

Tolerances (fp32): step 1 from the same weights, loss within 1e-5 relative and gradient norm within 1e-4
relative (the stages add the same terms; only the reduction order of the tensor-parallel matmuls and of the
norm differs). After an AdamW step at lr 1e-3 the weights differ by the normalised step of near-zero gradient
entries whose rounding differs between layouts: within PP_WEIGHT_ATOL (two steps of lr 1e-3) plus one bf16
rounding step, and step 2 within 1e-3 relative (its loss, near zero, also within 1e-4 absolute). With tensor parallel 1 the pipeline runs the same matmuls in
the same order as PP1: its figures are expected bit-equal or within 1e-6 and are checked at the tighter bound.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("megatron.core")

from rollart_trainer.checkpoint import CheckpointManager, TrainerState  # noqa: E402
from rollart_trainer.grpo import GrpoSettings  # noqa: E402
from rollart_trainer.megatron import convert  # noqa: E402
from rollart_trainer.megatron.backend import (  # noqa: E402
    MegatronBackend,
    SafetensorsDir,
    read_hf_tensors,
    read_layout,
)

from .fsdp_worker import batch  # noqa: E402

ROOT = Path(__file__).resolve().parents[3]
SETTINGS = {"learning_rate": 1e-3, "micro_batch_size": 3}
PP_WEIGHT_ATOL = 2e-3  # two AdamW steps of lr 1e-3


def f32(x: np.ndarray) -> np.ndarray:
    """bf16 bit patterns (uint16) as float32 values."""
    return (x.astype(np.uint32) << 16).view(np.float32)


@pytest.fixture(scope="module")
def four_layer_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny Qwen3 with 4 layers (2 per stage) and 4 query heads in 2 key/value groups (TP2 splits groups)."""
    from rollart_devtools.tiny_model import build_tiny_model

    out = tmp_path_factory.mktemp("trainer-model-pp") / "tiny"
    build_tiny_model(out, seed=3, pretrain_steps=0, layers=4, hidden=128, heads=4, kv_heads=2, vocab_size=512)
    return out


@pytest.fixture(scope="module")
def four_layer_tied_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from rollart_devtools.tiny_model import build_tiny_model

    out = tmp_path_factory.mktemp("trainer-model-pp-tied") / "tiny"
    build_tiny_model(
        out, seed=4, pretrain_steps=0, layers=4, hidden=128, heads=4, kv_heads=2, vocab_size=512, tie_embeddings=True
    )
    return out


# ----------------------------------------------------------------------------------- the converter by stage


@pytest.mark.parametrize("tied", [False, True])
@pytest.mark.parametrize(("tp", "pp"), [(1, 2), (2, 2), (1, 4)])
def test_stages_split_and_rejoin_exactly(four_layer_model: Path, four_layer_tied_model: Path, tied, tp, pp) -> None:
    path = four_layer_tied_model if tied else four_layer_model
    layout = read_layout(path)
    hf = {k: v.to(torch.bfloat16) for k, v in read_hf_tensors(path).items()}
    stages = [[convert.hf_to_megatron(layout, hf, tp, r, pp, s) for r in range(tp)] for s in range(pp)]
    back = convert.stages_to_hf(layout, stages)
    assert sorted(back) == convert.hf_names(layout)
    for name, t in hf.items():  # bf16 bit patterns survive the split and the rejoin
        assert torch.equal(back[name].view(torch.int16), t.view(torch.int16)), name
    per = layout.num_layers // pp
    for s, shards in enumerate(stages):
        names = set(shards[0])
        assert ("embedding.word_embeddings.weight" in names) == (s == 0)
        assert ("decoder.final_layernorm.weight" in names) == (s == pp - 1)
        # The last stage of a tied model holds the embeddings' copy as its output layer.
        assert ("output_layer.weight" in names) == (s == pp - 1 and (not tied or pp > 1))
        assert {n.split(".")[2] for n in names if n.startswith("decoder.layers.")} == {str(i) for i in range(per)}
    if tied:
        last = convert.rules(layout, pp, pp - 1)
        copy = [r for r in last if r.tied_copy]
        assert [(r.megatron, r.hf) for r in copy] == [("output_layer.weight", ("model.embed_tokens.weight",))]
        assert torch.equal(stages[-1][0]["output_layer.weight"], stages[0][0]["embedding.word_embeddings.weight"])


def test_a_stage_reads_only_its_own_tensors(four_layer_tied_model: Path) -> None:
    """Loading stage 1 of 2 looks up its layers, the final norm and (tied) the embeddings for its output layer."""
    layout = read_layout(four_layer_tied_model)
    seen: list[str] = []

    class Counting(SafetensorsDir):
        def __getitem__(self, name: str):
            seen.append(name)
            return super().__getitem__(name)

    shards = convert.hf_to_megatron(layout, Counting(four_layer_tied_model), 1, 0, 2, 1)
    assert sorted(set(seen)) == sorted(n for r in convert.rules(layout, 2, 1) for n in r.hf)
    assert not any(n.startswith(("model.layers.0.", "model.layers.1.")) for n in seen)
    assert "output_layer.weight" in shards and "embedding.word_embeddings.weight" not in shards


def test_a_stage_that_does_not_split_the_layers_is_refused(four_layer_model: Path) -> None:
    layout = read_layout(four_layer_model)
    assert layout.parallel_errors(1, 3) == [("pipeline_parallel_size", "4 layers are not divisible by 3 stages")]
    with pytest.raises(ValueError, match="does not split"):
        layout.stage_layers(3, 0)
    with pytest.raises(ValueError, match="does not split"):
        layout.stage_layers(2, 2)
    with pytest.raises(ValueError, match="pipeline_parallel_size"):
        MegatronBackend(layout, read_hf_tensors(four_layer_model), pipeline_parallel_size=3)


# ------------------------------------------------------------------------------------------ gloo worlds


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def run_world(model: Path, out: Path, tp: int, pp: int, kl: float = 0.0, timeout: int = 600) -> dict:
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(ROOT))
    cmd = [sys.executable, "-m", "torch.distributed.run", f"--nproc-per-node={tp * pp}", f"--master-port={_port()}",
           "-m", "tests.unit.trainer.test_megatron_pipeline", str(model), str(out), str(tp), str(pp), str(kl)]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout, cwd=ROOT)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-4000:]
    result = json.loads((out / "result.json").read_text())
    result["export"] = dict(np.load(out / "export.npz"))
    return result


def check_against_pp1(model: Path, result: dict, kl: float, exact_layout: bool) -> None:
    m = MegatronBackend.from_pretrained(model, GrpoSettings(**SETTINGS, kl_coef=kl))
    b = batch()
    stats = [m.train_step(b) for _ in range(2)]
    rel = 1e-6 if exact_layout else 1e-5
    assert result["tokens"][0] == stats[0].tokens_trained > 0
    assert result["loss"][0] == pytest.approx(stats[0].loss, rel=rel, abs=1e-7)
    assert result["grad_norm"][0] == pytest.approx(stats[0].grad_norm, rel=10 * rel)
    assert result["entropy"][0] == pytest.approx(stats[0].entropy, rel=1e-5)
    assert result["kl"][0] == pytest.approx(stats[0].kl, rel=1e-4, abs=1e-8)
    # Step 2's loss is near zero (a mean of +-advantage terms of size ~1): 1e-3 relative or 1e-4 absolute.
    assert result["loss"][1] == pytest.approx(stats[1].loss, rel=1e-3, abs=1e-4)
    assert result["grad_norm"][1] == pytest.approx(stats[1].grad_norm, rel=1e-3)
    one = m.export()
    assert sorted(one) == sorted(result["export"])  # the inference engine's names, whatever the layout
    atol = 1e-5 if exact_layout else PP_WEIGHT_ATOL
    for k in one:  # plus one bf16 rounding step (2^-8 relative, either side)
        a, c = f32(one[k]), f32(result["export"][k])
        assert np.all(np.abs(a - c) <= atol + 2**-7 * np.abs(c)), k
    # The same batch's current-policy logprobs, gathered from the last stage (after two steps: the weights'
    # tolerance shows through, 1e-4 where the layouts compute alike).
    lp = m.action_logprobs(b.samples[:4])
    for x, y in zip(lp, result["logprobs"], strict=True):
        np.testing.assert_allclose(x, np.asarray(y, dtype=np.float32), atol=1e-4 if exact_layout else PP_WEIGHT_ATOL)
    # The pipelined run's checkpoint (HF names, full tensors) resumes here under PP1: the third step matches.
    mgr = CheckpointManager(Path(result["ckpt"]))
    record = mgr.latest()
    assert record is not None
    mgr.load(record, m)
    assert m.optimizer_steps == 2
    assert m.train_step(b).loss == pytest.approx(result["third_loss"], rel=1e-3)


@pytest.mark.slow
def test_pipeline_2_matches_pipeline_1(four_layer_model: Path, tmp_path: Path) -> None:
    result = run_world(four_layer_model, tmp_path / "pp2", tp=1, pp=2)
    check_against_pp1(four_layer_model, result, 0.0, exact_layout=True)


@pytest.mark.slow
def test_pipeline_2_tied_embeddings_with_a_kl_reference(four_layer_tied_model: Path, tmp_path: Path) -> None:
    """The tied copy on the last stage stays equal to the embeddings; the reference is a pipeline of its own."""
    result = run_world(four_layer_tied_model, tmp_path / "pp2-tied", tp=1, pp=2, kl=0.05)
    assert result["tied_copy_equal"]
    check_against_pp1(four_layer_tied_model, result, 0.05, exact_layout=True)


@pytest.mark.slow
def test_tensor_2_pipeline_2_matches_pipeline_1(four_layer_model: Path, tmp_path: Path) -> None:
    """Four gloo processes: two stages of two tensor-parallel ranks."""
    result = run_world(four_layer_model, tmp_path / "tp2pp2", tp=2, pp=2)
    check_against_pp1(four_layer_model, result, 0.0, exact_layout=False)


def _worker(model: Path, out: Path, tp: int, pp: int, kl: float) -> None:
    """One rank of a pipelined run (``python -m`` under torchrun): two steps, export, checkpoint, a third step."""
    import torch.distributed as dist

    torch.set_num_threads(1)
    m = MegatronBackend.from_pretrained(
        model, GrpoSettings(**SETTINGS, kl_coef=kl), tensor_parallel_size=tp, pipeline_parallel_size=pp
    )
    b = m.share_batch(batch() if m.rank == 0 else None)
    cpu_s: list[float] = []  # CPU seconds of each step, all ranks together (what bench/notes/megatron.md records)

    def timed_step() -> Any:
        t0 = time.process_time()
        st = m.train_step(b)
        spent = torch.tensor([time.process_time() - t0], dtype=torch.float64)
        dist.all_reduce(spent)
        cpu_s.append(float(spent))
        return st

    stats = [timed_step() for _ in range(2)]
    exported = m.export()
    logprobs = m.action_logprobs(b.samples[:4])
    mgr = CheckpointManager(out / "ckpt")
    mgr.save(m, TrainerState(step=2, policy_version=2))
    tied_equal = True
    if m.layout.tied and m.pp > 1 and m.is_last_stage:  # the last stage's copy against the first stage's embeddings
        copy = m._params["output_layer.weight"].detach()
        first = torch.empty_like(copy)
        dist.recv(first, src=m._first_rank)
        tied_equal = bool(torch.equal(copy, first))
    elif m.layout.tied and m.pp > 1 and m.pp_rank == 0:
        dist.send(m._params["embedding.word_embeddings.weight"].detach().contiguous(), dst=m._last_rank)
    box = [tied_equal]
    dist.broadcast_object_list(box, src=m._last_rank, group=m.pp_group)
    dist.barrier()
    third = timed_step()
    if m.rank == 0:
        out.mkdir(parents=True, exist_ok=True)
        np.savez(out / "export.npz", **exported)
        result = {
            "loss": [s.loss for s in stats],
            "grad_norm": [s.grad_norm for s in stats],
            "entropy": [s.entropy for s in stats],
            "kl": [s.kl for s in stats],
            "tokens": [s.tokens_trained for s in stats],
            "step_s": [s.train_seconds for s in (*stats, third)],
            "cpu_s": cpu_s,
            "third_loss": third.loss,
            "logprobs": [x.tolist() for x in logprobs],
            "ckpt": str(out / "ckpt"),
            "tied_copy_equal": box[0],
        }
        (out / "result.json").write_text(json.dumps(result))
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    _worker(Path(sys.argv[1]), Path(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), float(sys.argv[5]))
