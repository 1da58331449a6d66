"""Console entry point: ``rollart-ledger [--config PATH]``."""

from rollart.runtime import entry

from .config import LedgerConfig


def main(argv: list[str] | None = None) -> None:
    entry.main("rollart-ledger", LedgerConfig, "rollart_ledger.service:LedgerService", argv)


if __name__ == "__main__":
    main()
