"""Mooncake pulls hidden behind rollout: the actor's WeightManager pulls a newly published version in the
background (its event loop keeps running, as generation would) and a later PullBuckets(apply) pauses only
for the swap. Real ``mooncake_master``, the publisher in a peer process, the puller in this one.
"""

from __future__ import annotations

import asyncio
import importlib.util
import signal
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pytest

from rollart.delta import load_safetensors, save_safetensors
from rollart.local.mooncake import mooncake_master_binary, start_mooncake_master
from rollart_actor.weights import HostWeights, WeightManager
from tests.integration.weights.bucket_testlib import MIB, synthetic_model
from tests.integration.weights.test_buckets import Peer

pytestmark = pytest.mark.skipif(
    mooncake_master_binary() is None or importlib.util.find_spec("mooncake") is None,
    reason="mooncake (mooncake-transfer-engine-non-cuda) is not installed",
)

SWAP_S = 0.05


@dataclass
class _Stats:
    requests_recomputed: int = 0
    recomputed_tokens: int = 0
    prefix_cache_reset: bool = True
    pause_window_s: float = SWAP_S
    load_s: float = SWAP_S
    aborted: int = 0
    rpc: dict = field(default_factory=dict)
    completed_at: float = 0.0


class SwapEngine:
    """Loads the payload like the worker extension; the swap takes SWAP_S (its pause window)."""

    def __init__(self) -> None:
        self.served: dict[str, np.ndarray] = {}
        self.version = 0

    async def update_weights(self, payload, to_version, *, mode="keep", wait_timeout=60.0, after_load=None):
        ws = load_safetensors(payload)
        self.served = {n: np.array(a, copy=True) for n, a in ws.arrays.items()}
        await asyncio.sleep(SWAP_S)
        if after_load is not None:
            after_load()
        self.version = to_version
        return _Stats(rpc={"tensors": len(ws.arrays)})


@pytest.fixture
def master(tmp_path):
    m = start_mooncake_master(tmp_path / "mooncake")
    yield m
    if m.proc is not None and m.alive():
        m.proc.signal(signal.SIGCONT)
    m.stop()


def _manager(tmp_path: Path) -> tuple[WeightManager, SwapEngine]:
    d = tmp_path / "model"
    d.mkdir()
    save_safetensors(d / "model.safetensors", synthetic_model(1))
    engine = SwapEngine()
    return WeightManager(HostWeights.load(d, 0), engine, tmp_path / "work", key=b"k" * 32, job="bucket-test"), engine


async def test_background_pull_then_swap_pauses_only_for_the_swap(master, tmp_path: Path) -> None:
    peer = Peer(tmp_path / "publisher.log")
    manager, engine = _manager(tmp_path)
    try:
        peer.ok("connect", master=master.address, role="publisher", bucket_bytes=MIB, keep=2)
        manager.watch_buckets(master.address, interval=0.05)
        # Rollout goes on: a ticker stands for generation and must keep running during the pull.
        gaps: list[float] = []
        stop = asyncio.Event()

        async def ticker() -> None:
            last = time.monotonic()
            while not stop.is_set():
                await asyncio.sleep(0.005)
                now = time.monotonic()
                gaps.append(now - last)
                last = now

        tick = asyncio.ensure_future(ticker())
        await asyncio.to_thread(peer.ok, "publish", version=1, synthetic=2)
        deadline = time.monotonic() + 60
        while not (1 in manager.bucket_pulls and manager.bucket_pulls[1].task.done()):
            assert time.monotonic() < deadline, "the watcher did not pull v1"
            await asyncio.sleep(0.02)
        pull = manager.bucket_pulls[1]
        assert pull.background and pull.task.exception() is None
        stop.set()
        await tick
        assert engine.version == 0 and manager.host.version == 0  # pulled, not applied: nothing paused
        assert max(gaps) < 1.0, f"the event loop stalled {max(gaps):.2f}s during the background pull"

        res = await manager.pull_buckets(master.address, 1, apply=True)
        assert res.applied.applied and res.applied.to_version == 1 and engine.version == 1
        want = synthetic_model(2)
        assert all(np.array_equal(engine.served[n], np.asarray(a)) for n, a in want.arrays.items())
        acc = manager.pull_accounts[-1]
        assert acc.version == 1 and acc.background
        assert acc.exposed_s < 0.2 * acc.accumulated_s + 0.02, acc  # the pull was done before it was needed
        assert acc.swap_s == pytest.approx(SWAP_S, abs=0.02)

        # A version nobody pulled ahead (the watcher is told to wait): all of its pull is exposed.
        manager._bucket_watch.cancel()  # type: ignore[union-attr]
        await asyncio.to_thread(peer.ok, "publish", version=2, synthetic=3)
        await manager.pull_buckets(master.address, 2, apply=True)
        acc2 = manager.pull_accounts[-1]
        assert not acc2.background and acc2.exposed_s >= 0.9 * acc2.accumulated_s
        summary = manager.pull_summary()
        assert summary["updates"] == 2 and 0 < summary["hidden_fraction"] < 1
    finally:
        await manager.stop_buckets()
        peer.close()
