"""Console entry point: ``rollart-reward [--config PATH]``."""

from __future__ import annotations

import argparse
import sys

from rollart.runtime.config import ConfigError, load_config
from rollart.runtime.server import run_service

from .config import RewardConfig
from .service import RewardService


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="rollart-reward", description=__doc__)
    parser.add_argument("--config", help="YAML config file (also ROLLART_CONFIG); ROLLART_* env vars override")
    args = parser.parse_args(argv)
    try:
        cfg = load_config(RewardConfig, args.config)
    except ConfigError as exc:
        sys.exit(f"rollart-reward: {exc}")
    run_service(RewardService(cfg), cfg)


if __name__ == "__main__":
    main()
