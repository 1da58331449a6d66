"""The environment registry: ids to factories, with what each environment supports, and per-task configuration.

Ids look like ``reasoning_gym:basic_arithmetic``, ``gem:game:Sokoban-v0-easy``, ``textarena:TicTacToe-v0``,
``gymnasium:FrozenLake-v1``, ``code:builtin``, ``swe:builtin``. Every entry names its factory as an import
path (``module:callable``) so that a child process (process/bwrap backends) can build the same environment.

Users register their own environments with :func:`register_environment` (a decorator), through the
``rollart.environments`` entry-point group of an installed package, or from configuration
(:meth:`EnvRegistry.register_from_mapping`); see docs/environments.md.
"""

from __future__ import annotations

import importlib
import logging
import threading
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field, replace
from importlib.metadata import entry_points
from typing import Any

from ..latency import LatencySpec
from ..sandbox import BACKENDS, IN_PROCESS, PROCESS, SandboxLimits, backend_name
from .base import Env, EnvConfigError, EnvUnavailable, UnknownEnvironment
from .builtin import builtin_environments, builtin_families
from .info import EnvInfo, Lister, Resolver

log = logging.getLogger(__name__)


def import_factory(path: str) -> Callable[..., Env]:
    module_name, _, attr = path.partition(":")
    try:
        obj: Any = importlib.import_module(module_name)
    except ImportError as exc:
        raise EnvUnavailable(f"cannot import {module_name!r}: {exc}") from exc
    for part in attr.split("."):
        try:
            obj = getattr(obj, part)
        except AttributeError:
            raise EnvUnavailable(f"{module_name!r} has no {attr!r}") from None
    if not callable(obj):
        raise EnvUnavailable(f"{path} is not callable")
    return obj


class EnvRegistry:
    def __init__(self) -> None:
        self._envs: dict[str, EnvInfo] = {}
        self._objects: dict[str, Callable[..., Env]] = {}
        self._families: list[tuple[str, Resolver, Lister]] = []
        self._lock = threading.Lock()

    # -- registration ----------------------------------------------------------------------------------------------
    def register(self, info: EnvInfo, *, factory: Callable[..., Env] | None = None, replace: bool = False) -> EnvInfo:
        with self._lock:
            if info.id in self._envs and not replace:
                raise ValueError(f"environment {info.id!r} is already registered")
            self._envs[info.id] = info
            if factory is not None:
                self._objects[info.id] = factory
        return info

    def register_family(self, prefix: str, resolve: Resolver, list_all: Lister) -> None:
        """A family of ids resolved on demand (e.g. every reasoning-gym dataset under ``reasoning_gym:``)."""
        with self._lock:
            self._families.append((prefix, resolve, list_all))

    def register_from_mapping(self, spec: Mapping[str, Any], *, replace: bool = False) -> EnvInfo:
        """From configuration: {"id", "factory": "module:callable", optional EnvInfo fields}."""
        if "id" not in spec or "factory" not in spec:
            raise EnvConfigError("a registered environment needs 'id' and 'factory'")
        fields = {k: v for k, v in spec.items() if k in EnvInfo.__dataclass_fields__}
        fields.setdefault("source", "custom")
        for key in ("supported_backends", "requires"):
            if key in fields:
                fields[key] = tuple(fields[key])
        try:
            info = EnvInfo(**fields)
        except (TypeError, ValueError) as exc:
            raise EnvConfigError(f"invalid environment registration {spec.get('id')!r}: {exc}") from exc
        return self.register(info, replace=replace)

    def load_entry_points(self, group: str = "rollart.environments") -> list[str]:
        """Loads installed plugins: each entry point is a callable taking this registry (it registers its envs)."""
        loaded = []
        for ep in entry_points(group=group):
            ep.load()(self)
            loaded.append(ep.name)
        return loaded

    # -- lookup ------------------------------------------------------------------------------------------------------
    def get(self, env_id: str) -> EnvInfo:
        if not isinstance(env_id, str) or not env_id:
            raise UnknownEnvironment("environment id must be a non-empty string")
        info = self._envs.get(env_id)
        if info is not None:
            return info
        for prefix, resolve, _ in self._families:
            if env_id.startswith(prefix):
                found = resolve(env_id)
                if found is not None:
                    return found
        raise UnknownEnvironment(f"unknown environment {env_id!r}")

    def list(self, source: str | None = None, include_unavailable: bool = False) -> list[EnvInfo]:
        seen: dict[str, EnvInfo] = dict(self._envs)
        for _, _, list_all in self._families:
            for info in list_all():
                seen.setdefault(info.id, info)
        out = []
        for info in seen.values():
            if source and info.source != source:
                continue
            if not include_unavailable and not info.available:
                continue
            out.append(info)
        return sorted(out, key=lambda i: i.id)

    def factory(self, env_id: str) -> Callable[..., Env]:
        info = self.get(env_id)
        obj = self._objects.get(env_id)
        return obj if obj is not None else import_factory(info.factory)

    def make(self, env_id: str, **options: Any) -> Env:
        """Builds the environment here (in this process) with its fixed kwargs plus ``options``."""
        info = self.get(env_id)
        ok, reason = info.availability()
        if not ok:
            raise EnvUnavailable(f"{env_id}: {reason}")
        check_options(info, options)
        return self.factory(env_id)(**{**info.kwargs, **options})


def check_options(info: EnvInfo, options: Mapping[str, Any]) -> None:
    unknown = sorted(set(options) - set(info.options) - {"backend_options"})
    if unknown:
        raise EnvConfigError(
            f"{info.id}: unknown option(s) {', '.join(unknown)}; accepted: {', '.join(sorted(info.options)) or 'none'}"
        )


def register_builtins(reg: EnvRegistry) -> None:
    """The built-in environments (``builtin.py``): the reasoning-gym family first, then the fixed entries."""
    for prefix, resolve, list_all in builtin_families():
        reg.register_family(prefix, resolve, list_all)
    for info in builtin_environments():
        reg.register(info)


_default: EnvRegistry | None = None
_default_lock = threading.Lock()


def default_registry() -> EnvRegistry:
    """The process-wide registry with the built-in environments (and installed plugins)."""
    global _default
    with _default_lock:
        if _default is None:
            reg = EnvRegistry()
            register_builtins(reg)
            try:
                reg.load_entry_points()
            except Exception as exc:  # a broken plugin must not take the built-ins down
                log.warning("loading environment plugins failed: %s", exc)
            _default = reg
        return _default


def register_environment(
    env_id: str,
    *,
    description: str = "",
    multi_turn: bool = True,
    default_max_turns: int = 10,
    default_backend: str = PROCESS,
    supported_backends: Iterable[str] = (IN_PROCESS, PROCESS),
    default_reward: str = "game",
    options: Mapping[str, str] | None = None,
    requires: Iterable[str] = (),
    registry: EnvRegistry | None = None,
    replace: bool = False,
) -> Callable[[Callable[..., Env]], Callable[..., Env]]:
    """Decorator registering a user environment (a class or factory returning an :class:`Env`).

    The factory must be importable by its module path for the process and bwrap backends (a factory defined
    in ``__main__`` can only run in-process).
    """

    def deco(factory: Callable[..., Env]) -> Callable[..., Env]:
        backends = tuple(supported_backends)
        if factory.__module__ == "__main__":
            backends = (IN_PROCESS,)
        info = EnvInfo(
            id=env_id,
            source="custom",
            factory=f"{factory.__module__}:{factory.__qualname__}",
            description=description or (factory.__doc__ or "").strip().split("\n")[0],
            multi_turn=multi_turn,
            default_max_turns=default_max_turns,
            default_backend=default_backend if default_backend in backends else backends[0],
            supported_backends=backends,
            default_reward=default_reward,
            options=dict(options or {}),
            requires=tuple(requires),
        )
        (registry or default_registry()).register(info, factory=factory, replace=replace)
        return factory

    return deco


@dataclass(frozen=True)
class TaskConfig:
    """Per-task configuration of an environment (the proto's EnvironmentSpec, minus generation settings)."""

    environment: str
    task: str = ""
    options: Mapping[str, Any] = field(default_factory=dict)
    max_turns: int = 0  # 0: the environment's default
    system_prompt: str = ""  # empty: the environment's
    backend: str = ""  # empty: the environment's default
    limits: SandboxLimits = field(default_factory=SandboxLimits)
    latency: LatencySpec = field(default_factory=LatencySpec)
    sandbox_options: Mapping[str, str] = field(default_factory=dict)
    sandbox_image: str = ""

    def __post_init__(self) -> None:
        if self.max_turns < 0:
            raise EnvConfigError("max_turns must be >= 0")
        if self.backend and backend_name(self.backend) not in BACKENDS:
            raise EnvConfigError(f"unknown backend {self.backend!r}")

    @property
    def task_tag(self) -> str:
        return self.task or self.environment

    def resolve(self, registry: EnvRegistry | None = None) -> tuple[EnvInfo, str, int]:
        """(info, backend, max_turns) with defaults filled in; EnvConfigError for unsupported choices."""
        info = (registry or default_registry()).get(self.environment)
        backend = backend_name(self.backend) if self.backend else info.default_backend
        if backend not in info.supported_backends:
            raise EnvConfigError(
                f"{info.id} does not run on the {backend} backend (supported: {', '.join(info.supported_backends)})"
            )
        check_options(info, self.options)
        return info, backend, self.max_turns or info.default_max_turns

    def with_options(self, **options: Any) -> TaskConfig:
        return replace(self, options={**self.options, **options})

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> TaskConfig:
        d = dict(d)
        limits = d.pop("limits", None) or d.pop("sandbox", None) or {}
        latency = d.pop("latency", None)
        if isinstance(latency, str):
            lat = LatencySpec.parse(latency)
        elif isinstance(latency, Mapping):
            lat = LatencySpec(**latency)
        else:
            lat = LatencySpec()
        try:
            return cls(
                limits=limits if isinstance(limits, SandboxLimits) else SandboxLimits(**limits),
                latency=lat,
                **d,
            )
        except TypeError as exc:
            raise EnvConfigError(f"invalid task configuration: {exc}") from exc

    @classmethod
    def from_proto(cls, spec: Any, base_limits: SandboxLimits | None = None) -> TaskConfig:
        """From a ``rollart.v1.EnvironmentSpec``."""
        backend = ""
        if spec.HasField("sandbox") and spec.sandbox.backend:
            backend = backend_name(int(spec.sandbox.backend))
        limits = SandboxLimits.from_proto(spec.sandbox, base_limits) if spec.HasField("sandbox") else (
            base_limits or SandboxLimits()
        )
        latency = LatencySpec.from_proto(spec.latency) if spec.HasField("latency") else LatencySpec()
        return cls(
            environment=spec.environment,
            task=spec.task,
            options=dict(spec.options),
            max_turns=int(spec.max_turns),
            system_prompt=spec.system_prompt,
            backend=backend,
            limits=limits,
            latency=latency,
            sandbox_options=dict(spec.sandbox.options) if spec.HasField("sandbox") else {},
            sandbox_image=spec.sandbox.image if spec.HasField("sandbox") else "",
        )
