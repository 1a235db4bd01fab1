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


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory):
    """A tiny random causal LM made by `reflectrl llm init-tiny` (no download), shared by the LLM tests."""
    pytest.importorskip("transformers")
    from reflectrl.llm.model import init_tiny

    return init_tiny(tmp_path_factory.mktemp("llm") / "tiny", hidden_size=32, layers=1, heads=2,
                     intermediate_size=64, vocab_size=384)
