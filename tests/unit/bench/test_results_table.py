"""bench/RESULTS.md's tables agree with the JSON files they are regenerated from (bench/_support/results_table.py)."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest

from bench._support import results_table as rt

BENCH = Path(__file__).resolve().parents[3] / "bench"


def test_every_table_agrees_with_its_json() -> None:
    diff = rt.differences(rt.RESULTS_MD.read_text())
    assert not diff, "bench/RESULTS.md is stale; run `python -m bench results`:\n" + "\n".join(diff)


def test_a_changed_json_value_is_caught(tmp_path: Path) -> None:
    results = tmp_path / "results"
    shutil.copytree(rt.RESULTS_DIR, results)
    path = results / "transfer-s1-2-4-40mb.json"
    data = json.loads(path.read_text())
    row = rt.select(data, "runs.this tree.[streams=4]")
    row["of_link"] = row["of_link"] / 2
    path.write_text(json.dumps(data))
    diff = rt.differences(rt.RESULTS_MD.read_text(), results=results)
    assert len(diff) == 1 and "S = 4 streams, share of the emulated link" in diff[0]


def test_a_hand_edited_table_is_caught() -> None:
    text = rt.RESULTS_MD.read_text()
    edited = text.replace("**1,369 ops/s**", "**1,500 ops/s**")
    assert edited != text
    assert any("1,500 ops/s" in d for d in rt.differences(edited))


def test_render_regenerates_what_check_compares() -> None:
    text = rt.RESULTS_MD.read_text()
    emptied = re.sub(r"(<!-- table: weights -->\n).*?(<!-- end table -->)", r"\1\2", text, flags=re.S)
    assert rt.differences(emptied)
    assert rt.render(emptied) == text


def test_selector_errors_name_the_file_and_the_step() -> None:
    data = [{"config": "a", "x": 1}, {"config": "b", "x": "n/a"}]
    assert rt.select(data, "[config=a].x") == 1
    with pytest.raises(rt.SelectorError, match=r"matches 0 elements"):
        rt.select(data, "[config=c].x", "f.json: ")
    with pytest.raises(rt.SelectorError, match=r"no key 'y'"):
        rt.select(data, "[config=a].y")
    with pytest.raises(rt.SelectorError, match=r"needs a list"):
        rt.select({"a": 1}, "[k=v]")
    row = rt.Row("control", "f", "", "nope.json", "x", "{}")
    with pytest.raises(rt.SelectorError, match=r"bench/results/nope.json: no such file"):
        rt.value(row, rt.RESULTS_DIR)
    with pytest.raises(rt.SelectorError, match=r"not a number"):
        rt.value(rt.Row("control", "f", "", "ledger-clients-1-8-32.jsonl", "[0].machine", "{}"), rt.RESULTS_DIR)


def test_slices_aggregate_over_steps() -> None:
    steps = [{"r": {"a": float(i)}} for i in range(20)]
    assert rt.select(steps, "[-10:].r.a.mean()") == 14.5
    assert rt.select(steps, "[:10].r.a.sum()") == 45.0
    with pytest.raises(rt.SelectorError, match=r"mean\(\) needs a slice"):
        rt.select(steps, "[0].r.a.mean()")
    with pytest.raises(rt.SelectorError, match=r"no key 'b'"):
        rt.select(steps, "[:3].r.b.mean()")


def test_a_plane_without_its_block_is_an_error() -> None:
    with pytest.raises(rt.SelectorError, match=r"table: \w+"):
        rt.render("# Benchmark results\n")


def test_sources_and_rows_match_files() -> None:
    used = {r.file for r in rt.ROWS}
    assert used == set(rt.SOURCES), "a SOURCES entry without rows, or a row whose file is not in SOURCES"
    for name, src in rt.SOURCES.items():
        assert (rt.RESULTS_DIR / name).is_file(), name
        assert (BENCH / "notes" / src.note).is_file(), src.note
        assert re.fullmatch(r"[0-9a-f]{7,40}", src.commit), (name, src.commit)
        assert re.fullmatch(r"\d{4}-\d{2}-\d{2}", src.date), (name, src.date)
        if src.transcribed:
            assert "transcribed_from" in json.loads((rt.RESULTS_DIR / name).read_text()), name
    assert {r.plane for r in rt.ROWS} == set(rt.PLANES)


def test_transcribed_rows_say_so() -> None:
    text = rt.RESULTS_MD.read_text()
    for row in rt.ROWS:
        line = next(line for line in text.splitlines() if line.startswith(f"| {row.figure} |"))
        assert (rt.TRANSCRIBED in line) == rt.SOURCES[row.file].transcribed, row.figure


def test_results_md_is_short_and_its_links_resolve() -> None:
    text = rt.RESULTS_MD.read_text()
    assert len(text.encode()) < 40_000 and len(text.splitlines()) <= 300
    for link in re.findall(r"\]\(((?:results|notes)/[^)]+)\)", text):
        assert (BENCH / link).exists(), link
    for note in (BENCH / "notes").glob("*.md"):
        assert f"notes/{note.name}" in text, f"{note.name} is not linked from RESULTS.md"


def test_every_result_file_is_named_and_linked() -> None:
    """Each file in bench/results/ is read by a table row or named by a note (none is orphaned)."""
    notes = "\n".join(p.read_text() for p in (BENCH / "notes").glob("*.md"))
    for path in rt.RESULTS_DIR.iterdir():
        assert path.name in rt.SOURCES or f"results/{path.name}" in notes, path.name
