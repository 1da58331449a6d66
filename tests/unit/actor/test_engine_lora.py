"""ActorEngine in LoRA mode with a stand-in for vLLM's AsyncLLM (the engine itself runs in
tests/integration/actor/test_actor_lora.py): a request keeps the adapter version it was admitted with (its tokens
stamped with it across a switch), the previous adapter leaves the engine (and its folder the disk) only once no
request uses it, and a refused adapter changes nothing."""

from __future__ import annotations

import asyncio
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

pytest.importorskip("vllm")

from rollart_actor.config import ActorConfig  # noqa: E402
from rollart_actor.engine import ActorEngine, EngineError, Track  # noqa: E402


class FakeLLM:
    """What the engine calls on AsyncLLM in LoRA mode; generate yields one token per release."""

    def __init__(self) -> None:
        self.loaded: dict[int, str] = {}
        self.refuse = False
        self.lora_of: dict[str, Any] = {}
        self.release: dict[str, asyncio.Queue] = {}
        self.errored = False

    async def add_lora(self, req: Any) -> bool:
        if self.refuse:
            raise RuntimeError("Call to collective_rpc method failed: bad adapter_config.json")
        self.loaded[req.lora_int_id] = req.lora_path
        return True

    async def remove_lora(self, lora_id: int) -> bool:
        return self.loaded.pop(lora_id, None) is not None

    async def abort(self, ids: list[str]) -> None:
        for rid in ids:
            await self.release[rid].put(None)

    async def generate(self, prompt: Any, params: Any, request_id: str, priority: int = 0, lora_request: Any = None):
        self.lora_of[request_id] = lora_request
        q = self.release.setdefault(request_id, asyncio.Queue())
        while True:
            tok = await q.get()
            done = tok is None
            comp = SimpleNamespace(
                token_ids=[] if done else [tok], logprobs=None, text="", finish_reason="stop", stop_reason=None
            )
            yield SimpleNamespace(outputs=[comp], num_cached_tokens=0, finished=done)
            if done:
                return


def _engine(tmp_path: Path) -> tuple[ActorEngine, FakeLLM]:
    cfg = ActorConfig(model="/m", insecure_disable_auth=True, lora={"rank": 8, "alpha": 16})
    eng = ActorEngine(cfg, version=0)
    llm = FakeLLM()
    eng.llm = llm
    return eng, llm


def _folder(tmp_path: Path, v: int) -> Path:
    p = tmp_path / "adapters" / f"v{v}"
    p.mkdir(parents=True)
    (p / "adapter_config.json").write_text("{}")
    return p


async def _tokens(track: Track, n: int) -> None:
    for _ in range(200):
        if len(track.tokens) >= n:
            return
        await asyncio.sleep(0.005)
    raise AssertionError(f"{len(track.tokens)} tokens, expected {n}")


def test_requests_keep_their_adapter_and_unused_adapters_leave(tmp_path: Path) -> None:
    async def run() -> None:
        eng, llm = _engine(tmp_path)
        s1 = await eng.update_weights(str(_folder(tmp_path, 1)), 1)
        assert eng.version == 1 and eng.active_lora.lora_int_id == 2 and s1.requests_recomputed == 0
        t1 = Track("r1", "", [1, 2])
        eng.register(t1)
        eng.start_request(t1, None, 0)
        await asyncio.sleep(0)
        q1 = llm.release["r1"]
        await q1.put(7)
        await _tokens(t1, 1)
        s2 = await eng.update_weights(str(_folder(tmp_path, 2)), 2)
        assert s2.rpc["in_flight_kept"] == 1 and s2.pause_window_s >= 0
        assert set(llm.loaded) == {2, 3}  # v1 still used by r1
        await q1.put(8)
        await _tokens(t1, 2)
        assert t1.versions == [1, 1] and llm.lora_of["r1"].lora_name == "v1"  # no switch inside a request
        t2 = Track("r2", "", [3])
        eng.register(t2)
        eng.start_request(t2, None, 0)
        await asyncio.sleep(0)
        assert llm.lora_of["r2"].lora_name == "v2"
        await q1.put(None)  # r1 ends: v1 goes, with its folder
        await t1.task
        for _ in range(100):
            if 2 not in llm.loaded:
                break
            await asyncio.sleep(0.01)
        assert set(llm.loaded) == {3} and not (tmp_path / "adapters" / "v1").exists()
        assert (tmp_path / "adapters" / "v2").exists()
        await llm.release["r2"].put(None)
        await t2.task

    asyncio.run(run())


def test_a_refused_adapter_changes_nothing(tmp_path: Path) -> None:
    async def run() -> None:
        eng, llm = _engine(tmp_path)
        await eng.update_weights(str(_folder(tmp_path, 1)), 1)
        llm.refuse = True
        called = []
        with pytest.raises(EngineError) as err:
            await eng.update_weights(str(_folder(tmp_path, 2)), 2, after_load=lambda: called.append(1))
        assert err.value.code == "FAILED_PRECONDITION" and "bad adapter_config.json" in str(err.value)
        assert "collective_rpc" not in str(err.value)
        assert eng.version == 1 and eng.active_lora.lora_name == "v1" and not called
        assert not eng.updating and eng._gate.is_set()  # admissions open again
        assert set(llm.loaded) == {2}

    asyncio.run(run())


def _start(eng: ActorEngine, rid: str, job: str = "") -> Track:
    t = Track(rid, "", [1])
    t.job = job
    eng.register(t)
    eng.start_request(t, None, 0)
    return t


def test_two_jobs_keep_their_own_adapter_versions(tmp_path: Path) -> None:
    async def run() -> None:
        eng, llm = _engine(tmp_path)
        eng.adapters.add_job("b")
        await eng.update_weights(str(_folder(tmp_path, 1)), 1)
        (tmp_path / "b").mkdir()
        b1 = _folder(tmp_path / "b", 1)
        sb = await eng.update_weights(str(b1), 1, job="b")
        assert sb.from_version == 0 and sb.to_version == 1
        own, other = eng.adapters.of("").active, eng.adapters.of("b").active
        assert own.lora_int_id == 2 and other.lora_int_id not in (1, 2) and other.lora_name == "b@v1"
        ta, tb = _start(eng, "ra"), _start(eng, "rb", "b")
        await asyncio.sleep(0)
        assert llm.lora_of["ra"] is own and llm.lora_of["rb"] is other
        # b moves to v2 while rb runs: the own job's adapter and rb's are untouched; b@v1 stays for rb.
        await eng.update_weights(str(_folder(tmp_path / "b", 2)), 2, job="b")
        assert eng.version == 1 and eng.active_lora is own and eng.adapters.of("b").version == 2
        assert set(llm.loaded) == {2, other.lora_int_id, eng.adapters.of("b").active.lora_int_id}
        await llm.release["rb"].put(5)
        await _tokens(tb, 1)
        assert tb.versions == [1]
        await llm.release["rb"].put(None)
        await tb.task
        for _ in range(100):
            if other.lora_int_id not in llm.loaded:
                break
            await asyncio.sleep(0.01)
        assert other.lora_int_id not in llm.loaded and not b1.exists() and 2 in llm.loaded
        await llm.release["ra"].put(None)
        await ta.task

    asyncio.run(run())


def test_a_request_of_a_job_the_actor_does_not_serve_is_refused(tmp_path: Path) -> None:
    eng, _ = _engine(tmp_path)
    t = Track("r", "", [1])
    t.job = "nobody"
    with pytest.raises(EngineError) as err:
        eng.start_request(t, None, 0)
    assert err.value.code == "NOT_FOUND" and "'nobody'" in str(err.value)


def test_a_dropped_job_frees_its_adapters_once_its_requests_end(tmp_path: Path) -> None:
    async def run() -> None:
        eng, llm = _engine(tmp_path)
        eng.adapters.add_job("b")
        await eng.update_weights(str(_folder(tmp_path, 1)), 1, job="b")
        held = eng.adapters.of("b").active.lora_int_id
        tb = _start(eng, "rb", "b")
        await asyncio.sleep(0)
        await eng.adapters.drop_job("b")
        assert held in llm.loaded  # rb still runs on it
        with pytest.raises(EngineError):
            _start(eng, "rb2", "b")
        await llm.release["rb"].put(None)
        await tb.task
        for _ in range(100):
            if held not in llm.loaded:
                break
            await asyncio.sleep(0.01)
        assert held not in llm.loaded and not (tmp_path / "adapters" / "v1").exists()
        with pytest.raises(EngineError):
            await eng.adapters.drop_job("")  # the actor's own job stays

    asyncio.run(run())


def test_a_full_weight_engine_refuses_another_job(tmp_path: Path) -> None:
    cfg = ActorConfig(model="/m", insecure_disable_auth=True)
    eng = ActorEngine(cfg, version=0)
    with pytest.raises(EngineError) as err:
        asyncio.run(eng.update_weights("/x", 1, job="b"))
    assert err.value.code == "FAILED_PRECONDITION"
