"""The score deadline (issue 19): a sample admitted unscored whose reward never comes (its scorer, the
envmanager, died between Submit and RecordReward) is un-admitted by the reaper as a failed scoring, its slot
leased again, so its group completes and the batch forms; a late reward is not counted. The ledger itself is
SIGKILLed between the Submit and the reap: the deadline is kept in Redis, not in the process."""

from __future__ import annotations

import os
import subprocess
import time

import grpc
import pytest

from rollart.local.processes import free_port, start_redis
from rollart.v1 import ledger_pb2 as lp
from rollart.v1 import ledger_pb2_grpc as lg
from tests.conftest import BIN

from .conftest import start_ledger
from .helpers import acquire, dur, policy, prompts, status, submit, version, wait_until

DEADLINE = 2.0


def test_unscored_sample_of_a_dead_scorer_is_failed_after_the_deadline_across_a_ledger_sigkill(
    services, tmp_path, channel_factory, auth_md
):
    md = auth_md
    redis_proc, url = start_redis(tmp_path / "store", port=free_port())  # AOF, appendfsync always
    try:
        proc, address = start_ledger(services, url, ROLLART_SCORE_DEADLINE_SECONDS=str(DEADLINE))
        s = lg.LedgerStub(channel_factory(address))
        policy(s, md, group_size=2)
        version(s, md, 0)
        prompts(s, md, 1)
        a, b = acquire(s, md, "env/0", n=2)
        lost = submit(s, md, a, reward=None)  # admitted, its reward to follow: then the scorer dies
        assert lost.admitted and lost.awaiting_reward
        kept = submit(s, md, b)
        assert kept.admitted
        proc.kill()  # SIGKILL before the deadline, which passes while no ledger runs: the next one reaps it
        time.sleep(DEADLINE)
        _, address2 = start_ledger(services, url, ROLLART_SCORE_DEADLINE_SECONDS=str(DEADLINE))
        s = lg.LedgerStub(channel_factory(address2))
        st = wait_until(lambda: (x := status(s, md)).accounting.failed.samples == 1 and x, timeout=DEADLINE + 10)
        assert st, status(s, md)
        assert st.accounting.failed.tokens == 3 and st.buffer.samples == 1
        # the slot is leased again at once, the group completes and its batch forms
        [c] = acquire(s, md, "env/1", wait=5)
        assert (c.group_id, c.sample_index) == (a.group_id, a.sample_index)
        redone = submit(s, md, c)
        assert redone.admitted and redone.group_complete
        batch = s.GetBatch(lp.GetBatchRequest(step=1, batch_size=2, wait=dur(5)), metadata=md)
        assert sorted(t.trajectory_id for g in batch.groups for t in g.trajectories) == sorted(
            [redone.lease.trajectory_id, kept.lease.trajectory_id]
        )
        # the dead scorer's reward arrives late: neither recorded nor unknown, and counted nothing
        late = s.RecordReward(
            lp.RecordRewardRequest(trajectory_id=lost.lease.trajectory_id, reward={"reward": 1.0}), metadata=md
        )
        assert (late.recorded, late.unknown_trajectory) == (False, False)
        # nor can anyone without the job token, or with a malformed id, touch it
        for req, meta, code in (
            (lp.RecordRewardRequest(trajectory_id=lost.lease.trajectory_id, failed=True), [], "UNAUTHENTICATED"),
            (lp.RecordRewardRequest(trajectory_id="x" * 100_000, failed=True), md, "INVALID_ARGUMENT"),
            (lp.RecordRewardRequest(trajectory_id=lost.lease.trajectory_id, reward={"reward": float("nan")}), md,
             "INVALID_ARGUMENT"),
        ):
            with pytest.raises(grpc.RpcError) as exc:
                s.RecordReward(req, metadata=meta)
            assert exc.value.code().name == code
        after = status(s, md)
        assert after.accounting.failed.samples == 1 and after.settlement.admitted == st.settlement.admitted + 1
    finally:
        redis_proc.stop()


@pytest.mark.parametrize("value", ["0", "-1", "nan", "soon"])
def test_a_bad_score_deadline_stops_the_ledger_at_start(value, redis_url, tmp_path):
    env = {"ROLLART_REDIS_URL": redis_url, "ROLLART_SCORE_DEADLINE_SECONDS": value, "ROLLART_LISTEN": "127.0.0.1:0"}
    base = {k: v for k, v in os.environ.items() if not k.startswith("ROLLART_")}
    done = subprocess.run([str(BIN / "rollart-ledger")], env=base | env, capture_output=True, timeout=60)
    assert done.returncode != 0
    assert b"score_deadline_seconds" in done.stderr + done.stdout
