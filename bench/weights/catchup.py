"""Catch-up benchmark: rejoining after K = 1, 3, 10 missed versions, deltas vs a full checkpoint.

    .venv/bin/python -m bench catchup                  # 64M-parameter bf16 model, 3 % of entries per step
    .venv/bin/python -m bench catchup --params 32e6 --density 0.01

A trainer (``Publisher``, this process) publishes versions 1..N to a real ``rollart-relay`` process and writes
full checkpoints to a directory checkpoint store. An actor that missed the last K versions rejoins two ways:

- deltas: ``WeightSubscriber.catch_up`` fetches ``D_{N-K+1} .. D_N`` from the relay's cache (``FetchDeltas``),
  verifies every segment and each ``h(v)``, and applies the chain (cost K·|D|);
- checkpoint: loads the newest full checkpoint (SHA-256 verified against its manifest) into memory.

Both end bit-identical to the trainer (checked). "at 1 Gb/s" adds the time the bytes take on a 1 Gb/s link,
since on loopback the transfer itself is nearly free.
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "libs"))

from rollart.delta import WeightSet  # noqa: E402
from rollart.weights.checkpoint_store import open_store  # noqa: E402
from rollart.weights.publisher import Publisher  # noqa: E402
from rollart.weights.subscriber import WeightSubscriber  # noqa: E402

KEY = b"bench-catchup-key-0123456789abcdef"
JOB = "bench"
TOKEN = "bench-token-0123456789"
LINK = 125e6  # 1 Gb/s in bytes/s


def synthetic_model(params: float, seed: int = 0) -> WeightSet:
    hidden, inter, vocab = 1024, 3072, 32000
    per_layer = hidden * hidden * 2 + 2 * (hidden // 2) * hidden + 3 * hidden * inter
    layers = max(1, int((params - vocab * hidden) // per_layer))
    rng = np.random.default_rng(seed)
    shapes: dict[str, tuple[int, ...]] = {"model.embed_tokens.weight": (vocab, hidden)}
    for i in range(layers):
        p = f"model.layers.{i}."
        shapes |= {
            p + "self_attn.q_proj.weight": (hidden, hidden),
            p + "self_attn.k_proj.weight": (hidden // 2, hidden),
            p + "self_attn.v_proj.weight": (hidden // 2, hidden),
            p + "self_attn.o_proj.weight": (hidden, hidden),
            p + "mlp.gate_proj.weight": (inter, hidden),
            p + "mlp.up_proj.weight": (inter, hidden),
            p + "mlp.down_proj.weight": (hidden, inter),
        }
    arrays = {n: rng.integers(0x3C00, 0x3D00, s, dtype=np.uint16) for n, s in shapes.items()}
    return WeightSet(arrays, {n: "BF16" for n in arrays}, version=0)


def next_version(ws: WeightSet, density: float, rng: np.random.Generator) -> WeightSet:
    out = ws.copy()
    for a in out.arrays.values():
        flat = a.reshape(-1)
        pos = np.flatnonzero(rng.random(flat.size) < density)
        flat[pos] += rng.integers(1, 4, pos.size).astype(np.uint16)
    out.version = (ws.version or 0) + 1
    out.applied_hash = None
    return out


def digest(ws: WeightSet) -> str:
    h = hashlib.sha256()
    for n in sorted(ws.arrays):
        h.update(np.ascontiguousarray(ws.arrays[n]).reshape(-1).view(np.uint8))
    return h.hexdigest()


def start_relay(tmp: Path) -> tuple[subprocess.Popen, dict]:
    ready = tmp / "relay.ready"
    env = {k: v for k, v in os.environ.items() if not k.startswith("ROLLART_")}
    env.update(
        ROLLART_LISTEN="127.0.0.1:0",
        ROLLART_METRICS_LISTEN="none",
        ROLLART_JOB_TOKEN=TOKEN,
        ROLLART_JOB_ID=JOB,
        ROLLART_JOB_KEY=KEY.decode(),
        ROLLART_READY_FILE=str(ready),
        ROLLART_CACHE_DIR=str(tmp / "cache"),
        ROLLART_LOG_LEVEL="WARNING",
    )
    exe = Path(sys.executable).parent / "rollart-relay"
    proc = subprocess.Popen([str(exe)], env=env, stdout=subprocess.DEVNULL, stderr=open(tmp / "relay.log", "wb"))
    deadline = time.time() + 30
    while not ready.exists():
        if proc.poll() is not None or time.time() > deadline:
            raise SystemExit(f"relay did not start; see {tmp}")
        time.sleep(0.05)
    return proc, json.loads(ready.read_text())


async def run(a: argparse.Namespace) -> tuple[list[tuple], int, int]:
    ks = sorted(a.k)
    n = max(ks)
    rng = np.random.default_rng(1)
    with tempfile.TemporaryDirectory(prefix="bench-catchup-") as d:
        tmp = Path(d)
        relay, info = start_relay(tmp)
        store = open_store(tmp / "checkpoints")
        pub = Publisher(
            job=JOB, key=KEY, token=TOKEN, relays=[info["address"]], checkpoint_store=store, checkpoint_every=n
        )
        await pub.start()
        try:
            ws = synthetic_model(a.params)
            keep: dict[int, WeightSet] = {}
            delta_bytes = []
            for v in range(0, n + 1):
                if v:
                    ws = next_version(ws, a.density, rng)
                if n - v in ks:
                    keep[v] = ws.copy()
                r = await pub.publish(v, ws)
                if v:
                    assert all(x.ok for x in r.relays), r.relays
                    delta_bytes.append(r.delta_bytes)
            want = digest(ws)
            rows = []
            for k in ks:
                start = keep[n - k].copy()
                sub = WeightSubscriber(
                    subscriber_id=f"k{k}", job=JOB, key=KEY, token=TOKEN, sources=[info["address"]], weights=start
                )
                t0 = time.perf_counter()
                await sub.catch_up(n)
                dt = time.perf_counter() - t0
                assert sub.active_version == n and digest(sub.weights) == want, "catch-up is not bit-exact"
                rows.append((f"deltas, K={k}", sub.bytes_fetched, dt))
                await sub.stop()
            t0 = time.perf_counter()
            info_ck = store.latest()
            loaded = store.open(info_ck.version, verify=True).copy()  # read, hash-checked, in memory
            dt = time.perf_counter() - t0
            assert info_ck.version == n and digest(loaded) == want
            rows.append(("full checkpoint", info_ck.size, dt))
            return rows, ws.nbytes, int(np.mean(delta_bytes))
        finally:
            await pub.stop()
            relay.terminate()
            relay.wait(10)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--params", type=float, default=64e6)
    ap.add_argument("--density", type=float, default=0.03, help="fraction of entries changed per version")
    ap.add_argument("--k", default="1,3,10")
    ap.add_argument("--json", type=Path, help="write the figures here")
    a = ap.parse_args(argv)
    a.k = [int(x) for x in a.k.split(",")]
    rows, model_bytes, delta = asyncio.run(run(a))
    print(
        f"model {model_bytes / 1e6:.0f} MB bf16; {a.density:.0%} of entries change per version; "
        f"mean |D| = {delta / 1e6:.1f} MB"
    )
    print(f"{'rejoin by':<18} {'bytes MB':>9} {'of model':>9} {'local s':>8} {'at 1 Gb/s s':>12}")
    for name, nbytes, dt in rows:
        print(f"{name:<18} {nbytes / 1e6:>9.1f} {nbytes / model_bytes:>8.0%} {dt:>8.2f} {dt + nbytes / LINK:>12.2f}")
    if a.json:
        a.json.write_text(json.dumps({
            "args": {"params": a.params, "density": a.density, "k": a.k},
            "model_bytes": model_bytes, "mean_delta_bytes": delta, "loadavg": os.getloadavg(),
            "rows": [{"rejoin": name, "bytes": nbytes, "local_s": dt, "at_1gbps_s": dt + nbytes / LINK}
                     for name, nbytes, dt in rows],
        }, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
