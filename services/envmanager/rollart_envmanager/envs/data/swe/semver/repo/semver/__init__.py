from .version import compare, latest, parse

__all__ = ["compare", "latest", "parse"]
