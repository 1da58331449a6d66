"""Console entry point: ``rollart-relay [--config PATH]``."""

from rollart.runtime import entry

from .config import RelayConfig


def main(argv: list[str] | None = None) -> None:
    entry.main("rollart-relay", RelayConfig, "rollart_relay.service:RelayService", argv)


if __name__ == "__main__":
    main()
