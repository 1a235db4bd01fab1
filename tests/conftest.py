import os

import pytest

os.environ.setdefault("PYTHONHASHSEED", "0")


@pytest.fixture
def cli(capsys):
    """Run `reflectrl ...` in-process; returns (exit code, stdout, stderr)."""
    from reflectrl.cli import main

    def run(*argv: str):
        code = main([str(a) for a in argv])
        out, err = capsys.readouterr()
        return code, out, err

    return run
