"""Console entry point: ``rollart-llmproxy [--config PATH]``."""

from rollart.runtime import entry

from .config import LLMProxyConfig


def main(argv: list[str] | None = None) -> None:
    entry.main("rollart-llmproxy", LLMProxyConfig, "rollart_llmproxy.service:LLMProxyService", argv)


if __name__ == "__main__":
    main()
