"""Shared by the bench tests: the `--set` values a geo row would hand `rollart run` (the run itself faked)."""

from __future__ import annotations

from pathlib import Path

import pytest

from bench.protocol import geo


@pytest.fixture
def geo_row_sets(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """``geo_row_sets(mode, **run_mode_kwargs)``: the ``--set`` values of that row's `rollart run`."""

    def sets_of(mode: str, **kw) -> list[str]:
        seen: list[str] = []

        def fake_run(argv, out, faults):
            seen.extend(argv)
            return 1, "stopped", []

        monkeypatch.setattr(geo, "rollart_run", fake_run)
        with pytest.raises(RuntimeError, match="exited 1"):
            geo.run_mode(mode, tmp_path / "out", 4, None, None, 60.0, **kw)
        return [seen[i + 1] for i, a in enumerate(seen) if a == "--set"]

    return sets_of
