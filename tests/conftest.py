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


@pytest.fixture
def sigterm_after_rows(monkeypatch):
    """`arm(n)`: the next `reflectrl train` in this process gets a real SIGTERM right after it logs its
    n-th metrics row, so it stops mid-run at a known iteration boundary (with a checkpoint) and exits 143,
    as a `kill` would make it; deterministic, no subprocess. Returns the list of rows logged so far."""
    import signal

    from reflectrl.runs import session
    from reflectrl.runs.rundir import MetricsLogger

    def arm(n: int) -> list[dict]:
        log, logged = MetricsLogger.log, []

        def log_then_terminate(self, row):
            log(self, row)
            logged.append(row)
            if len(logged) == n:
                # only inside the trainer's SIGTERM block; anywhere else SIGTERM would end pytest
                assert signal.getsignal(signal.SIGTERM) is session._on_sigterm
                signal.raise_signal(signal.SIGTERM)

        monkeypatch.setattr(MetricsLogger, "log", log_then_terminate)
        return logged

    return arm


@pytest.fixture
def ctrl_c_after_rows(monkeypatch, sigint_as_in_a_terminal):
    """`arm(n, times=1)`: the next `reflectrl train` in this process gets Ctrl-C (a real SIGINT) `times`
    times right after it logs its n-th metrics row, as a terminal's Ctrl-C would: once, it stops at the
    end of that iteration with a checkpoint there; twice, at once. Deterministic, no subprocess."""
    import signal

    from reflectrl.runs import session
    from reflectrl.runs.rundir import MetricsLogger

    def arm(n: int, times: int = 1) -> None:
        log, logged = MetricsLogger.log, []

        def log_then_interrupt(self, row):
            log(self, row)
            logged.append(row)
            if len(logged) == n:
                # only inside the trainer's block; anywhere else SIGINT would stop pytest
                assert signal.getsignal(signal.SIGINT) is session._on_sigint
                for _ in range(times):
                    signal.raise_signal(signal.SIGINT)

        monkeypatch.setattr(MetricsLogger, "log", log_then_interrupt)

    return arm


@pytest.fixture
def sigint_as_in_a_terminal():
    """SIGINT raising KeyboardInterrupt, as in a terminal, for the test's duration: a test suite started in
    the background (`cmd &` in a non-interactive shell, as CI may) inherits SIGINT ignored, and a trainer
    leaves an ignored SIGINT alone, as it should for a process the shell shielded."""
    import signal

    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    yield
    signal.signal(signal.SIGINT, previous)


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory):
    """A tiny random causal LM made by `reflectrl llm init-tiny` (no download), shared by the LLM tests."""
    pytest.importorskip("transformers")
    from reflectrl.llm.model import init_tiny

    return init_tiny(tmp_path_factory.mktemp("llm") / "tiny", hidden_size=32, layers=1, heads=2,
                     intermediate_size=64, vocab_size=384)


@pytest.fixture(scope="session")
def sft_arith_model_dir(tiny_model_dir, tmp_path_factory):
    """The tiny model after a short SFT on arith[max_operand=9]: GRPO gets non-zero rewards from it,
    so a bit-identity check between two trainers compares updates that happened."""
    from reflectrl.llm.model import load_model
    from reflectrl.llm.sft import sft
    from reflectrl.llm.tasks import make_task

    model, tok = load_model(str(tiny_model_dir))
    path = tmp_path_factory.mktemp("sft") / "arith9"
    sft(model, tok, make_task(SFT_ARITH), steps=300, out=path, learning_rate=3e-3, progress=False)
    return path


SFT_ARITH = "arith[max_operand=9]"
