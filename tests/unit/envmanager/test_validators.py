"""The EnvManager's request checks (rollart_envmanager.validators): same messages as before, path-like strings
clean before they reach a sandbox backend or the registry."""

from __future__ import annotations

import pytest

from rollart.runtime import errors
from rollart.v1 import envmanager_pb2 as em
from rollart_envmanager import validators

HOSTILE = ["\u202e🧪" * 2000, "code\x00:builtin", "a\u200fb"]


def env(**kw) -> em.EnvironmentSpec:
    return em.EnvironmentSpec(environment="code:builtin", **kw)


@pytest.mark.parametrize("value", HOSTILE)
@pytest.mark.parametrize(
    "field, build",
    [
        ("env.environment", lambda x: em.EnvironmentSpec(environment=x)),
        ("env.task", lambda x: env(task=x)),
        ("env.sandbox.image", lambda x: env(sandbox=em.SandboxSpec(image=x))),
        ("env.sandbox.options", lambda x: env(sandbox=em.SandboxSpec(options={x: "v"}))),
        ("env.options", lambda x: env(options={"k" + x: "v"})),
    ],
)
def test_path_like_strings_are_refused_naming_the_field(field, build, value):
    with pytest.raises(errors.InvalidArgument) as info:
        validators.check_env(build(value))
    assert info.value.field.startswith(field)


def test_messages_name_the_field():
    cases = [
        (em.EnvironmentSpec(), "env.environment is required"),
        (env(max_turns=-1), "env.max_turns and env.max_context_tokens must be >= 0"),
        (env(sandbox=em.SandboxSpec(cpu_limit=-1)), "env.sandbox limits must be >= 0 (0: the default)"),
        (env(interaction=77), "env.interaction 77 is not an InteractionMode"),
    ]
    for spec, message in cases:
        with pytest.raises(errors.InvalidArgument) as info:
            validators.check_env(spec)
        assert errors.status_of(info.value)[1] == message
    with pytest.raises(errors.InvalidArgument, match="count must be > 0"):
        validators.check_start_loops(em.StartLoopsRequest(group_id="g", count=0))
    with pytest.raises(errors.InvalidArgument, match="name group_ids or loop_ids"):
        validators.check_stop_loops(em.StopLoopsRequest())
    with pytest.raises(errors.InvalidArgument, match="env is required"):
        validators.check_run_episode(em.RunEpisodeRequest(), "t1")


def test_a_valid_spec_passes():
    validators.check_env(env(task="arith", options={"config": '{"a":\n1}'},
                             sandbox=em.SandboxSpec(image="registry:5000/rollart/sb:1.2@sha256:ab")))
    assert validators.check_run_episode(em.RunEpisodeRequest(env=env()), "traj-1") == "traj-1"
