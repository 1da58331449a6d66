"""`python -m bench` (`make bench`): list the benchmarks; `python -m bench NAME [ARGS]` runs one of them.

A benchmark is a module with a ``__main__`` guard in one of the plane folders (``bench/weights``,
``bench/rollout``, ``bench/control``, ``bench/protocol``); its NAME is the file's stem with ``-`` for ``_``
(``bench/weights/weights_scale.py`` is ``weights-scale``). ``bench/_support`` holds what benchmarks share
(service processes, simulated actors, harnesses); it lists nothing. Current figures: bench/RESULTS.md.
"""

from __future__ import annotations

import ast
import runpy
import sys
from dataclasses import dataclass
from pathlib import Path

HERE = Path(__file__).resolve().parent
PLANES = ("weights", "rollout", "control", "protocol")
#: Commands that are not benchmarks: NAME -> (module, summary).
TOOLS = {"results": ("bench._support.results_table", "regenerate the tables of bench/RESULTS.md from bench/results/ (--check: compare)")}


@dataclass(frozen=True)
class Benchmark:
    name: str
    plane: str
    module: str
    path: Path
    summary: str


def _has_main_guard(tree: ast.Module) -> bool:
    for node in tree.body:
        if isinstance(node, ast.If) and isinstance(node.test, ast.Compare):
            left = node.test.left
            right = node.test.comparators[0] if node.test.comparators else None
            if (isinstance(left, ast.Name) and left.id == "__name__" and isinstance(right, ast.Constant)
                    and right.value == "__main__"):
                return True
    return False


def benchmarks() -> dict[str, Benchmark]:
    """NAME -> benchmark, in plane order; two modules with one NAME are an error."""
    out: dict[str, Benchmark] = {}
    for plane in PLANES:
        for path in sorted((HERE / plane).glob("*.py")):
            if path.name.startswith("_"):
                continue
            tree = ast.parse(path.read_text(), filename=str(path))
            if not _has_main_guard(tree):
                continue  # a part of another benchmark (e.g. control/envmanager_scale.py)
            name = path.stem.replace("_", "-")
            if name in out or name in TOOLS:
                raise RuntimeError(f"benchmark name {name!r} is taken twice: {path} and {out[name].path}")
            out[name] = Benchmark(name, plane, f"bench.{plane}.{path.stem}", path, summary(ast.get_docstring(tree)))
    return out


def summary(doc: str | None, width: int = 100) -> str:
    """The docstring's first paragraph on one line, cut at ``width``."""
    first = " ".join((doc or "").split("\n\n", 1)[0].split())
    return first if len(first) <= width else first[: width - 3].rstrip() + "..."


def normalise(arg: str) -> str:
    """``weights_scale``, ``bench_weights_scale`` and ``weights-scale`` are one NAME."""
    return arg.removesuffix(".py").rsplit("/", 1)[-1].removeprefix("bench_").replace("_", "-")


def usage(known: dict[str, Benchmark]) -> str:
    width = max(map(len, [*known, *TOOLS]))
    lines = ["usage: python -m bench NAME [ARGS...]   (NAME --help for its options)"]
    for plane in PLANES:
        lines.append(f"\n{plane}:")
        lines += [f"  {b.name:<{width}}  {b.summary}" for b in known.values() if b.plane == plane]
    if TOOLS:
        lines.append("\ntools:")
    lines += [f"  {name:<{width}}  {summary}" for name, (_, summary) in TOOLS.items()]
    return "\n".join(lines)


def main(argv: list[str]) -> int:
    known = benchmarks()
    if not argv or argv[0] in ("-h", "--help"):
        print(usage(known))
        return 0
    name = normalise(argv[0])
    if name in TOOLS:
        module = TOOLS[name][0]
    elif name in known:
        module = known[name].module
    else:
        print(f"unknown benchmark {argv[0]!r}; known: {', '.join([*known, *TOOLS])}", file=sys.stderr)
        return 2
    sys.argv = [f"python -m bench {name}", *argv[1:]]
    runpy.run_module(module, run_name="__main__")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
