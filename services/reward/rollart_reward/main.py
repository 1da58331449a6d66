"""Console entry point: ``rollart-reward [--config PATH]``."""

from rollart.runtime import entry

from .config import RewardConfig


def main(argv: list[str] | None = None) -> None:
    entry.main("rollart-reward", RewardConfig, "rollart_reward.service:RewardService", argv)


if __name__ == "__main__":
    main()
