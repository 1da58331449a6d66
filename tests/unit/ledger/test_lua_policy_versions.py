"""ensure_policy, set_policy and register_version, each run on its own against a real Redis."""

from __future__ import annotations

import pytest

from rollart.v1 import common_pb2
from rollart.v1 import ledger_pb2 as lp
from rollart_ledger import policy as pol
from rollart_ledger.errors import LedgerError
from tests.integration.ledger.helpers import dur, h


class TestEnsurePolicy:
    async def test_writes_the_defaults_once(self, blank):
        defaults = pol.defaults("")
        assert await blank.scripts.ensure_policy(defaults) is True
        stored = await blank.hash("pol")
        assert {k: float(v) for k, v in stored.items()} == pol.fields(defaults)
        assert await blank.get("ttl") == "300000"  # the initial TTL, before any completion

        other = pol.fill(lp.JobPolicy(job_id="j", group_size=4), "")
        assert await blank.scripts.ensure_policy(other) is False
        assert float((await blank.hash("pol"))["G"]) == 8.0  # left alone


class TestSetPolicy:
    async def test_first_call_fixes_the_job_and_takes_effect_at_once(self, store):
        filled = pol.fill(lp.JobPolicy(job_id="job-1", group_size=4, initial_lease_ttl=dur(10)), "")
        assert await store.scripts.set_policy(filled) == "pol"
        assert await store.get("job") == "job-1"
        assert lp.JobPolicy.FromString(await store.redis.get(store.k("policy"))) == filled
        assert (await store.hash("pol"))["G"] == "4.0"
        assert await store.get("ttl") == "10000"  # the TTL in force follows the new policy

    async def test_another_job_is_refused_and_nothing_changes(self, store):
        await store.policy(job="job-1", group_size=4)
        with pytest.raises(LedgerError) as exc:
            await store.policy(job="job-2", group_size=6)
        assert exc.value.code == "FAILED_PRECONDITION"
        assert await store.get("job") == "job-1"
        assert (await store.hash("pol"))["G"] == "4.0"
        assert lp.JobPolicy.FromString(await store.redis.get(store.k("policy"))).group_size == 4

    async def test_after_a_plan_the_policy_waits_for_the_next_step(self, store):
        await store.policy(group_size=4)
        await store.redis.hset(store.k("cur"), mapping={"step": 1, "v": 0, "B": 8})
        assert await store.scripts.set_policy(pol.fill(lp.JobPolicy(job_id="job-1", group_size=6), "")) == "pol:next"
        assert (await store.hash("pol"))["G"] == "4.0"
        assert (await store.hash("pol:next"))["G"] == "6.0"
        # GetJobPolicy's record is the last one set
        assert lp.JobPolicy.FromString(await store.redis.get(store.k("policy"))).group_size == 6


class TestRegisterVersion:
    async def test_appends_and_broadcasts(self, store):
        v0 = common_pb2.PolicyVersion(version=0, base_version=-1, hash=h(0))
        got = await store.scripts.register_version(v0)
        assert got.created and got.recorded == v0
        assert await store.get("latest") == "0"
        assert await store.redis.hget(store.k("vhash"), "0") == h(0)
        assert await store.zmembers("vers") == ["0"]
        [cmd] = await store.commands()
        assert cmd.WhichOneof("command") == "version_published" and cmd.version_published.version == v0
        assert cmd.target == "" and set(cmd.kinds) == {lp.SUBSCRIBER_KIND_ACTOR, lp.SUBSCRIBER_KIND_RELAY}

    async def test_again_is_a_no_op_that_returns_what_was_recorded(self, store):
        await store.version(0)
        changed = common_pb2.PolicyVersion(version=0, base_version=-1, hash=h(99))
        got = await store.scripts.register_version(changed)
        assert not got.created and got.recorded.hash == h(0)
        assert await store.redis.hget(store.k("vhash"), "0") == h(0)
        assert len(await store.commands()) == 1

    @pytest.mark.parametrize(
        "version, base, why",
        [(1, 0, "is not greater than the latest (2)"), (5, 4, "base version 4 is not registered")],
    )
    async def test_refusals_change_nothing(self, store, version, base, why):
        await store.version(0)
        await store.scripts.register_version(common_pb2.PolicyVersion(version=2, base_version=0, hash=h(2)))
        with pytest.raises(LedgerError) as exc:
            await store.scripts.register_version(common_pb2.PolicyVersion(version=version, base_version=base, hash=h(9)))
        assert exc.value.code == "FAILED_PRECONDITION" and why in exc.value.message
        assert await store.get("latest") == "2"
        assert await store.zmembers("vers") == ["0", "2"]
        assert await store.redis.hlen(store.k("vhash")) == 2
        assert len(await store.commands()) == 2
