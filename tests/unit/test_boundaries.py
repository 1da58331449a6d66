"""Service boundaries, read from the source (``ast``; nothing is imported):

- a service imports no other service's package (``rollart_<other>``), not even by a module path in a string
  (``importlib.import_module``, a ``module:callable`` factory): services talk over gRPC;
- a service never imports the developer tooling (``rollart_devtools``): it receives model paths;
- ``libs`` (package ``rollart``) imports no service package and no tooling, and names no service package in
  a string (docstrings, which are prose, aside): it starts services by their ``rollart-<service>`` console
  scripts.
"""

from __future__ import annotations

import ast
import re
import sys
import tomllib
from collections.abc import Iterator
from functools import cache
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SERVICES_DIR = ROOT / "services"
LIBS_DIR = ROOT / "libs"
DEVTOOLS = "rollart_devtools"


@cache
def service_packages() -> dict[str, Path]:
    """Top-level package of every service -> its folder (services/<name>/rollart_<name>/)."""
    found = {}
    for pyproject in sorted(SERVICES_DIR.glob("*/pyproject.toml")):
        package = "rollart_" + pyproject.parent.name.replace("-", "_")
        assert (pyproject.parent / package / "__init__.py").is_file(), f"{pyproject.parent} has no package {package}"
        found[package] = pyproject.parent / package
    assert len(found) >= 8, found
    return found


def python_files(folder: Path) -> list[Path]:
    return sorted(
        p for p in folder.rglob("*.py") if "__pycache__" not in p.parts and not any(s.endswith(".egg-info") for s in p.parts)
    )


def imported_modules(tree: ast.AST) -> Iterator[tuple[int, str]]:
    """(line, absolute module name) of every import statement, wherever it is (module top, function, TYPE_CHECKING)."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield node.lineno, alias.name
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            yield node.lineno, node.module


def strings(tree: ast.AST) -> Iterator[tuple[int, str]]:
    """(line, text) of every string constant the code uses (f-string parts included; docstrings are not)."""
    docstrings = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
                docstrings.add(id(first.value))
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docstrings:
            yield node.lineno, node.value


def top_package(module: str) -> str:
    return module.split(".", 1)[0]


def names_package(packages: set[str]) -> re.Pattern[str]:
    # "rollart_actor", "rollart_actor.engine", "rollart_actor:main"; not a metric such as "rollart_actor_tokens".
    return re.compile(r"\b(" + "|".join(sorted(packages)) + r")\b")


def service_violations(package: str) -> list[str]:
    others = set(service_packages()) - {package}
    module_path = re.compile(r"\b(" + "|".join(sorted(others)) + r")(\.[A-Za-z_]\w*)*(:\w+)?\b")
    found = []
    for path in python_files(service_packages()[package]):
        rel = path.relative_to(ROOT)
        tree = ast.parse(path.read_text(), str(path))
        for line, module in imported_modules(tree):
            if top_package(module) in others:
                found.append(f"{rel}:{line}: imports {module} (another service's package)")
            elif top_package(module) == DEVTOOLS:
                found.append(f"{rel}:{line}: imports {module} (developer tooling)")
        for line, text in strings(tree):
            # Only a string that is nothing but a module path: one a service could import by name.
            if module_path.fullmatch(text.strip()):
                found.append(f"{rel}:{line}: names {text.strip()!r} (another service's module) in a string")
    return found


def libs_violations() -> list[str]:
    forbidden = set(service_packages()) | {DEVTOOLS}
    named = names_package(set(service_packages()))
    found = []
    for path in python_files(LIBS_DIR):
        rel = path.relative_to(ROOT)
        tree = ast.parse(path.read_text(), str(path))
        for line, module in imported_modules(tree):
            if top_package(module) in forbidden:
                found.append(f"{rel}:{line}: imports {module}")
        for line, text in strings(tree):
            for m in named.finditer(text):
                found.append(f"{rel}:{line}: names service package {m.group(1)} in a string: {text.strip()[:80]!r}")
    return found


@pytest.mark.parametrize("package", sorted(service_packages()))
def test_a_service_imports_no_other_service_nor_the_tooling(package: str) -> None:
    assert service_violations(package) == []


def test_libs_imports_and_names_no_service() -> None:
    assert libs_violations() == []


def test_every_service_declares_its_console_script() -> None:
    """What libs starts instead of naming modules: rollart-<service> -> rollart_<service>.main:main."""
    for package, folder in service_packages().items():
        project = tomllib.loads((folder.parent / "pyproject.toml").read_text())["project"]
        script = "rollart-" + folder.parent.name
        assert project.get("scripts", {}).get(script) == f"{package}.main:main", (script, project.get("scripts"))


# The checker itself: each rule fails on the code it is meant to catch.


def _check_service_source(package: str, source: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> list[str]:
    folder = tmp_path / "services" / package.removeprefix("rollart_") / package
    folder.mkdir(parents=True)
    (folder / "__init__.py").write_text("")
    (folder / "mod.py").write_text(source)
    monkeypatch.setitem(service_packages(), package, folder)
    monkeypatch.setattr(sys.modules[__name__], "ROOT", tmp_path)
    return service_violations(package)


@pytest.mark.parametrize(
    "source, flagged",
    [
        ("import rollart_envmanager.envs\n", True),
        ("def f():\n    from rollart_reward import main\n", True),
        ("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from rollart_ledger.service import X\n", True),
        ("import importlib\nimportlib.import_module('rollart_relay.main')\n", True),
        ("from rollart_devtools.tiny_model import build_tiny_model\n", True),
        ("from rollart.runtime import config\nfrom . import mod\n", False),
        ("COUNTER = 'rollart_relay_segments_total'\n", False),
        ('"""Unlike the relay (rollart_relay), this ..."""\n', False),
    ],
)
def test_service_rules_catch_what_they_should(source, flagged, tmp_path, monkeypatch) -> None:
    assert bool(_check_service_source("rollart_fake", source, tmp_path, monkeypatch)) is flagged


@pytest.mark.parametrize(
    "source, flagged",
    [
        ("import rollart_trainer\n", True),
        ("def f():\n    import rollart_devtools.warmstart\n", True),
        ("ARGV = ['python', '-m', 'rollart_trainer.warmstart']\n", True),
        ("PLUGIN = ('rollart_actor.tiny_model', 'add_subparsers')\n", True),
        ("def build():\n    return run(f'python -m rollart_trainer.warmstart --out {OUT}')\n", True),
        ('"""Unlike ``rollart_actor.weights``, this ..."""\n', False),
        ("SCRIPT = 'rollart-trainer'\nTOOL = 'rollart-devtools'\n", False),
        ("NAME = 'rollart_weights_hub_bytes_total'\nOTHER = 'rollart_actor_tokens'\n", False),
    ],
)
def test_libs_rules_catch_what_they_should(source, flagged, tmp_path, monkeypatch) -> None:
    (tmp_path / "libs" / "rollart").mkdir(parents=True)
    (tmp_path / "libs" / "rollart" / "mod.py").write_text(source)
    monkeypatch.setattr(sys.modules[__name__], "ROOT", tmp_path)
    monkeypatch.setattr(sys.modules[__name__], "LIBS_DIR", tmp_path / "libs")
    assert bool(libs_violations()) is flagged
