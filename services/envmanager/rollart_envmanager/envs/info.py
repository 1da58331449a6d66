"""What the registry knows about one environment (:class:`EnvInfo`), and how families of ids resolve.

Shared by the registry machinery (``registry.py``) and the catalogue of built-in environments (``builtin.py``),
which therefore do not import each other both ways.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from ..sandbox import IN_PROCESS, PROCESS, backend_name

SOURCES = ("reasoning_gym", "gem", "textarena", "gymnasium", "code", "swe", "custom")
REWARDS = ("math", "reasoning_gym", "code", "game", "llm_judge", "custom")

# How the backend relates to the environment:
#   "hosted": the environment object itself runs in the backend (in-process, a child process, a bwrap child);
#   "command": the environment object runs in the envmanager and runs untrusted commands in a sandbox of that
#              backend (code tests, SWE shell actions).
HOSTED = "hosted"
COMMAND = "command"


@dataclass(frozen=True)
class EnvInfo:
    id: str
    source: str
    factory: str  # "module:callable"
    description: str = ""
    kwargs: Mapping[str, Any] = field(default_factory=dict)  # fixed constructor arguments
    multi_turn: bool = True
    default_max_turns: int = 1
    default_backend: str = IN_PROCESS
    supported_backends: tuple[str, ...] = (IN_PROCESS, PROCESS)
    hosting: str = HOSTED
    default_reward: str = "game"
    reward_scorer: str = ""
    options: Mapping[str, str] = field(default_factory=dict)  # accepted option -> description
    requires: tuple[str, ...] = ()  # modules that must be importable
    unavailable_reason: str = ""  # set for entries known not to work here

    def __post_init__(self) -> None:
        if not self.id or ":" not in self.factory:
            raise ValueError(f"environment {self.id!r}: factory must be 'module:callable', got {self.factory!r}")
        if self.source not in SOURCES:
            raise ValueError(f"environment {self.id!r}: source must be one of {SOURCES}")
        object.__setattr__(self, "default_backend", backend_name(self.default_backend))
        object.__setattr__(self, "supported_backends", tuple(backend_name(b) for b in self.supported_backends))
        if self.default_backend not in self.supported_backends:
            raise ValueError(f"environment {self.id!r}: default backend not among the supported ones")
        if self.hosting not in (HOSTED, COMMAND):
            raise ValueError(f"environment {self.id!r}: hosting must be {HOSTED!r} or {COMMAND!r}")

    def availability(self) -> tuple[bool, str]:
        if self.unavailable_reason:
            return False, self.unavailable_reason
        for module in self.requires:
            try:
                if importlib.util.find_spec(module) is None:
                    return False, f"package providing {module!r} is not installed"
            except (ImportError, ValueError) as exc:
                return False, f"cannot import {module!r}: {exc}"
        return True, ""

    @property
    def available(self) -> bool:
        return self.availability()[0]


# A family of ids resolved on demand (e.g. every reasoning-gym dataset under ``reasoning_gym:``): the resolver
# answers one id (None: not in the family), the lister enumerates them all.
Resolver = Callable[[str], EnvInfo | None]
Lister = Callable[[], Iterable[EnvInfo]]
