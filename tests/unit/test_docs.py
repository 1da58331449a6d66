"""The documentation stands on its own, stays readable in a day, and says each thing once.

The design lives in docs/architecture.md (the map) and one docs/*.md page per topic. These tests fail when a file
sends the reader outside the repository (a clone has nothing else), when a relative link in README.md,
CONTRIBUTING.md or docs/*.md names a file or heading that does not exist, when the map outgrows its budget, when
docs/*.md outgrow 120 KiB in all or 24 KiB in one page, and when a page other than its owner retells the step
protocol.
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]

# Spelled so that this file does not match itself: the design and platform documents of the steering checkout,
# and any path into a sibling `shared` checkout.
FOREIGN_DOC = re.compile(r"\b(?:DESIGN|PLATFORM)\.md\b|\.\./shared\b|/work/(?:shared)\b")

# [text](target) and ![alt](target), with an optional "title"; reference definitions `[id]: target`.
INLINE_LINK = re.compile(r"!?\[(?:[^\[\]]|\[[^\]]*\])*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
REFERENCE_LINK = re.compile(r"^\s{0,3}\[[^\]]+\]:\s*<?(\S+?)>?(?:\s+.*)?$", re.MULTILINE)
FENCE = re.compile(r"^(```|~~~).*?^\1[^\n]*$", re.MULTILINE | re.DOTALL)
CODE_SPAN = re.compile(r"(`+)(?:(?!\1).)+?\1", re.DOTALL)
SCHEME = re.compile(r"^[a-zA-Z][a-zA-Z0-9+.-]*:")


def repo_files(root: Path = REPO) -> list[Path]:
    """Tracked files plus untracked ones git does not ignore (new files count before their first commit)."""
    try:
        out = subprocess.run(
            ["git", "-C", str(root), "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
            capture_output=True,
            check=True,
        ).stdout
    except (OSError, subprocess.CalledProcessError):  # not a git checkout (an unpacked archive): walk it
        skip = {".git", ".venv", "node_modules", "__pycache__", ".rollart", "runs"}
        return sorted(p for p in root.rglob("*") if p.is_file() and not skip & set(p.relative_to(root).parts))
    return sorted({root / name for name in out.decode().split("\0") if name and (root / name).is_file()})


def foreign_references(files: list[Path], root: Path = REPO) -> list[str]:
    """``path:line: text`` of every line that refers to a design document outside the repository."""
    found = []
    for path in files:
        try:
            text = path.read_bytes().decode("utf-8", errors="replace")
        except OSError:
            continue
        for number, line in enumerate(text.splitlines(), 1):
            if FOREIGN_DOC.search(line):
                found.append(f"{path.relative_to(root)}:{number}: {line.strip()[:160]}")
    return found


def heading_anchors(markdown: str) -> set[str]:
    """GitHub's anchors of a Markdown file's headings: lower case, punctuation dropped, spaces to hyphens,
    repeats numbered -1, -2, ..."""
    anchors: set[str] = set()
    seen: dict[str, int] = {}
    for line in FENCE.sub("", markdown).splitlines():
        m = re.match(r"^\s{0,3}#{1,6}\s+(.*?)\s*#*\s*$", line)
        if not m:
            continue
        text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", m.group(1))  # a link's text, not its target
        slug = re.sub(r"[^\w\- ]", "", text.replace("`", "").lower()).replace(" ", "-")
        n = seen.get(slug, 0)
        seen[slug] = n + 1
        anchors.add(slug if n == 0 else f"{slug}-{n}")
    return anchors


def links(markdown: str) -> list[str]:
    """Link targets of a Markdown text, outside code blocks and code spans."""
    prose = CODE_SPAN.sub("", FENCE.sub("", markdown))
    return INLINE_LINK.findall(prose) + REFERENCE_LINK.findall(prose)


def broken_links(doc: Path, root: Path = REPO) -> list[str]:
    """Relative links of ``doc`` whose file, or whose heading in a Markdown file, does not exist."""
    problems = []
    for target in links(doc.read_text()):
        if SCHEME.match(target) or target.startswith("//"):
            continue  # http(s), mailto, ...: not a file of this repository
        path_part, _, anchor = target.partition("#")
        dest = (doc.parent / path_part).resolve() if path_part else doc
        where = f"{doc.relative_to(root)}: ({target})"
        if not dest.exists():
            problems.append(f"{where}: no such file")
        elif anchor and dest.suffix == ".md" and anchor not in heading_anchors(dest.read_text()):
            problems.append(f"{where}: no heading #{anchor} in {dest.name}")
    return problems


def documentation() -> list[Path]:
    return [REPO / "README.md", REPO / "CONTRIBUTING.md", *sorted((REPO / "docs").glob("*.md"))]


# The map stays a map (bytes): what each service owns and who calls whom, not the topics themselves.
ARCHITECTURE_BUDGET = 16 * 1024
# docs/*.md read in a day (bytes): all pages together, and any one page (a spec included).
DOCS_BUDGET = 120 * 1024
PAGE_BUDGET = 24 * 1024
# The step protocol has one owner page; other pages link to it.
STEP_PROTOCOL_OWNER = "trainer.md"


def over_budget(pages: list[Path], total_budget: int = DOCS_BUDGET, page_budget: int = PAGE_BUDGET) -> list[str]:
    """What breaks the docs budget, naming the biggest pages (where to cut) in either case."""
    sizes = sorted(((p.stat().st_size, p.name) for p in pages), reverse=True)
    biggest = ", ".join(f"{name} {size}" for size, name in sizes[:5])
    problems = [f"{name} is {size} bytes, over {page_budget}" for size, name in sizes if size > page_budget]
    total = sum(size for size, _ in sizes)
    if total > total_budget:
        problems.append(f"docs/*.md total {total} bytes, over {total_budget}")
    return [f"{p} (biggest pages: {biggest}; link, do not retell)" for p in problems]


def headings_about(markdown: str, words: str) -> list[str]:
    """Headings of ``markdown`` that contain ``words`` (case-insensitive)."""
    return [h for h in heading_anchors(markdown) if words.lower().replace(" ", "-") in h]


# ------------------------------------------------------------------------------------------------ the checks


def test_no_file_refers_to_design_documents_outside_the_repository():
    found = foreign_references(repo_files())
    assert not found, "these point outside the repository; use docs/architecture.md or docs/*.md:\n" + "\n".join(found)


@pytest.mark.parametrize("doc", documentation(), ids=lambda p: str(p.relative_to(REPO)))
def test_relative_links_resolve(doc: Path):
    assert not broken_links(doc), "\n".join(broken_links(doc))


def test_architecture_stays_a_map():
    size = (REPO / "docs" / "architecture.md").stat().st_size
    assert size <= ARCHITECTURE_BUDGET, f"docs/architecture.md is {size} bytes, over {ARCHITECTURE_BUDGET}: link, do not retell"


def test_docs_stay_within_their_budget():
    problems = over_budget(sorted((REPO / "docs").glob("*.md")))
    assert not problems, "\n".join(problems)


def test_the_step_protocol_is_written_once():
    owners = [p.name for p in sorted((REPO / "docs").glob("*.md")) if headings_about(p.read_text(), "step protocol")]
    assert owners == [STEP_PROTOCOL_OWNER], f"pages with a step-protocol section: {owners}; link to trainer.md"


def test_readme_links_the_architecture_contributing_and_every_doc():
    readme = REPO / "README.md"
    linked = {(readme.parent / t.partition("#")[0]).resolve() for t in links(readme.read_text())}
    missing = [p.name for p in sorted((REPO / "docs").glob("*.md")) if p.resolve() not in linked]
    assert (REPO / "docs" / "architecture.md").resolve() in linked
    assert (REPO / "CONTRIBUTING.md").resolve() in linked
    assert not missing, f"docs not linked from README.md: {missing}"


# --------------------------------------------------------------------------- the checker itself catches things


def test_checker_finds_foreign_references_and_broken_links(tmp_path: Path):
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "a.md").write_text("# Wire formats\n\n## Wire formats\n")
    (tmp_path / "x.py").write_text('"""See DESIGN' + ".md, and ../sha" + "red/PLAT" + 'FORM.md."""\n')
    (tmp_path / "ok.py").write_text('"""See docs/architecture.md ("Wire formats")."""\n')
    readme = tmp_path / "README.md"
    readme.write_text(
        "[a](docs/a.md) [b](docs/a.md#wire-formats) [c](docs/a.md#wire-formats-1) [web](https://x.org/y)\n"
        "[gone](docs/gone.md) [bad anchor](docs/a.md#nope) `[code](docs/none.md)`\n"
        "```\n[fenced](docs/none.md)\n```\n[ref]: docs/missing.md\n"
    )
    refs = foreign_references([tmp_path / "x.py", tmp_path / "ok.py"], tmp_path)
    assert refs == [f"x.py:1: {(tmp_path / 'x.py').read_text().strip()}"]
    assert broken_links(readme, tmp_path) == [
        "README.md: (docs/gone.md): no such file",
        "README.md: (docs/a.md#nope): no heading #nope in a.md",
        "README.md: (docs/missing.md): no such file",
    ]


def test_budget_check_names_the_biggest_pages(tmp_path: Path):
    for name, size in [("small.md", 10), ("big.md", 30), ("mid.md", 20)]:
        (tmp_path / name).write_bytes(b"x" * size)
    pages = sorted(tmp_path.glob("*.md"))
    assert over_budget(pages, total_budget=60, page_budget=30) == []
    assert over_budget(pages, total_budget=59, page_budget=30) == [
        "docs/*.md total 60 bytes, over 59 (biggest pages: big.md 30, mid.md 20, small.md 10; link, do not retell)"
    ]
    assert over_budget(pages, total_budget=60, page_budget=29) == [
        "big.md is 30 bytes, over 29 (biggest pages: big.md 30, mid.md 20, small.md 10; link, do not retell)"
    ]


def test_owner_check_catches_a_retold_protocol():
    assert headings_about("# Trainer\n\n## The step protocol\n", "step protocol") == ["the-step-protocol"]
    assert headings_about("## Step protocol, again\n", "step protocol") == ["step-protocol-again"]
    assert headings_about("# Steps\n## Protocol\n```\n## the step protocol\n```\n", "step protocol") == []


def test_anchors_follow_github():
    md = (
        "# The step protocol\n## Rules every part keeps\n### `rollart run`\n## Platform facts: vLLM (CPU)\n## A\n## A\n"
    )
    assert heading_anchors(md) == {
        "the-step-protocol",
        "rules-every-part-keeps",
        "rollart-run",
        "platform-facts-vllm-cpu",
        "a",
        "a-1",
    }
