"""GetBatch with dynamic sampling (issue 25 item 4) on a real ledger over a real redis-server: zero-variance
groups are filtered and counted, and the ledger and its redis-server SIGKILLed and restarted (AOF, appendfsync
always) between the attempt that filtered and the one that forms the batch, and again before the batch is
acknowledged, keep the accounting exact: nothing filtered twice, nothing filtered counted as trained."""

from __future__ import annotations

import grpc
import pytest

from rollart.local.processes import free_port, start_redis
from rollart.v1 import common_pb2
from rollart.v1 import ledger_pb2 as lp
from rollart.v1 import ledger_pb2_grpc as lg

from .conftest import start_ledger
from .helpers import acquire, dur, policy, prompts, status, trajectory, version

TOK = 3  # action tokens of helpers.trajectory's one turn


def complete(s, md, rewards: list[tuple[float, float]]) -> list[str]:
    """The next len(rewards) groups leased and admitted, the i-th group's samples with rewards[i]."""
    leases = acquire(s, md, "env/a", n=2 * len(rewards))
    gids = list(dict.fromkeys(le.group_id for le in leases))
    assert len(leases) == 2 * len(rewards) and len(gids) == len(rewards)
    for le in leases:
        r = rewards[gids.index(le.group_id)][le.sample_index]
        req = lp.SubmitRequest(trajectory=trajectory(le), holder="env/a", reward=common_pb2.RewardOutcome(reward=r))
        assert s.Submit(req, metadata=md).admitted
    return gids


def get_batch(s, md, wait: float = 2.0) -> lp.Batch:
    req = lp.GetBatchRequest(step=1, batch_size=4, current_version=0, wait=dur(wait), drop_zero_variance=True)
    return s.GetBatch(req, metadata=md, timeout=wait + 10)


def test_filtered_groups_counted_once_across_sigkills_of_ledger_and_redis(services, tmp_path, channel_factory, auth_md):
    md = auth_md
    port = free_port()
    redis_proc, url = start_redis(tmp_path / "store", port=port)  # AOF, appendfsync always
    try:
        proc, address = start_ledger(services, url)
        s = lg.LedgerStub(channel_factory(address))
        policy(s, md, group_size=2)
        version(s, md, 0)
        prompts(s, md, 6)
        flat, varied = complete(s, md, [(1.0, 1.0), (0.0, 1.0)])
        with pytest.raises(grpc.RpcError) as exc:
            get_batch(s, md, wait=0.3)  # filters the flat group, then waits for a second kept group
        assert exc.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
        acc = status(s, md).accounting
        assert (acc.filtered.samples, acc.filtered.tokens, acc.trained.samples) == (2, 2 * TOK, 0)

        def restart() -> lg.LedgerStub:
            nonlocal redis_proc, proc
            proc.kill()
            redis_proc.kill()
            redis_proc, url2 = start_redis(tmp_path / "store", port=port)
            assert url2 == url
            proc, address2 = start_ledger(services, url)
            return lg.LedgerStub(channel_factory(address2))

        s = restart()
        assert status(s, md).accounting.filtered.samples == 2
        [third] = complete(s, md, [(0.0, 0.5)])
        batch = get_batch(s, md)
        assert [g.group_id for g in batch.groups] == [varied, third] and flat not in {g.group_id for g in batch.groups}
        assert (batch.filtered_groups, batch.filtered_samples, batch.filtered_tokens) == (1, 2, 2 * TOK)
        assert batch.accounting.filtered.samples == 2

        s = restart()  # formed, not acknowledged: the retry returns it as it was
        again = get_batch(s, md)
        assert again.batch_id == batch.batch_id and again.filtered_groups == 1 and again.filtered_samples == 2
        s.AckBatch(lp.AckBatchRequest(step=1, batch_id=batch.batch_id), metadata=md)
        st = status(s, md)
        acc = st.accounting
        assert (acc.trained.samples, acc.filtered.samples, acc.filtered.tokens) == (4, 2, 2 * TOK)
        assert st.settlement.admitted == acc.trained.samples + acc.filtered.samples + st.buffer.samples == 6
        assert acc.wasted_token_fraction == pytest.approx(2 / 6)
    finally:
        redis_proc.stop()
