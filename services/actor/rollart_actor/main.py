"""Console entry point: ``rollart-actor [--config PATH]``."""

from rollart.runtime import entry

from .config import ActorConfig


def main(argv: list[str] | None = None) -> None:
    # The service (grpc stubs, numpy, the engine) is imported once the config is valid.
    entry.main("rollart-actor", ActorConfig, "rollart_actor.service:ActorService", argv)


if __name__ == "__main__":
    main()
