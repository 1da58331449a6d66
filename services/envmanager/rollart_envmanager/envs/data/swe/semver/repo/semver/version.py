"""Semantic versions MAJOR.MINOR.PATCH."""


def parse(text):
    parts = text.strip().split(".")
    if len(parts) != 3 or not all(p.isdigit() for p in parts):
        raise ValueError(f"not a version: {text!r}")
    return parts


def compare(a, b):
    """-1 if a < b, 0 if equal, 1 if a > b."""
    pa, pb = parse(a), parse(b)
    if pa < pb:
        return -1
    if pa > pb:
        return 1
    return 0


def latest(versions):
    best = None
    for v in versions:
        if best is None or compare(v, best) > 0:
            best = v
    return best
