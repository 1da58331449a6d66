"""Console entry point: ``rollart-resource-manager [--config PATH]``."""

from rollart.runtime import entry

from .config import ResourceManagerConfig


def main(argv: list[str] | None = None) -> None:
    entry.main(
        "rollart-resource-manager",
        ResourceManagerConfig,
        "rollart_resource_manager.service:ResourceManagerService",
        argv,
    )


if __name__ == "__main__":
    main()
