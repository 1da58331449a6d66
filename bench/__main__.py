"""`python -m bench` (`make bench`): list the benchmarks; `python -m bench NAME [ARGS]` runs one of them.

Each benchmark is also a module of its own (`python -m bench.bench_ledger`); figures go to bench/RESULTS.md.
"""

from __future__ import annotations

import ast
import runpy
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent


def benchmarks() -> dict[str, str]:
    """name -> first line of its docstring."""
    out = {}
    for path in sorted(HERE.glob("bench_*.py")):
        doc = ast.get_docstring(ast.parse(path.read_text())) or ""
        out[path.stem.removeprefix("bench_")] = doc.splitlines()[0] if doc else ""
    return out


def main(argv: list[str]) -> int:
    known = benchmarks()
    if not argv or argv[0] in ("-h", "--help"):
        print("usage: python -m bench NAME [ARGS...]   (NAME --help for its options)\n")
        width = max(map(len, known))
        for name, line in known.items():
            print(f"  {name:<{width}}  {line}")
        return 0
    name = argv[0].removeprefix("bench_").removesuffix(".py").replace("-", "_")  # weights-scale = weights_scale
    if name not in known:
        print(f"unknown benchmark {argv[0]!r}; known: {', '.join(known)}", file=sys.stderr)
        return 2
    sys.argv = [f"bench/bench_{name}.py", *argv[1:]]
    runpy.run_module(f"bench.bench_{name}", run_name="__main__")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
