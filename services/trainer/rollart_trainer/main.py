"""Console entry point: ``rollart-trainer [--config PATH]``."""

from rollart.runtime import entry

from .config import TrainerConfig


def main(argv: list[str] | None = None) -> None:
    # torch is imported with the service, after the config checks
    entry.main("rollart-trainer", TrainerConfig, "rollart_trainer.service:TrainerService", argv)


if __name__ == "__main__":
    main()
