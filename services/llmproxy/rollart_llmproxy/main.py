"""Console entry point: ``rollart-llmproxy [--config PATH]``."""

from __future__ import annotations

import argparse
import sys

from rollart.runtime.config import ConfigError, load_config
from rollart.runtime.server import run_service

from .config import LLMProxyConfig
from .service import LLMProxyService


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="rollart-llmproxy", description=__doc__)
    parser.add_argument("--config", help="YAML config file (also ROLLART_CONFIG); ROLLART_* env vars override")
    args = parser.parse_args(argv)
    try:
        cfg = load_config(LLMProxyConfig, args.config)
    except ConfigError as exc:
        sys.exit(f"rollart-llmproxy: {exc}")
    run_service(LLMProxyService(cfg), cfg)


if __name__ == "__main__":
    main()
