"""Between the library's types and the ``rollart.v1`` envmanager messages (used by the gRPC service)."""

from __future__ import annotations

from typing import cast

from rollart.v1 import common_pb2, envmanager_pb2

from .envs.info import EnvInfo
from .envs.registry import EnvRegistry, default_registry
from .sandbox import proto_number

_SOURCES = {
    "reasoning_gym": envmanager_pb2.ENV_SOURCE_REASONING_GYM,
    "gem": envmanager_pb2.ENV_SOURCE_GEM,
    "textarena": envmanager_pb2.ENV_SOURCE_TEXTARENA,
    "gymnasium": envmanager_pb2.ENV_SOURCE_GYMNASIUM,
    "code": envmanager_pb2.ENV_SOURCE_CODE,
    "swe": envmanager_pb2.ENV_SOURCE_SWE,
    "custom": envmanager_pb2.ENV_SOURCE_CUSTOM,
}
_SOURCE_NAMES = {v: k for k, v in _SOURCES.items()}
_SCORERS = {
    "math": common_pb2.SCORER_KIND_MATH,
    "reasoning_gym": common_pb2.SCORER_KIND_REASONING_GYM,
    "code": common_pb2.SCORER_KIND_CODE,
    "game": common_pb2.SCORER_KIND_GAME,
    "llm_judge": common_pb2.SCORER_KIND_LLM_JUDGE,
    "custom": common_pb2.SCORER_KIND_CUSTOM,
}


def reward_spec(info: EnvInfo) -> common_pb2.RewardSpec:
    return common_pb2.RewardSpec(kind=_SCORERS.get(info.default_reward, common_pb2.SCORER_KIND_CUSTOM),
                                 scorer=info.reward_scorer)


def _backend(name: str) -> envmanager_pb2.SandboxBackend:
    return cast(envmanager_pb2.SandboxBackend, proto_number(name))  # a SandboxBackend number, typed int


def env_info_to_proto(info: EnvInfo) -> envmanager_pb2.EnvironmentInfo:
    available, reason = info.availability()
    return envmanager_pb2.EnvironmentInfo(
        id=info.id,
        source=_SOURCES[info.source],
        description=info.description,
        multi_turn=info.multi_turn,
        default_max_turns=info.default_max_turns,
        default_backend=_backend(info.default_backend),
        supported_backends=[_backend(b) for b in info.supported_backends],
        default_reward=reward_spec(info),
        options=dict(info.options),
        available=available,
        unavailable_reason=reason,
    )


def list_environments(
    request: envmanager_pb2.ListEnvironmentsRequest, registry: EnvRegistry | None = None
) -> envmanager_pb2.ListEnvironmentsResponse:
    """The ListEnvironments answer. ValueError for an unknown source enum value (INVALID_ARGUMENT)."""
    source = None
    if request.source:
        if request.source not in _SOURCE_NAMES:
            raise ValueError(f"unknown environment source {request.source}")
        source = _SOURCE_NAMES[request.source]
    reg = registry or default_registry()
    infos = reg.list(source=source, include_unavailable=request.include_unavailable)
    return envmanager_pb2.ListEnvironmentsResponse(environments=[env_info_to_proto(i) for i in infos])
