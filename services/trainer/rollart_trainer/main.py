"""Console entry point: ``rollart-trainer [--config PATH]``."""

from __future__ import annotations

import argparse
import sys

from rollart.runtime.config import ConfigError, load_config
from rollart.runtime.server import run_service

from .config import TrainerConfig


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="rollart-trainer", description=__doc__)
    parser.add_argument("--config", help="YAML config file (also ROLLART_CONFIG); ROLLART_* env vars override")
    args = parser.parse_args(argv)
    try:
        cfg = load_config(TrainerConfig, args.config)
    except ConfigError as exc:
        sys.exit(f"rollart-trainer: {exc}")
    from .service import TrainerService  # torch is imported with the service, after the config checks

    run_service(TrainerService(cfg), cfg)


if __name__ == "__main__":
    main()
