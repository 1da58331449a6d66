"""The follower ranks' command frames and how a dead follower is named (rollart_trainer.ranks); the world itself
runs in tests/integration/trainer/test_megatron_world.py."""

from __future__ import annotations

import io
import signal
import subprocess
import sys

import pytest

from rollart.v1 import common_pb2
from rollart_trainer.grpo import TrainBatch
from rollart_trainer.ranks import MIRRORED, World, _read_frame, _write_frame


def test_a_batch_of_ledger_messages_travels_as_plain_lists() -> None:
    traj = common_pb2.Trajectory(
        trajectory_id="t", prompt_token_ids=[1, 2, 3], reward=0.5, scored=True,
        turns=[common_pb2.Turn(action_token_ids=[4, 5], action_logprobs=[-1.0, -2.0], action_versions=[0, 0])],
    )
    batch = TrainBatch.from_trajectories([traj], "b", 1)
    buf = io.BytesIO()
    _write_frame(buf, ("train_step", (batch,), {}))
    buf.seek(0)
    op, (got,), kwargs = _read_frame(buf)
    assert op == "train_step" and op in MIRRORED and kwargs == {}
    assert got == TrainBatch.from_trajectories([traj], "b", 1)
    assert type(got.samples[0].prompt_ids) is list and got.samples[0].turns[0].action_logprobs == [-1.0, -2.0]


def test_a_cut_frame_or_a_closed_pipe_reads_as_rank_0_gone() -> None:
    buf = io.BytesIO()
    _write_frame(buf, ("export", (), {}))
    whole = buf.getvalue()
    for cut in (0, 3, 8, len(whole) - 1):  # nothing, half a header, a header alone, all but the last byte nothing, half a header, a header alone, all but the last byte
        assert _read_frame(io.BytesIO(whole[:cut])) is None


def test_a_dead_follower_is_named_by_rank_pid_and_signal() -> None:
    world = World.__new__(World)  # the bookkeeping alone: no process group
    world.size = 3
    ok = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    killed = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        world.followers = [ok, killed]
        assert world.dead() == []
        killed.send_signal(signal.SIGKILL)
        killed.wait(10)
        assert world.dead() == [f"rank 2 (pid {killed.pid}) died: SIGKILL"]
        err = world._failed(None)
        assert str(err) == f"trainer world of 3 ranks broke: rank 2 (pid {killed.pid}) died: SIGKILL"
    finally:
        ok.kill()
        ok.wait()


def test_a_world_of_one_is_refused() -> None:
    with pytest.raises(ValueError, match="at least 2 ranks"):
        World(1)
