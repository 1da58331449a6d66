"""The built-in environments: what they are (:class:`EnvInfo` entries and the reasoning-gym family).

``registry.register_builtins`` registers them; this module knows nothing of the registry.
"""

from __future__ import annotations

from functools import lru_cache

from ..sandbox import BWRAP, DOCKER, IN_PROCESS, KUBERNETES, PROCESS
from . import code_env, gem_env, gymnasium_env, reasoning_gym_env, swe_env, textarena_env
from .info import COMMAND, EnvInfo, Lister, Resolver

RG_PREFIX = "reasoning_gym:"
_HERE = "rollart_envmanager.envs"


def _rg_info(name: str) -> EnvInfo:
    return EnvInfo(
        id=RG_PREFIX + name,
        source="reasoning_gym",
        factory=f"{_HERE}.reasoning_gym_env:ReasoningGymEnv",
        kwargs={"dataset": name},
        description=f"reasoning-gym generator {name!r} (single turn, scored by reasoning-gym's score_answer)",
        multi_turn=False,
        default_max_turns=1,
        default_backend=IN_PROCESS,
        supported_backends=(IN_PROCESS, PROCESS, BWRAP),
        default_reward="reasoning_gym",
        reward_scorer=name,
        options=reasoning_gym_env.OPTIONS,
        requires=("reasoning_gym",),
    )


@lru_cache(maxsize=1)
def _rg_names() -> tuple[str, ...]:
    try:
        return tuple(reasoning_gym_env.dataset_names())
    except ImportError:
        return ()


def _rg_resolve(env_id: str) -> EnvInfo | None:
    name = env_id[len(RG_PREFIX):]
    names = _rg_names()
    if names and name in names:
        return _rg_info(name)
    if not names:  # package missing: report the entry as unavailable rather than unknown
        return _rg_info(name)
    return None


def _rg_list() -> list[EnvInfo]:
    names = _rg_names()
    return [_rg_info(n) for n in names] if names else [_rg_info("basic_arithmetic")]


def builtin_families() -> list[tuple[str, Resolver, Lister]]:
    """(id prefix, resolver, lister) of every family of built-in ids."""
    return [(RG_PREFIX, _rg_resolve, _rg_list)]


def builtin_environments() -> list[EnvInfo]:
    """Every fixed built-in entry, in registration order."""
    envs: list[EnvInfo] = []
    for game in (*gem_env.GAMES, *gem_env.BROKEN):
        envs.append(EnvInfo(
            id=f"gem:game:{game}",
            source="gem",
            factory=f"{_HERE}.gem_env:GemEnv",
            kwargs={"game": f"game:{game}"},
            description=f"GEM game {game} (multi-turn, actions in \\boxed{{}})",
            default_max_turns=50,
            # GEM seeds process-global RNGs: one environment per process.
            default_backend=PROCESS,
            supported_backends=(PROCESS, BWRAP),
            default_reward="game",
            options=gem_env.OPTIONS,
            requires=("gem",),
            unavailable_reason=gem_env.BROKEN.get(game, ""),
        ))

    for game, players in textarena_env.GAMES.items():
        who = "single player" if players == 1 else "against a scripted opponent"
        envs.append(EnvInfo(
            id=f"textarena:{game}",
            source="textarena",
            factory=f"{_HERE}.textarena_env:TextArenaEnv",
            kwargs={"game": game},
            description=f"textarena {game} ({who}; reward from close())",
            default_max_turns=50,
            default_backend=PROCESS,
            supported_backends=(PROCESS, BWRAP),
            default_reward="game",
            options=textarena_env.OPTIONS if players > 1 else {},
            requires=("textarena",),
        ))

    envs.append(EnvInfo(
        id="gymnasium:FrozenLake-v1",
        source="gymnasium",
        factory=f"{_HERE}.gymnasium_env:FrozenLakeTextEnv",
        description="gymnasium FrozenLake with a text wrapper (grid in, direction out)",
        default_max_turns=30,
        default_backend=IN_PROCESS,
        supported_backends=(IN_PROCESS, PROCESS, BWRAP),
        default_reward="game",
        options=gymnasium_env.OPTIONS,
        requires=("gymnasium",),
    ))

    envs.append(EnvInfo(
        id="code:builtin",
        source="code",
        factory=f"{_HERE}.code_env:CodeEnv",
        description="built-in Python function tasks checked by pytest in a sandbox",
        multi_turn=False,
        default_max_turns=1,
        default_backend=BWRAP,
        # "process" runs the answer unisolated: for trusted local testing only.
        supported_backends=(BWRAP, DOCKER, KUBERNETES, PROCESS),
        hosting=COMMAND,
        default_reward="code",
        options=code_env.OPTIONS,
        requires=("pytest", "pytest_timeout"),
    ))

    envs.append(EnvInfo(
        id="swe:builtin",
        source="swe",
        factory=f"{_HERE}.swe_env:SweEnv",
        description="SWE-bench style bug fixes in small built-in repositories (shell and file-edit actions)",
        default_max_turns=20,
        default_backend=DOCKER,
        supported_backends=(DOCKER, BWRAP, KUBERNETES),
        hosting=COMMAND,
        # The hidden tests run inside the episode's sandbox and their verdict is the final env reward; the
        # reward service's CODE scorer (a pytest file against the last action's code) does not apply here.
        default_reward="game",
        options=swe_env.OPTIONS,
        requires=("pytest", "pytest_timeout"),
    ))
    return envs
