"""`python -m bench`: every runnable module of a plane folder is listed and runs by its NAME; every bench import
and every path a benchmark starts resolves to a file of the tree (what a move of bench/ breaks first)."""

from __future__ import annotations

import ast
import re
import subprocess
import sys
from pathlib import Path

import pytest

from bench.__main__ import PLANES, benchmarks, main, normalise

ROOT = Path(__file__).resolve().parents[3]
BENCH = ROOT / "bench"


def bench_sources() -> list[Path]:
    return sorted(p for p in BENCH.rglob("*.py") if "__pycache__" not in p.parts and "out" not in p.parts)


def test_every_runnable_plane_module_is_listed() -> None:
    listed = {b.path for b in benchmarks().values()}
    for plane in PLANES:
        for path in (BENCH / plane).glob("*.py"):
            if '__name__ == "__main__"' in path.read_text():
                assert path in listed, f"{path} runs but `python -m bench` does not list it"
    assert len(listed) >= 18


def test_listing_names_every_benchmark_under_its_plane(capsys: pytest.CaptureFixture[str]) -> None:
    assert main([]) == 0
    out = capsys.readouterr().out
    for b in benchmarks().values():
        assert re.search(rf"^  {re.escape(b.name)} ", out, re.M), b.name
        assert b.module == f"bench.{b.plane}.{b.path.stem}"
    assert [line for line in out.splitlines() if line.endswith(":")] == [*(f"{p}:" for p in PLANES), "tools:"]


def test_old_spellings_name_the_same_benchmark() -> None:
    assert normalise("bench_weights_scale") == normalise("weights_scale") == normalise("weights-scale") == "weights-scale"
    assert normalise("bench/bench_codec.py") == "codec"


def test_unknown_name_fails_and_lists_the_known(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["no-such-bench"]) == 2
    assert "known: " in capsys.readouterr().err


def test_no_benchmark_left_at_the_top_of_bench() -> None:
    assert sorted(p.name for p in BENCH.glob("*.py")) == ["__main__.py"]


def test_every_bench_import_resolves() -> None:
    for path in bench_sources():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] == "bench":
                target = ROOT.joinpath(*node.module.split("."))
                if target.is_dir():  # `from bench.weights import codec`
                    missing = [a.name for a in node.names if not (target / f"{a.name}.py").is_file()]
                    assert not missing, f"{path}:{node.lineno} imports {missing} from {node.module}"
                else:
                    assert target.with_suffix(".py").is_file(), f"{path}:{node.lineno} imports {node.module}"


def test_paths_the_benchmarks_name_exist() -> None:
    """``REPO / "bench" / "_support" / "sim_actor.py"``-style joins and ``bench.x.y:Name`` factory strings."""
    join = re.compile(r'(?:ROOT|REPO) / ((?:"[^"]+" / )*"[^"]+\.py")')
    factory = re.compile(r'"(bench(?:\.\w+)+):\w+"')
    for path in bench_sources():
        text = path.read_text()
        for m in join.finditer(text):
            parts = re.findall(r'"([^"]+)"', m.group(1))
            assert ROOT.joinpath(*parts).is_file(), f"{path}: {'/'.join(parts)} does not exist"
        for m in factory.finditer(text):
            assert ROOT.joinpath(*m.group(1).split(".")).with_suffix(".py").is_file(), f"{path}: {m.group(1)}"


def test_a_benchmark_runs_by_name() -> None:
    out = subprocess.run([sys.executable, "-m", "bench", "env-interaction", "--help"], cwd=ROOT, capture_output=True,
                         text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert "usage: python -m bench env-interaction" in out.stdout
