"""The environment interface: text in, text out, many turns (``reset``, ``step``, ``close``; ``metadata`` for the
reward service).

Invariant: errors are typed and never rewards: :class:`ActionError` for an action that is not text, an
:class:`EnvStateError` for calls out of order, a ``SandboxFailure`` for the machinery; text the game cannot parse
is answered by the game (``info["invalid_action"]``). docs/environments.md ("The interface").
"""

from __future__ import annotations

import json
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Any

MAX_ACTION_CHARS = 200_000


class EnvError(Exception):
    """Base of environment usage errors."""


class ActionError(EnvError, ValueError):
    """The action is not acceptable input at all (not a string, too long, NUL bytes)."""


class EnvStateError(EnvError, RuntimeError):
    """The call does not fit the episode's state (step before reset, step after done)."""


class UnknownEnvironment(EnvError, KeyError):
    """No environment is registered under that id."""

    def __str__(self) -> str:  # KeyError quotes its message
        return str(self.args[0]) if self.args else "unknown environment"


class EnvUnavailable(EnvError):
    """The environment exists but cannot run here (missing package, needs the network, ...)."""


class EnvConfigError(EnvError, ValueError):
    """Invalid options for an environment."""


@dataclass
class StepResult:
    observation: str
    # None: the reward is computed later by the reward service (e.g. reasoning-gym answers).
    reward: float | None
    done: bool
    info: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {"observation": self.observation, "reward": self.reward, "done": self.done, "info": jsonable(self.info)}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> StepResult:
        reward = d.get("reward")
        return cls(
            observation=str(d["observation"]),
            reward=None if reward is None else float(reward),
            done=bool(d["done"]),
            info=dict(d.get("info") or {}),
        )


def jsonable(value: Any) -> Any:
    """``value`` made JSON-safe (unknown objects become strings)."""
    return json.loads(json.dumps(value, default=str))


def check_action(action: Any, limit: int = MAX_ACTION_CHARS) -> str:
    if not isinstance(action, str):
        raise ActionError(f"an action must be text, got {type(action).__name__}")
    if len(action) > limit:
        raise ActionError(f"action of {len(action)} characters exceeds the limit of {limit}")
    if "\x00" in action:
        raise ActionError("action contains NUL characters")
    return action


class Env(ABC):
    """Base class of every environment. Subclasses implement ``_reset`` and ``_step``; this class keeps the
    episode state (turn count, done) and validates calls."""

    #: Default system prompt of the environment's episodes.
    system_prompt: str = ""
    #: Default maximum number of turns (the hosting layer truncates after it).
    default_max_turns: int = 1

    def __init__(self, **options: Any) -> None:
        self.options = dict(options)
        self.metadata: dict[str, str] = {}
        #: Turns allowed per episode (the hosting layer sets it from the task configuration).
        self.max_turns = self.default_max_turns
        self.turn = 0
        self.done = True
        self._has_reset = False
        self._closed = False

    def reset(self, seed: int | None = None) -> str:
        if self._closed:
            raise EnvStateError("environment is closed")
        if seed is not None and not isinstance(seed, int):
            raise EnvConfigError(f"seed must be an integer, got {type(seed).__name__}")
        self.metadata = {}
        self.turn = 0
        obs = self._reset(seed)
        if not isinstance(obs, str):
            raise TypeError(f"{type(self).__name__}._reset must return text")
        self.done = False
        self._has_reset = True
        return obs

    def step(self, action: str) -> StepResult:
        if self._closed:
            raise EnvStateError("environment is closed")
        if not self._has_reset:
            raise EnvStateError("step() before reset()")
        if self.done:
            raise EnvStateError("step() after the episode ended; call reset()")
        action = check_action(action)
        self.turn += 1
        result = self._step(action)
        self.done = bool(result.done)
        result.info.setdefault("turn", self.turn)
        return result

    def close(self) -> dict[str, Any]:
        if self._closed:
            return {}
        self._closed = True
        return self._close() or {}

    @abstractmethod
    def _reset(self, seed: int | None) -> str: ...

    @abstractmethod
    def _step(self, action: str) -> StepResult: ...

    def _close(self) -> dict[str, Any] | None:
        return None
