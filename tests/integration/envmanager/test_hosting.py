"""Hosting environments on the in-process, process and bwrap backends: the protocol, failures, limits."""

import os
import signal
import time

import pytest

from rollart_envmanager import (
    ActionError,
    EnvConfigError,
    EnvRegistry,
    EnvStateError,
    FailureCause,
    LatencySpec,
    SandboxFailure,
    SandboxLimits,
    TaskConfig,
    open_env,
)
from rollart_envmanager.envs.info import EnvInfo
from rollart_envmanager.sandbox import availability
from rollart_envmanager.sandbox.bwrap import _uid_pids

ECHO = "tests.integration.envmanager.helper_envs:EchoEnv"


@pytest.fixture(scope="module")
def reg() -> EnvRegistry:
    r = EnvRegistry()
    r.register(EnvInfo(id="test:echo", source="custom", factory=ECHO, default_backend="process",
                       supported_backends=("in_process", "process", "bwrap"), default_max_turns=100,
                       options={"sleep_s": "seconds the 'sleep' action sleeps"}))
    return r


def cfg(backend: str, **limits) -> TaskConfig:
    return TaskConfig("test:echo", backend=backend, options={"sleep_s": "30"},
                      limits=SandboxLimits(**{"step_timeout_s": 10, "time_budget_s": 60, "memory_mib": 1024, **limits}))


def test_process_backend_survives_a_sigkilled_child(reg):
    with open_env(cfg("process"), registry=reg) as env:
        env.reset(seed=1)
        first = env.step("hello")
        pid = first.info["pid"]
        assert pid != os.getpid() and first.observation == "you said hello"
        os.kill(pid, signal.SIGKILL)
        with pytest.raises(SandboxFailure) as err:
            env.step("again")
        assert err.value.cause is FailureCause.CRASH
        assert "SIGKILL" in err.value.message
        # the next episode gets a fresh child
        assert env.reset(seed=2) == "echo 2"
        assert env.step("x").info["pid"] != pid


def test_child_exit_and_environment_errors(reg):
    with open_env(cfg("process"), registry=reg) as env:
        env.reset()
        assert env.step("print").observation == "you said print"  # stray stdout does not break the protocol
        with pytest.raises(SandboxFailure) as err:
            env.step("raise")
        assert err.value.cause is FailureCause.ENV_ERROR and "environment bug" in err.value.message
        assert env.step("still alive").reward == 0.5  # an env exception does not kill the host
        with pytest.raises(SandboxFailure) as err:
            env.step("exit")
        assert err.value.cause is FailureCause.CRASH and "exited with code 3" in err.value.message


def test_step_timeout_kills_the_child(reg):
    with open_env(cfg("process", step_timeout_s=1.5), registry=reg) as env:
        env.reset()
        t0 = time.monotonic()
        with pytest.raises(SandboxFailure) as err:
            env.step("sleep")
        assert err.value.cause is FailureCause.TIMEOUT
        assert time.monotonic() - t0 < 5


def test_time_budget_of_the_episode(reg):
    with open_env(cfg("process", step_timeout_s=10, time_budget_s=2), registry=reg) as env:
        env.reset()
        with pytest.raises(SandboxFailure) as err:
            env.step("sleep")
        assert err.value.cause is FailureCause.BUDGET


def test_memory_limit_of_the_child(reg):
    with open_env(cfg("process", memory_mib=1024), registry=reg) as env:
        env.reset()
        with pytest.raises(SandboxFailure) as err:
            env.step("hog")
        assert err.value.cause is FailureCause.MEMORY


def test_malformed_calls(reg):
    with open_env(cfg("process"), registry=reg) as env:
        with pytest.raises(EnvStateError):
            env.step("before reset")
        env.reset()
        for bad in (None, 3, ["a"], "x" * 300_000):
            with pytest.raises(ActionError):
                env.step(bad)
        env.step("stop")
        with pytest.raises(EnvStateError):
            env.step("after done")
        with pytest.raises(EnvConfigError):
            env.reset(seed="seven")


def test_turn_limit_and_latency(reg):
    config = TaskConfig("test:echo", backend="in_process", max_turns=2, latency=LatencySpec.parse("fixed(0.05)"))
    with open_env(config, registry=reg) as env:
        env.reset()
        t0 = time.monotonic()
        r1 = env.step("a")
        assert time.monotonic() - t0 >= 0.05 and r1.info["injected_latency_s"] == 0.05 and not r1.done
        r2 = env.step("b")
        assert r2.done and r2.info["truncated"] is True


def test_in_process_errors_are_typed(reg):
    with open_env(cfg("in_process", step_timeout_s=0.2), registry=reg) as env:
        env.reset()
        with pytest.raises(SandboxFailure) as err:
            env.step("raise")
        assert err.value.cause is FailureCause.ENV_ERROR
    config = TaskConfig("test:echo", backend="in_process", options={"sleep_s": "0.4"},
                        limits=SandboxLimits(step_timeout_s=0.2))
    with open_env(config, registry=reg) as env:
        env.reset()
        with pytest.raises(SandboxFailure) as err:
            env.step("sleep")  # cannot be preempted in-process: reported after the fact
        assert err.value.cause is FailureCause.TIMEOUT


@pytest.mark.skipif(not availability("bwrap")[0], reason=f"bwrap unavailable: {availability('bwrap')[1]}")
def test_bwrap_hosted_env_runs_unprivileged_without_network(reg):
    with open_env(cfg("bwrap"), registry=reg) as env:
        env.reset()
        pid = env.step("x").info["pid"]
        assert pid == 2  # own PID namespace: bwrap's init is 1
        # SIGKILL the environment process inside the sandbox (it runs under the sandbox's own uid)
        victims = _uid_pids(env.host.sandbox.uid)
        assert victims
        for p in victims:
            os.kill(p, signal.SIGKILL)
        with pytest.raises(SandboxFailure) as err:
            env.step("y")
        assert err.value.cause is FailureCause.CRASH
        assert env.reset(seed=5) == "echo 5"  # a fresh sandbox and child


def test_sandboxes_are_released(reg):
    from rollart_envmanager.sandbox import live_sandboxes

    before = live_sandboxes()
    for backend in ("in_process", "process"):
        env = open_env(cfg(backend), registry=reg)
        env.reset()
        env.step("x")
        assert live_sandboxes().get(backend, 0) == before.get(backend, 0) + 1
        env.close()
    assert live_sandboxes() == before


@pytest.mark.skipif(not availability("bwrap")[0], reason=f"bwrap unavailable: {availability('bwrap')[1]}")
def test_bwrap_host_outlives_the_thread_that_opened_it(reg):
    # bwrap --die-with-parent fires when the forking *thread* exits; loops open envs from worker threads
    import threading

    box = {}
    t = threading.Thread(target=lambda: box.update(env=open_env(cfg("bwrap"), registry=reg)))
    t.start()
    t.join()
    env = box["env"]
    try:
        time.sleep(0.3)
        assert env.host.alive()
        env.reset()
        assert env.step("still here").observation == "you said still here"
    finally:
        env.close()
