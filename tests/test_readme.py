"""The README is an entry point (issue 37): at most 250 lines, the two commands, links that resolve.
The generated tables (algos, each signal's knobs) moved with their sections to docs/ and agree with
the registry and the config dataclasses; refresh one with `python -m reflectrl.knobs docs/FILE.md`."""

import re
import shutil
from pathlib import Path

import pytest

from reflectrl.knobs import BLOCK, END, readme_blocks, update_readme

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
DOCS = ROOT / "docs"
MAX_README_LINES = 250
TWO_COMMANDS = """```bash
# the main job: sets up .venv, compares the methods on the built-in grid world, writes a report
make demo
# the tests: sets up .venv, runs the test suite
make test
```"""


def docs_pages() -> list[Path]:
    return sorted(DOCS.glob("*.md"))


def pages_with(name: str) -> list[Path]:
    start = BLOCK.format(name=name)
    return [page for page in docs_pages() if start in page.read_text()]


@pytest.mark.parametrize("name", sorted(readme_blocks()))
def test_generated_table_matches_the_code(name):
    start = BLOCK.format(name=name)
    pages = pages_with(name)
    assert len(pages) == 1, (f"generated block '{name}' is in {[p.name for p in pages]}: it belongs in one "
                             f"docs/ page; add '{start}' ... '{END}' there and refresh")
    (page,) = pages
    body = page.read_text().split(start, 1)[1].split(END, 1)[0]
    assert body.strip() == readme_blocks()[name].strip(), (
        f"docs/{page.name}'s '{name}' table is out of date: run 'python -m reflectrl.knobs docs/{page.name}'")


def test_the_docs_pages_refresh_their_own_tables(tmp_path):
    """`python -m reflectrl.knobs docs/FILE.md` (update_readme) rewrites a stale block in place."""
    for page in {pages_with(name)[0] for name in readme_blocks() if pages_with(name)}:
        copy = tmp_path / page.name
        shutil.copy(page, copy)
        name = next(n for n in readme_blocks() if BLOCK.format(name=n) in copy.read_text())
        start = BLOCK.format(name=name)
        head, rest = copy.read_text().split(start, 1)
        copy.write_text(head + start + "\n| stale |\n" + END + rest.split(END, 1)[1])
        assert name in update_readme(copy)
        assert copy.read_text() == page.read_text()


def test_no_generated_table_is_left_in_the_readme():
    assert "<!-- generated:" not in README.read_text(), "the README's tables live in docs/ now"


def test_every_registered_algo_is_in_the_docs():
    from reflectrl.registry import algo_names

    (page,) = pages_with("algos")  # the page with the table of --algo names
    text = page.read_text()
    for family in ("control", "llm"):
        for name in algo_names(family):
            assert f"`{name}`" in text, f"--algo {name} ({family}) is not in docs/{page.name}"


def test_readme_is_an_entry_point_of_at_most_250_lines():
    lines = README.read_text().splitlines()
    assert len(lines) <= MAX_README_LINES, f"README.md has {len(lines)} lines; move sections to docs/"


def test_readme_keeps_the_two_commands():
    assert TWO_COMMANDS in README.read_text()


def test_readme_links_resolve_and_include_the_layout():
    text = README.read_text()
    links = [link.split("#", 1)[0] for link in re.findall(r"\]\(([^)\s]+)\)", text)]
    local = [link for link in links if link and not re.match(r"[a-z]+:", link)]
    assert "docs/layout.md" in local
    for link in local:
        assert (ROOT / link).exists(), f"README links {link}, which does not exist"


def test_the_python_section_runs(tmp_path, monkeypatch):
    """README's "From Python" block, as written but for its budget (50,000 -> 512 env steps)."""
    text = (ROOT / "README.md").read_text()
    section = text[text.index("## From Python"):]
    code = re.search(r"```python\n(.*?)```", section, re.S).group(1)
    assert "50_000" in code
    monkeypatch.chdir(tmp_path)
    exec(compile(code.replace("50_000", "512"), "README.md", "exec"), {})
    assert (tmp_path / "runs" / "cartpole" / "run.json").exists()
