"""Attached jobs (rollart_actor.job_slots): AttachJob's request checks name the field, a spec compares equal only
to the same settings, and a job's weight manager sees the shared engine through its own version (the engine
itself runs in tests/integration/actor/test_actor_jobs.py)."""

from __future__ import annotations

import asyncio

import pytest

pytest.importorskip("vllm")

from rollart.v1 import actor_pb2  # noqa: E402
from rollart_actor.config import LORA_TARGETS, ActorConfig  # noqa: E402
from rollart_actor.engine import ActorEngine  # noqa: E402
from rollart_actor.host_weights import WeightError  # noqa: E402
from rollart_actor.job_slots import JobEngine, JobSpec  # noqa: E402


def req(**over: object) -> actor_pb2.AttachJobRequest:
    r = actor_pb2.AttachJobRequest(job_id="job-b", job_key=b"k" * 32, rank=8, alpha=16.0, ledger="127.0.0.1:1")
    r.weight_source.checkpoint_store = "/store"
    for k, v in over.items():
        setattr(r, k, v)
    return r


def test_a_good_request_takes_the_actors_modules_by_default() -> None:
    spec = JobSpec.from_request(req(), LORA_TARGETS)
    assert spec.target_modules == tuple(LORA_TARGETS) and spec.streams == 4 and spec.ledger == "127.0.0.1:1"
    assert spec == JobSpec.from_request(req(), LORA_TARGETS)
    assert spec != JobSpec.from_request(req(alpha=8.0), LORA_TARGETS)
    assert spec.lora().rank == 8


@pytest.mark.parametrize(
    "over, field",
    [
        ({"job_id": ""}, "job_id"),
        ({"job_id": "a b"}, "job_id"),
        ({"job_key": b"short"}, "job_key"),
        ({"job_key": b"k" * 65}, "job_key"),
        ({"rank": 0}, "rank"),
        ({"rank": 257}, "rank"),
        ({"alpha": 0.0}, "alpha"),
        ({"alpha": float("nan")}, "alpha"),
    ],
)
def test_bad_requests_name_the_field(over: dict, field: str) -> None:
    with pytest.raises(WeightError) as err:
        JobSpec.from_request(req(**over), LORA_TARGETS)
    assert err.value.code == "INVALID_ARGUMENT" and str(err.value).startswith(field + ":")


def test_bad_modules_and_a_missing_store_are_refused() -> None:
    r = req()
    r.target_modules.append("q_proj; rm -rf /")
    with pytest.raises(WeightError, match="target_modules"):
        JobSpec.from_request(r, LORA_TARGETS)
    r = req()
    r.weight_source.checkpoint_store = ""
    with pytest.raises(WeightError, match="weight_source.checkpoint_store"):
        JobSpec.from_request(r, LORA_TARGETS)


def test_job_engine_reads_and_moves_its_own_jobs_version_only() -> None:
    eng = ActorEngine(ActorConfig(model="/m", insecure_disable_auth=True, lora={"rank": 8, "alpha": 16}), version=2)
    eng.adapters.add_job("job-b")
    je = JobEngine(eng, "job-b")
    assert je.version == 0 and eng.version == 2
    je.version = 5  # an empty delta: the version moves, no adapter is loaded
    assert eng.adapters.of("job-b").version == 5 and eng.version == 2

    calls: list[tuple] = []

    async def update_weights(payload, to_version, **kw):  # the engine's, recorded
        calls.append((payload, to_version, kw["job"]))

    eng.update_weights = update_weights  # type: ignore[method-assign]
    asyncio.run(je.update_weights("/f", 6))
    assert calls == [("/f", 6, "job-b")]


async def test_a_job_whose_ledger_stopped_answering_is_detached_and_one_that_answers_is_not() -> None:
    import time
    from types import SimpleNamespace

    from rollart_actor.job_slots import JobSlot

    stopped: list[str] = []

    def slot(job_id: str, answered_ago: float) -> JobSlot:
        s = JobSlot.__new__(JobSlot)  # the watchdog only: no engine, no subscriptions
        s.spec = JobSpec.from_request(req(job_id=job_id), LORA_TARGETS)
        s.ledger = SimpleNamespace(answered_at=time.monotonic() - answered_ago)  # type: ignore[assignment]
        s._tasks, s._orphaned, s.actor = set(), None, actor

        async def stop() -> None:
            stopped.append(job_id)

        s.stop = stop  # type: ignore[method-assign]
        return s

    actor = SimpleNamespace(cfg=SimpleNamespace(job_id="own"), jobs={})
    dead, alive = slot("job-dead", 5.0), slot("job-alive", 0.0)
    actor.jobs.update({"job-dead": dead, "job-alive": alive})
    watchers = [asyncio.ensure_future(s._watch_ledger(1.0)) for s in (dead, alive)]
    await asyncio.wait_for(watchers[0], 2)
    await asyncio.wait_for(dead._orphaned, 2)  # type: ignore[arg-type]
    assert stopped == ["job-dead"] and list(actor.jobs) == ["job-alive"]
    for _ in range(4):  # the live one keeps answering: never detached
        alive.ledger.answered_at = time.monotonic()  # type: ignore[union-attr]
        await asyncio.sleep(0.3)
    assert not watchers[1].done() and stopped == ["job-dead"]
    watchers[1].cancel()
