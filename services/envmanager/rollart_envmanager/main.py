"""Console entry point: ``rollart-envmanager [--config PATH]``."""

from __future__ import annotations

import argparse
import os
import sys

from rollart.runtime.config import ConfigError, load_config
from rollart.runtime.server import run_service

from .config import EnvManagerConfig


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="rollart-envmanager", description=__doc__)
    parser.add_argument("--config", help="YAML config file (also ROLLART_CONFIG); ROLLART_* env vars override")
    args = parser.parse_args(argv)
    try:
        cfg = load_config(EnvManagerConfig, args.config)
    except ConfigError as exc:
        sys.exit(f"rollart-envmanager: {exc}")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")  # environment packages must never wait on the hub
    from .service import EnvManagerService

    try:
        service = EnvManagerService(cfg)
    except (ValueError, TypeError) as exc:  # e.g. a bad user environment registration
        sys.exit(f"rollart-envmanager: {exc}")
    run_service(service, cfg)


if __name__ == "__main__":
    main()
