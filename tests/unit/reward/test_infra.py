"""Worker frames, the idempotency cache, sandbox mount arguments and the service configuration."""

from __future__ import annotations

import asyncio
import io
import os
import shutil
import tempfile
from pathlib import Path

import pytest

from rollart.runtime.config import ConfigError, load_config
from rollart.v1 import reward_pb2
from rollart_reward.cache import ResultCache
from rollart_reward.config import RewardConfig
from rollart_reward.protocol import FrameError, encode, read_frame, read_frame_sync
from rollart_reward.sandbox import SandboxLimits, exposure_args, rlimits, sweep_stale


async def test_frames_round_trip_sync_and_async():
    data = encode({"op": "score", "x": [1, 2]}) + encode({"op": "stop"})
    stream = io.BytesIO(data)
    assert read_frame_sync(stream) == {"op": "score", "x": [1, 2]}
    assert read_frame_sync(stream) == {"op": "stop"}
    assert read_frame_sync(stream) is None
    reader = asyncio.StreamReader()
    reader.feed_data(data[:-3])
    reader.feed_eof()
    assert await read_frame(reader) == {"op": "score", "x": [1, 2]}
    with pytest.raises(FrameError):
        await read_frame(reader)  # truncated frame: not a clean end


async def test_cache_keeps_the_first_answer_and_is_bounded():
    cache = ResultCache(capacity=2)
    first = reward_pb2.ScoreResult(trajectory_id="a", status=reward_pb2.SCORE_STATUS_OK, worker_id="w1")
    second = reward_pb2.ScoreResult(trajectory_id="a", status=reward_pb2.SCORE_STATUS_OK, worker_id="w2")
    assert (await cache.put("a", first)).worker_id == "w1"
    assert (await cache.put("a", second)).worker_id == "w1"  # first answer wins
    assert (await cache.get("a")).worker_id == "w1"
    await cache.put("b", first)
    await cache.get("a")  # a is now the most recent
    await cache.put("c", first)
    assert len(cache) == 2 and await cache.get("b") is None and await cache.get("a") is not None


@pytest.fixture
def open_tmp():
    # pytest's tmp_path lives under a root-only directory itself: use a traversable base instead.
    base = tempfile.mkdtemp(dir="/var/tmp")
    os.chmod(base, 0o755)
    yield Path(base)
    shutil.rmtree(base, ignore_errors=True)


def test_sandbox_exposes_python_under_root_only_directories(open_tmp):
    tmp_path = open_tmp
    hidden = tmp_path / "home"
    inner = hidden / "pyenv" / "versions" / "3.11"
    inner.mkdir(parents=True)
    hidden.chmod(0o700)
    open_dir = tmp_path / "open"
    open_dir.mkdir()
    args = exposure_args([str(inner), str(inner / "lib"), str(open_dir), "/does/not/exist"])
    # The root-only directory is masked, the path below it re-created traversable and bound read-only.
    assert args[:2] == ["--tmpfs", str(hidden)]
    assert ["--perms", "0755", "--dir", str(hidden / "pyenv")] == args[2:6]
    assert args[-3:] == ["--ro-bind", str(inner), str(inner)]
    assert str(open_dir) not in args and "/does/not/exist" not in args


def test_sandbox_rlimits():
    lim = rlimits(SandboxLimits(memory_mb=256, max_processes=32), budget=2.5)
    assert lim["RLIMIT_AS"] == (256 << 20, 256 << 20)
    assert lim["RLIMIT_CPU"] == (4, 5)  # ceil(budget) + 1, hard limit one more
    assert lim["RLIMIT_NPROC"] == (32, 32) and lim["RLIMIT_CORE"] == (0, 0)


def test_config_validation():
    env = {"ROLLART_JOB_TOKEN": "t", "ROLLART_POOL__MAX_WORKERS": "3", "ROLLART_TIMEOUTS__CODE": "5"}
    cfg = load_config(RewardConfig, environ=env)
    assert cfg.pool.max_workers == 3 and cfg.timeout_for("code") == 5.0 and cfg.timeout_for("math") == 10.0
    with pytest.raises(ConfigError, match="min_workers"):
        load_config(RewardConfig, environ={**env, "ROLLART_POOL__MIN_WORKERS": "4"})
    with pytest.raises(ConfigError, match="unknown scorer kinds"):
        load_config(RewardConfig, environ={**env, "ROLLART_TIMEOUTS__POETRY": "5"})
    with pytest.raises(ConfigError, match="module:function"):
        load_config(RewardConfig, environ={**env, "ROLLART_CUSTOM_SCORERS": "{mine: nocolon}"})
    assert os.cpu_count() is None or load_config(RewardConfig, environ={"ROLLART_JOB_TOKEN": "t"}).pool.max_workers >= 1


def test_stale_workspaces_of_dead_workers_are_swept(tmp_path):
    import subprocess

    dead = subprocess.Popen(["true"])
    dead.wait()
    stale = tmp_path / f"rollart-sbx-{dead.pid}-abc"
    live = tmp_path / f"rollart-sbx-{os.getpid()}-def"
    other = tmp_path / "unrelated"
    for d in (stale, live, other):
        d.mkdir()
    assert sweep_stale(str(tmp_path)) == 1
    assert not stale.exists() and live.exists() and other.exists()
