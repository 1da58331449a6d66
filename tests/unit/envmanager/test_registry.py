"""The registry: built-ins, availability, user registration (decorator, mapping, entry points), task configs."""

import pytest
from google.protobuf.duration_pb2 import Duration

from rollart.v1 import envmanager_pb2
from rollart_envmanager import (
    EnvConfigError,
    EnvRegistry,
    EnvUnavailable,
    StepResult,
    TaskConfig,
    UnknownEnvironment,
    default_registry,
    open_env,
    register_environment,
)
from rollart_envmanager.envs.base import ActionError, Env, EnvStateError
from rollart_envmanager.envs.info import EnvInfo


class Counter(Env):
    """Counts to a target: says 'up' until the count reaches it."""

    default_max_turns = 10

    def __init__(self, target: str = "3", **options):
        super().__init__(**options)
        self.target = int(target)
        self.count = 0

    def _reset(self, seed):
        self.count = 0
        self.metadata = {"target": str(self.target)}
        return f"count to {self.target}"

    def _step(self, action):
        if action.strip() != "up":
            return StepResult("say up", 0.0, False, {"invalid_action": True})
        self.count += 1
        done = self.count >= self.target
        return StepResult(f"at {self.count}", 1.0 if done else 0.0, done)


def test_builtins_cover_every_source():
    reg = default_registry()
    sources = {i.source for i in reg.list()}
    assert {"reasoning_gym", "gem", "textarena", "gymnasium", "code", "swe"} <= sources
    assert reg.get("reasoning_gym:basic_arithmetic").default_reward == "reasoning_gym"
    assert reg.get("gem:game:Sokoban-v0-easy").default_backend == "process"
    assert "in_process" not in reg.get("textarena:TicTacToe-v0").supported_backends
    assert reg.get("swe:builtin").default_backend == "docker"


def test_unavailable_entries_are_listed_only_on_request():
    reg = default_registry()
    broken = reg.get("gem:game:FifteenPuzzle-v0-random")
    assert not broken.available and "bug" in broken.availability()[1]
    ids = {i.id for i in reg.list(source="gem")}
    assert broken.id not in ids
    assert broken.id in {i.id for i in reg.list(source="gem", include_unavailable=True)}
    with pytest.raises(EnvUnavailable):
        open_env("gem:game:FifteenPuzzle-v0-random")


def test_unknown_ids_and_options():
    reg = default_registry()
    with pytest.raises(UnknownEnvironment):
        reg.get("nope:thing")
    with pytest.raises(UnknownEnvironment):
        reg.get("reasoning_gym:no_such_dataset")
    with pytest.raises(EnvConfigError, match="unknown option"):
        TaskConfig("gymnasium:FrozenLake-v1", options={"colour": "blue"}).resolve()
    with pytest.raises(EnvConfigError, match="does not run on"):
        TaskConfig("gem:game:Sokoban-v0-easy", backend="in_process").resolve()
    with pytest.raises(ValueError):
        TaskConfig("gymnasium:FrozenLake-v1", backend="vm")


def test_decorator_registration_and_use():
    reg = EnvRegistry()
    register_environment("custom:counter", options={"target": "how far to count"}, registry=reg)(Counter)
    info = reg.get("custom:counter")
    assert info.source == "custom" and info.factory.endswith(":Counter") and info.description.startswith("Counts")
    with open_env(TaskConfig("custom:counter", backend="in_process", options={"target": "2"}), registry=reg) as env:
        assert env.reset(seed=0) == "count to 2"
        assert env.metadata == {"target": "2"}
        assert env.step("down").info["invalid_action"] is True
        assert env.step("up").done is False
        last = env.step("up")
        assert last.done and last.reward == 1.0
        with pytest.raises(EnvStateError):
            env.step("up")
    with pytest.raises(ValueError, match="already registered"):
        register_environment("custom:counter", registry=reg)(Counter)


def test_mapping_registration():
    reg = EnvRegistry()
    info = reg.register_from_mapping({
        "id": "custom:counter2", "factory": f"{__name__}:Counter", "supported_backends": ["in_process"],
        "default_backend": "in_process", "options": {"target": "t"},
    })
    assert info.supported_backends == ("in_process",)
    assert reg.make("custom:counter2", target="1").reset() == "count to 1"
    with pytest.raises(EnvConfigError):
        reg.register_from_mapping({"id": "x"})
    with pytest.raises(EnvConfigError):
        reg.register_from_mapping({"id": "x", "factory": "m:f", "source": "martian"})


def test_missing_factory_module_is_unavailable():
    reg = EnvRegistry()
    reg.register(EnvInfo(id="custom:ghost", source="custom", factory="no_such_module_xyz:Env",
                         requires=("no_such_module_xyz",)))
    assert not reg.get("custom:ghost").available
    with pytest.raises(EnvUnavailable):
        reg.make("custom:ghost")


def test_env_base_validates_calls():
    env = Counter()
    with pytest.raises(EnvStateError):
        env.step("up")
    env.reset()
    for bad in (None, 5, b"up", "x" * 300_000, "u\x00p"):
        with pytest.raises(ActionError):
            env.step(bad)
    assert env.turn == 0  # rejected actions do not count


def test_task_config_from_proto_and_dict():
    spec = envmanager_pb2.EnvironmentSpec(
        environment="code:builtin", task="code-easy", options={"task": "fizzbuzz"}, max_turns=3,
        sandbox=envmanager_pb2.SandboxSpec(
            backend=envmanager_pb2.SANDBOX_BACKEND_DOCKER, memory_mib=256, cpu_limit=0.5, pids_limit=32,
            time_budget=Duration(seconds=90), step_timeout=Duration(seconds=20), options={"image": "img:1"},
        ),
        latency=envmanager_pb2.LatencyDistribution(kind=envmanager_pb2.DISTRIBUTION_KIND_CONSTANT,
                                                   mean=Duration(nanos=250_000_000)),
    )
    cfg = TaskConfig.from_proto(spec)
    assert cfg.backend == "docker" and cfg.task_tag == "code-easy" and cfg.max_turns == 3
    assert (cfg.limits.memory_mib, cfg.limits.cpu_limit, cfg.limits.pids_limit) == (256, 0.5, 32)
    assert (cfg.limits.time_budget_s, cfg.limits.step_timeout_s) == (90.0, 20.0)
    assert cfg.limits.workspace_mib == 256  # unset: default kept
    assert cfg.latency.kind == "constant" and cfg.latency.mean == 0.25
    assert cfg.sandbox_options == {"image": "img:1"}
    info, backend, turns = cfg.resolve()
    assert (info.id, backend, turns) == ("code:builtin", "docker", 3)

    cfg2 = TaskConfig.from_dict({"environment": "gymnasium:FrozenLake-v1", "latency": "normal(0.2, 0.05)",
                                 "limits": {"step_timeout_s": 5}})
    assert cfg2.latency.kind == "normal" and cfg2.limits.step_timeout_s == 5
    with pytest.raises(EnvConfigError):
        TaskConfig.from_dict({"environment": "x", "colour": 1})


def test_list_environments_proto():
    from rollart.v1 import common_pb2
    from rollart_envmanager.convert import list_environments

    resp = list_environments(envmanager_pb2.ListEnvironmentsRequest(source=envmanager_pb2.ENV_SOURCE_SWE))
    (swe,) = resp.environments
    assert swe.id == "swe:builtin" and swe.available and swe.multi_turn
    assert swe.default_backend == envmanager_pb2.SANDBOX_BACKEND_DOCKER
    assert envmanager_pb2.SANDBOX_BACKEND_BWRAP in swe.supported_backends
    assert swe.default_reward.kind == common_pb2.SCORER_KIND_GAME and "repo" in swe.options
    everything = list_environments(envmanager_pb2.ListEnvironmentsRequest(include_unavailable=True))
    by_id = {e.id: e for e in everything.environments}
    assert by_id["reasoning_gym:basic_arithmetic"].default_reward.scorer == "basic_arithmetic"
    assert not by_id["gem:game:FifteenPuzzle-v0-random"].available
    assert by_id["gem:game:FifteenPuzzle-v0-random"].unavailable_reason
    assert len(everything.environments) > len(list_environments(envmanager_pb2.ListEnvironmentsRequest()).environments)
    with pytest.raises(ValueError):
        list_environments(envmanager_pb2.ListEnvironmentsRequest(source=99))


def test_live_sandbox_counts():
    from rollart_envmanager.sandbox import live_sandboxes, make_sandbox

    before = live_sandboxes().get("process", 0)
    with make_sandbox("process"):
        assert live_sandboxes()["process"] == before + 1
    assert live_sandboxes().get("process", 0) == before
