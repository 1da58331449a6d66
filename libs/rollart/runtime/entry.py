"""The console entry point every service's ``main.py`` delegates to.

``main("rollart-relay", RelayConfig, RelayService)`` parses ``--config PATH``, loads and validates the config
(YAML file, then ``ROLLART_*`` environment variables; see ``rollart.runtime.config``), builds the service and
serves it until SIGTERM/SIGINT. A bad config, or a service that refuses its config while being built, ends the
process with ``<prog>: <reason>`` on stderr and exit status 1, never a traceback.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

from .config import ConfigError, ServiceConfig, load_config
from .server import Service, run_service

C = TypeVar("C", bound=ServiceConfig)

#: What a service may raise while being built from a valid config to say the config cannot work.
STARTUP_ERRORS: tuple[type[BaseException], ...] = (ConfigError, ValueError)


def _resolve(service: Callable[[Any], Service] | str) -> Callable[[Any], Service]:
    """``"package.module:Name"`` is imported now (after the config checks); anything else is used as is."""
    if not isinstance(service, str):
        return service
    module, _, attr = service.partition(":")
    return getattr(importlib.import_module(module), attr)


def load(prog: str, config_class: type[C], argv: Sequence[str] | None = None, description: str | None = None) -> C:
    """Parse ``--config`` and load ``config_class``; exit with ``<prog>: <reason>`` if it is invalid."""
    parser = argparse.ArgumentParser(prog=prog, description=description or f"{prog}: a RollArt gRPC service")
    parser.add_argument("--config", help="YAML config file (also ROLLART_CONFIG); ROLLART_* env vars override")
    args = parser.parse_args(argv)
    try:
        return load_config(config_class, args.config)
    except ConfigError as exc:
        sys.exit(f"{prog}: {exc}")


def main(
    prog: str,
    config_class: type[C],
    service: Callable[[C], Service] | str,
    argv: Sequence[str] | None = None,
    *,
    startup_errors: tuple[type[BaseException], ...] = STARTUP_ERRORS,
    description: str | None = None,
) -> None:
    """Load the config, build ``service(cfg)``, serve it (blocking).

    ``service`` is the service class (or any callable taking the config), or ``"module:Name"`` to import it
    only once the config is valid (services that import torch or vllm, so a typo in the config fails fast).
    """
    cfg = load(prog, config_class, argv, description)
    try:
        instance = _resolve(service)(cfg)
    except startup_errors as exc:
        sys.exit(f"{prog}: {exc}")
    run_service(instance, cfg)
