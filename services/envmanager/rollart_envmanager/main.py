"""Console entry point: ``rollart-envmanager [--config PATH]``."""

import os

from rollart.runtime import entry

from .config import EnvManagerConfig


def _service(cfg: EnvManagerConfig):
    os.environ.setdefault("HF_HUB_OFFLINE", "1")  # environment packages must never wait on the hub
    from .service import EnvManagerService

    return EnvManagerService(cfg)


def main(argv: list[str] | None = None) -> None:
    # TypeError too: a user environment registration of the wrong shape is a configuration error.
    entry.main("rollart-envmanager", EnvManagerConfig, _service, argv, startup_errors=(ValueError, TypeError))


if __name__ == "__main__":
    main()
