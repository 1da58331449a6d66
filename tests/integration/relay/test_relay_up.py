"""`rollart up --only relay`: the relay starts with a job key, its data endpoint is in the state file."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import grpc
import numpy as np

from rollart.runtime.auth import bearer
from rollart.v1 import relay_pb2, relay_pb2_grpc
from rollart.weights import transport as tp
from tests.unit.weights.weights_testlib import model, step

ROLLART = str(Path(sys.executable).parent / "rollart")


def rollart(state: Path, *args: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith("ROLLART_")}
    return subprocess.run(
        [ROLLART, "--state-dir", str(state), *args], capture_output=True, text=True, timeout=90, env=env
    )


def test_rollart_up_starts_a_relay_with_its_data_endpoint(tmp_path: Path) -> None:
    state_dir = tmp_path / "state"
    up = rollart(state_dir, "up", "--only", "relay")
    assert up.returncode == 0, up.stdout + up.stderr
    try:
        state = json.loads((state_dir / "state.json").read_text())
        relay = state["services"]["relay"]
        assert relay["data_endpoint"].startswith("127.0.0.1:")
        key_file = state_dir / "job-key"
        assert oct(key_file.stat().st_mode & 0o777) == "0o600"
        token = (state_dir / "job-token").read_text().strip()
        with grpc.insecure_channel(relay["address"]) as ch:
            st = relay_pb2_grpc.RelayStub(ch).GetStatus(
                relay_pb2.RelayStatusRequest(), metadata=[bearer(token)], timeout=5
            )
        assert st.data_endpoint == relay["data_endpoint"] and st.relay_id
        # The job key from the state dir opens the data plane; the delta lands in the relay's cache.
        key = key_file.read_bytes().strip()
        rng = np.random.default_rng(0)
        base = model(rng)
        from rollart.delta import encode_delta

        segs = list(encode_delta(base, step(rng, base), job="default", version=1, key=key))
        stats = asyncio.run(tp.send_delta(relay["data_endpoint"], segs, job="default", key=key, version=1, timeout=10))
        assert stats.segments == len(segs)
        deadline = time.time() + 10  # the cache file is written just after the delta completes
        while not list((state_dir / "relay-cache").glob("*.dseg")):
            assert time.time() < deadline, "the relay did not cache the delta"
            time.sleep(0.05)
    finally:
        down = rollart(state_dir, "down")
    assert down.returncode == 0, down.stdout + down.stderr
