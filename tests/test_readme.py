"""The README's generated tables (algos, each signal's knobs) agree with the registry and the
config dataclasses; refresh them with `python -m reflectrl.knobs README.md`."""

from pathlib import Path

import pytest

from reflectrl.knobs import BLOCK, END, readme_blocks

README = Path(__file__).resolve().parents[1] / "README.md"


@pytest.mark.parametrize("name", sorted(readme_blocks()))
def test_readme_table_matches_the_code(name):
    text = README.read_text()
    start = BLOCK.format(name=name)
    assert start in text, f"README has no generated block '{name}': add '{start}' ... '{END}' and refresh"
    body = text.split(start, 1)[1].split(END, 1)[0]
    assert body.strip() == readme_blocks()[name].strip(), (
        f"README's '{name}' table is out of date: run 'python -m reflectrl.knobs README.md'")


def test_every_registered_algo_is_in_the_readme():
    from reflectrl.registry import algo_names

    text = README.read_text()
    for family in ("control", "llm"):
        for name in algo_names(family):
            assert f"`{name}`" in text, f"--algo {name} ({family}) is not in the README"
