"""The README a newcomer reads first: short, its two set-up commands as documented, every doc it names present."""

from __future__ import annotations

import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
README = (REPO / "README.md").read_text()
MAX_LINES = 150


def fenced_blocks(text: str, language: str) -> list[str]:
    return re.findall(rf"^```{language}\n(.*?)^```", text, flags=re.MULTILINE | re.DOTALL)


def test_the_readme_is_short_enough_to_read_in_five_minutes() -> None:
    assert len(README.splitlines()) <= MAX_LINES


def test_the_readme_holds_exactly_the_two_set_up_commands() -> None:
    set_up = README.split("## Set-up", 1)[1].split("\n## ", 1)[0]
    assert [block.strip() for block in fenced_blocks(set_up, "bash")] == [
        "bash scripts/install.sh && .venv/bin/orl demo --quick",
        "bash scripts/install.sh --dev && bash scripts/check.sh",
    ]
    ci = (REPO / ".ci" / "run").read_text()
    assert "scripts/install.sh --dev" in ci and "scripts/check.sh" in ci  # CI runs the README's test command


def test_every_file_the_readme_names_exists() -> None:
    named = set(re.findall(r"`((?:docs|benchmarks|examples|scripts)/[^`\s#]+)(?:#[^`]*)?`", README))
    named |= {link for link in re.findall(r"\]\(([^)#:]+)\)", README)}
    assert len(named) >= 10, named  # the docs table is there
    missing = sorted(name for name in named if not (REPO / name).exists())
    assert not missing, f"the README names files that do not exist: {missing}"


def test_the_readme_anchors_point_at_headings() -> None:
    for doc, anchor in re.findall(r"`(docs/[^`#]+)#([^`]+)`", README):
        headings = re.findall(r"^#+ (.+)$", (REPO / doc).read_text(), flags=re.MULTILINE)
        slugs = {re.sub(r"[^a-z0-9 -]", "", h.lower()).replace(" ", "-") for h in headings}
        assert anchor in slugs, f"{doc} has no heading for #{anchor}"


def test_the_docs_the_readme_moved_out_keep_their_links_working() -> None:
    for doc in (
        "docs/results.md",
        "docs/usage.md",
        "docs/architecture.md",
        "docs/testing.md",
        "benchmarks/README.md",
    ):
        path = REPO / doc
        for link in re.findall(r"\]\(([^)#:]+)\)", path.read_text()):
            assert (path.parent / link).exists(), f"{doc} links {link}, which does not exist"
