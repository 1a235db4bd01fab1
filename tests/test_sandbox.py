"""The code sandbox: correct answers pass, hostile snippets are contained, reported with the
right status, leave nothing behind and are never counted as a pass; and the CLI."""

from __future__ import annotations

import json
import os
import secrets
import socket
import sys
import time

import pytest

from reflectrl.errors import UserError
from reflectrl.sandbox import (
    InvalidTests,
    SandboxResult,
    SandboxUnavailable,
    bwrap_available,
    code_reward,
    isolation,
    load_tests,
    run_batch,
    run_code,
)

needs_bwrap = pytest.mark.skipif(not bwrap_available(),
                                 reason="bubblewrap not installed (scripts/install_system_deps.sh)")

ADD = {"entry_point": "solve", "cases": [
    {"args": [1, 2], "expected": 3},
    {"args": [2, 2], "expected": 4},
    {"args": [10, -4], "expected": 6},
]}
GOOD = "def solve(a, b):\n    return a + b\n"
ONE = {"entry_point": "solve", "cases": [{"args": [], "expected": 12345}]}


def _tag() -> str:
    return "reflectrl-sbx-test-" + secrets.token_hex(6)


def _procs_with(tag: str) -> list[int]:
    """pids (on the host) whose command line contains `tag`."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                if tag.encode() in f.read():
                    found.append(int(entry))
        except OSError:
            pass
    return found


def _never_passed(result: SandboxResult) -> None:
    assert result.passed == 0, result
    assert not any(c.passed for c in result.cases), result
    assert result.status != "ok"
    assert code_reward(result) == 0.0


# --------------------------------------------------------------------------- honest code


@needs_bwrap
def test_correct_solution_passes_every_case():
    result = run_code(GOOD, ADD, timeout=10)
    assert (result.status, result.passed, result.total) == ("ok", 3, 3), result
    assert [c.output for c in result.cases] == [3, 4, 6]
    assert code_reward(result) == 1.0 and result.reward == 1.0
    assert result.isolation == "bwrap" and result.exit_code == 0 and result.duration_s > 0
    json.dumps(result.to_dict())  # the structured result is plain data


@needs_bwrap
def test_partial_solution_gets_the_fraction_and_case_errors_are_reported():
    code = ("def solve(a, b):\n    if a == 10:\n        raise ValueError('nope')\n"
            "    return a * b if a == 2 else a + b\n")
    result = run_code(code, ADD, timeout=10)
    assert (result.status, result.passed, result.total) == ("failed", 2, 3), result
    assert code_reward(result) == pytest.approx(2 / 3)
    assert [c.passed for c in result.cases] == [True, True, False]
    assert result.cases[2].error.startswith("ValueError: nope")


@needs_bwrap
def test_syntax_error_and_import_failure():
    result = run_code("def solve(a, b)\n    return a + b\n", ADD, timeout=10)
    assert result.status == "syntax_error" and "SyntaxError" in result.reason
    _never_passed(result)
    result = run_code("import no_such_module_here\n", ADD, timeout=10)
    assert result.status == "crashed" and "ModuleNotFoundError" in result.reason
    _never_passed(result)
    result = run_code("def other(a, b):\n    return a + b\n", ADD, timeout=10)
    assert result.status == "crashed" and "defines no 'solve'" in result.reason
    _never_passed(result)


@needs_bwrap
def test_comparison_is_strict_on_plain_json():
    tests = {"entry_point": "solve", "cases": [
        {"args": [], "expected": True}, {"args": [], "expected": [1, 2]}, {"args": [], "expected": {"1": "a"}},
        {"args": [], "expected": 2.0}]}
    code = "n = 0\ndef solve():\n    global n\n    n += 1\n    return [1, (1, 2), {1: 'a'}, 2][n - 1]\n"
    result = run_code(code, tests, timeout=10)
    # 1 is not True; a tuple is a JSON list; int keys become JSON strings; 2 == 2.0
    assert [c.passed for c in result.cases] == [False, True, True, True], result


@needs_bwrap
def test_stdlib_imports_work_and_hash_seed_is_fixed():
    code = ("import collections, math, re, itertools\ndef solve():\n"
            "    return [list({'a', 'b', 'c', 'd', 'e'}), math.isqrt(99)]\n")
    one = run_code(code, ONE, timeout=10)
    two = run_code(code, ONE, timeout=10)
    assert one.status == "failed" and one.cases[0].error == "wrong output"
    assert one.cases[0].output == two.cases[0].output


@needs_bwrap
def test_each_run_gets_a_fresh_working_directory():
    write = ("import os\nopen('left-behind.txt', 'w').write('x')\ndef solve():\n"
             "    return [os.getcwd(), sorted(os.listdir('.'))]\n")
    first = run_code(write, ONE, timeout=10)
    assert first.cases[0].output == ["/tmp/work", ["left-behind.txt"]], first
    second = run_code("import os\ndef solve():\n    return sorted(os.listdir('.'))\n", ONE, timeout=10)
    assert second.cases[0].output == [], second


# --------------------------------------------------------------------------- resource attacks


@needs_bwrap
def test_infinite_loop_times_out_and_leaves_no_process():
    tag = _tag()
    code = f"""import os, sys
def solve(a, b):
    if os.fork() == 0:
        os.execv(sys.executable, [sys.executable, "-c", "import time; time.sleep(60)", {tag!r}])
    while True:
        pass
"""
    start = time.monotonic()
    result = run_code(code, ADD, timeout=1.0)
    assert time.monotonic() - start < 5
    assert result.status == "timeout" and "wall-clock" in result.reason, result
    _never_passed(result)
    assert _procs_with(tag) == []


@needs_bwrap
def test_timeout_keeps_credit_for_cases_finished_before_it():
    code = "def solve(a, b):\n    while a == 2:\n        pass\n    return a + b\n"
    result = run_code(code, ADD, timeout=1.0)
    assert result.status == "timeout" and result.passed == 1, result
    assert [c.error for c in result.cases[1:]] == ["not run", "not run"]


@needs_bwrap
def test_fork_bomb_is_capped_and_cleaned_up():
    tag = _tag()
    code = f"""import os, sys
def solve():
    n = 0
    try:
        while True:
            if os.fork() == 0:
                os.execv(sys.executable, [sys.executable, "-c", "import time; time.sleep(60)", {tag!r}])
            n += 1
    except OSError:
        return n
"""
    result = run_code(code, ONE, timeout=5, max_processes=16)
    assert result.status == "failed", result
    assert 0 < result.cases[0].output < 16  # RLIMIT_NPROC stopped it
    _never_passed(result)
    assert _procs_with(tag) == []


@needs_bwrap
def test_fork_bomb_that_never_stops_times_out_and_leaves_nothing():
    code = ("import os\ndef solve():\n    while True:\n        try:\n            os.fork()\n"
            "        except OSError:\n            pass\n")
    result = run_code(code, ONE, timeout=1.5, max_processes=16)
    assert result.status in ("timeout", "crashed"), result
    _never_passed(result)


@needs_bwrap
def test_memory_bomb_is_reported_as_memory():
    result = run_code("def solve():\n    return len(b'x' * (1 << 34))\n", ONE, timeout=10)
    assert result.status == "memory", result
    _never_passed(result)
    grow = "def solve():\n    keep = []\n    while True:\n        keep.append('x' * 1000000)\n"
    result = run_code(grow, ONE, timeout=10, memory_mb=128)
    assert result.status == "memory", result
    _never_passed(result)


@needs_bwrap
def test_huge_output_is_capped_and_the_run_killed():
    code = ("import sys\ndef solve():\n    while True:\n        print('x' * 10000)\n"
            "        sys.stderr.write('y' * 10000)\n")
    start = time.monotonic()
    result = run_code(code, ONE, timeout=10, max_output_bytes=1 << 20)
    assert time.monotonic() - start < 5
    assert result.status == "killed" and "stdout+stderr" in result.reason, result
    assert len(result.stdout) <= 8192 and len(result.stderr_tail) <= 8192
    _never_passed(result)


@needs_bwrap
def test_big_files_hit_the_file_size_limit():
    code = "def solve():\n    with open('big', 'wb') as f:\n        f.write(b'x' * (8 << 20))\n    return 12345\n"
    result = run_code(code, ONE, timeout=10, max_file_mb=1)
    # Python ignores SIGXFSZ, so the write fails with EFBIG inside the snippet
    assert result.status == "failed" and "File too large" in result.cases[0].error, result
    _never_passed(result)


# --------------------------------------------------------------------------- escapes


@needs_bwrap
def test_writing_outside_the_work_directory_fails(tmp_path):
    tag = _tag()
    targets = [str(tmp_path / "escape.txt"), f"/tmp/{tag}", "/work/main/" + tag, "/usr/" + tag, "/" + tag,
               "/etc/" + tag, "/root/" + tag]
    code = f"""import os
def solve():
    out = {{}}
    for path in {targets!r}:
        try:
            with open(path, "w") as f:
                f.write("escaped")
            out[path] = "wrote"
        except OSError as err:
            out[path] = type(err).__name__
    return out
"""
    result = run_code(code, ONE, timeout=10)
    assert result.status == "failed", result
    for path in targets:
        if path == f"/tmp/{tag}":
            assert result.cases[0].output[path] == "wrote"  # the sandbox's own private /tmp
        assert not os.path.exists(path), path  # ... and nothing reached the host


@needs_bwrap
def test_deleting_files_outside_the_work_directory_fails(tmp_path):
    canary = tmp_path / "canary.txt"
    canary.write_text("still here")
    code = f"""import os, shutil
def solve():
    out = []
    for attempt in (lambda: os.remove({str(canary)!r}), lambda: shutil.rmtree({str(tmp_path)!r}),
                    lambda: os.truncate({str(canary)!r}, 0), lambda: shutil.rmtree("/usr/lib")):
        try:
            attempt()
            out.append("done")
        except OSError as err:
            out.append(type(err).__name__)
    return out
"""
    result = run_code(code, ONE, timeout=10)
    assert "done" not in result.cases[0].output[:3], result
    assert canary.read_text() == "still here"
    assert os.path.isdir("/usr/lib")


@needs_bwrap
def test_the_parent_environment_is_not_visible(monkeypatch):
    secret = "hunter2-" + secrets.token_hex(8)
    monkeypatch.setenv("REFLECTRL_TEST_SECRET", secret)
    code = """import os
def solve():
    seen = [dict(os.environ)]
    for path in ("/proc/self/environ", "/proc/1/environ", "/proc/%d/environ" % os.getppid()):
        try:
            seen.append(open(path, "rb").read().decode("latin-1"))
        except OSError as err:
            seen.append(type(err).__name__)
    print(seen)
    return seen
"""
    result = run_code(code, ONE, timeout=10)
    assert result.status == "failed", result
    assert secret not in json.dumps(result.cases[0].output) and secret not in result.stdout
    assert "REFLECTRL_TEST_SECRET" not in result.cases[0].output[0]
    assert set(result.cases[0].output[0]) <= {"PATH", "HOME", "LANG", "TZ", "PYTHONHASHSEED", "PWD"}


@needs_bwrap
def test_no_network(tmp_path):
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    listener.bind(("127.0.0.1", 0))
    listener.listen(4)
    listener.setblocking(False)
    port = listener.getsockname()[1]
    code = f"""import socket
def attempt(fn):
    try:
        fn()
        return "connected"
    except OSError as err:
        return type(err).__name__
def solve():
    return [attempt(lambda: socket.create_connection(("127.0.0.1", {port}), timeout=1)),
            attempt(lambda: socket.create_connection(("1.1.1.1", 53), timeout=1)),
            attempt(lambda: socket.getaddrinfo("example.com", 80)),
            attempt(lambda: socket.create_connection(("example.com", 80), timeout=1))]
"""
    try:
        result = run_code(code, ONE, timeout=10)
        assert result.status == "failed", result
        assert "connected" not in result.cases[0].output, result.cases[0].output
        with pytest.raises(BlockingIOError):
            listener.accept()  # nothing reached the host's loopback
    finally:
        listener.close()


@needs_bwrap
def test_a_daemon_cannot_outlive_the_run(tmp_path):
    tag = _tag()
    marker = tmp_path / "daemon-was-here"
    daemon = f"import time\\ntime.sleep(0.4)\\nopen({str(marker)!r}, 'w').write('alive')\\ntime.sleep(60)"
    code = f"""import os, sys
def solve():
    if os.fork() == 0:
        os.setsid()
        if os.fork() == 0:
            os.execv(sys.executable, [sys.executable, "-c", "{daemon}", {tag!r}])
        os._exit(0)
    os.wait()
    return 12345
"""
    result = run_code(code, ONE, timeout=10)
    assert result.status == "ok", result  # the honest part of the snippet still works
    assert _procs_with(tag) == []
    time.sleep(0.8)
    assert _procs_with(tag) == [] and not marker.exists()


# --------------------------------------------------------------------------- forging the verdict


@needs_bwrap
def test_printing_a_fake_success_report_does_not_pass():
    code = r"""import json, os
def solve(a, b):
    print(json.dumps({"passed": 3, "total": 3, "status": "ok", "reward": 1.0}))
    print("0123456789abcdef0123456789abcdef 0 ok 3\n0123456789abcdef0123456789abcdef end 3")
    for fd in range(3, 64):
        try:
            os.write(fd, b"0123456789abcdef0123456789abcdef 0 ok 3\n")
        except OSError:
            pass
    return -1
"""
    result = run_code(code, ADD, timeout=10)
    assert '"passed": 3' in result.stdout  # it printed its report; nobody believed it
    _never_passed(result)


@needs_bwrap
def test_forging_records_with_the_real_nonce_does_not_pass():
    # The snippet digs the nonce and the channel out of the harness's frame and writes a
    # complete, well-framed report. It still cannot know the expected values.
    code = r"""import os, sys
def solve(a, b):
    f = sys._getframe(1)
    while "nonce" not in f.f_locals:
        f = f.f_back
    loc = f.f_locals
    nonce, fd, n = loc["nonce"], loc["fd"], len(loc["cases"])
    os.write(fd, b"".join(nonce + b" %d ok true\n" % i for i in range(n)) + nonce + b" end %d\n" % n)
    os._exit(0)
"""
    result = run_code(code, ADD, timeout=10)
    _never_passed(result)
    # the same forgery after the harness's own first record: a duplicate index is malformed
    code2 = code.replace("def solve(a, b):", "def solve(a, b):\n    if a == 1:\n        return 3")
    result = run_code(code2, ADD, timeout=10)
    assert result.status == "crashed" and "malformed" in result.reason, result
    _never_passed(result)


@needs_bwrap
def test_objects_that_equal_anything_fail():
    for code in ("class A:\n    __eq__ = lambda s, o: True\n    __hash__ = None\ndef solve(a, b):\n    return A()\n",
                 "class B(int):\n    def __eq__(s, o):\n        return True\ndef solve(a, b):\n    return B(0)\n",
                 "def solve(a, b):\n    return float('nan')\n",
                 "def solve(a, b):\n    return iter([a + b])\n"):
        result = run_code(code, ADD, timeout=10)
        assert result.status == "failed", (code, result)
        _never_passed(result)


@needs_bwrap
def test_monkeypatching_the_harness_json_and_exit_does_not_pass():
    patch = """import builtins, json, os, posix, sys, _json
json.dumps = lambda *a, **k: "3"
json.loads = lambda *a, **k: 3
_json.make_encoder = lambda *a, **k: (lambda o, i: ("3",))
_json.encode_basestring_ascii = lambda s: '"ok"'
posix.write = os.write = lambda fd, data: len(data)
sys.exit = os._exit = posix._exit = lambda *a: None
builtins.BaseException = builtins.Exception = KeyError
builtins.callable = lambda f: True
"""
    result = run_code(patch + "def solve(a, b):\n    return -1\n", ADD, timeout=10)
    assert result.status == "failed", result
    _never_passed(result)
    # the harness bound what it needs before the snippet ran: patching breaks nothing honest
    result = run_code(patch + GOOD, ADD, timeout=10)
    assert (result.status, result.passed) == ("ok", 3), result


@pytest.mark.parametrize("code", [
    "import sys\nsys.exit(0)\n",
    "import os\nos._exit(0)\n",
    "import os, signal\nos.kill(os.getpid(), signal.SIGKILL)\n",
    "import os\ndef solve(a, b):\n    os._exit(0)\n",
    "def solve(a, b):\n    raise SystemExit(0)\n",
    "import os, signal\ndef solve(a, b):\n    os.kill(os.getpid(), signal.SIGKILL)\n",
], ids=["sys.exit-at-import", "os._exit-at-import", "sigkill-at-import", "os._exit-in-case", "SystemExit-in-case",
        "sigkill-in-case"])
@needs_bwrap
def test_exiting_early_never_passes(code):
    result = run_code(code, ADD, timeout=10)
    assert result.status in ("crashed", "failed", "killed"), result
    _never_passed(result)


# --------------------------------------------------------------------------- batch, modes, validation


@needs_bwrap
def test_run_batch_keeps_order_and_runs_in_parallel(monkeypatch):
    # each sandbox is timed from the parent; the slow ones sleep 0.5 s inside it, so two that run at
    # once overlap by about that much, and two that run one after the other never overlap
    runner = sys.modules[run_batch.__module__]
    real_run_code, spans = runner.run_code, {}

    def timed_run_code(code, tests, **kwargs):
        start = time.monotonic()
        result = real_run_code(code, tests, **kwargs)
        spans[code] = (start, time.monotonic())
        return result

    monkeypatch.setattr(runner, "run_code", timed_run_code)
    slow = "import time\ntime.sleep(0.5)\n"
    codes = [slow + GOOD + "# 0", slow + "def solve(a, b):\n    return 0\n", "def solve(a, b)\n", slow + GOOD + "# 3"]
    results = run_batch([(code, ADD) for code in codes], max_workers=2, timeout=10)
    assert [r.status for r in results] == ["ok", "failed", "syntax_error", "ok"]
    assert [code_reward(r) for r in results] == [1.0, 0.0, 0.0, 1.0]
    # in parallel: the first two (one per worker) were in their sandboxes at the same time ...
    (start0, end0), (start1, end1) = spans[codes[0]], spans[codes[1]]
    assert start1 < end0 and start0 < end1, spans
    # ... and never more than max_workers at once
    events = sorted([(s, 1) for s, _ in spans.values()] + [(e, -1) for _, e in spans.values()])
    running = [sum(step for _, step in events[:i + 1]) for i in range(len(events))]
    assert max(running) == 2, spans
    assert run_batch([]) == []


def test_code_reward():
    assert code_reward(SandboxResult(passed=2, total=4, status="failed", duration_s=0.1)) == 0.5
    assert code_reward(SandboxResult(passed=0, total=0, status="ok", duration_s=0.1)) == 0.0


def test_missing_bwrap_is_a_clear_error_not_an_unconfined_run(monkeypatch):
    monkeypatch.setattr(isolation, "_bwrap_path", lambda: None)
    with pytest.raises(SandboxUnavailable, match="apt-get install bubblewrap"):
        run_code(GOOD, ADD)
    assert not bwrap_available()


SYSTEM_PYTHON = "/usr/bin/python3"


@pytest.mark.skipif(not os.path.exists(SYSTEM_PYTHON), reason="needs a world-readable system python")
def test_rlimits_only_mode_runs_limits_and_cleans_up():
    result = run_code(GOOD, ADD, timeout=10, isolation="rlimits-only", python=SYSTEM_PYTHON)
    assert (result.status, result.passed, result.isolation) == ("ok", 3, "rlimits-only"), result
    result = run_code("def solve(a, b):\n    while True:\n        pass\n", ADD, timeout=1.0,
                      isolation="rlimits-only", python=SYSTEM_PYTHON)
    assert result.status == "timeout"
    _never_passed(result)
    if os.geteuid() == 0:  # as root every process of the run's own uid is killed at the end
        tag = _tag()
        code = f"""import os, sys
def solve(a, b):
    if os.fork() == 0:
        os.setsid()
        if os.fork() == 0:
            os.execv(sys.executable, [sys.executable, "-c", "import time; time.sleep(60)", {tag!r}])
        os._exit(0)
    return a + b
"""
        result = run_code(code, ADD, timeout=10, isolation="rlimits-only", python=SYSTEM_PYTHON)
        assert result.status == "ok", result
        assert _procs_with(tag) == []


@pytest.mark.parametrize("tests, message", [
    ([], "must be a JSON object"),
    ({"cases": []}, "no 'entry_point'"),
    ({"entry_point": "not an id", "cases": []}, "identifier"),
    ({"entry_point": "solve"}, "no 'cases'"),
    ({"entry_point": "solve", "cases": {}}, "must be a list"),
    ({"entry_point": "solve", "cases": [{"args": [1]}]}, "no 'expected'"),
    ({"entry_point": "solve", "cases": [{"args": 1, "expected": 1}]}, "'args' must be a list"),
    ({"entry_point": "solve", "cases": [{"args": [], "expected": 1, "exp": 2}]}, "unknown key"),
    ({"entry_point": "solve", "cases": [{"args": [object()], "expected": 1}]}, "not plain JSON"),
])
def test_invalid_tests_are_user_errors(tests, message):
    with pytest.raises(InvalidTests, match=message):
        load_tests(tests)
    assert issubclass(InvalidTests, UserError)


# --------------------------------------------------------------------------- package and old paths


def test_importing_the_cli_does_not_import_the_sandbox():
    import subprocess

    probe = ("import sys, reflectrl.sandbox.cli, reflectrl.sandbox.cli\n"
             "print(sorted(m for m in sys.modules if m.startswith('reflectrl.sandbox.')))")
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "['reflectrl.sandbox.cli']", out
    import reflectrl.sandbox as pkg

    assert set(pkg.__all__) <= set(dir(pkg))
    with pytest.raises(AttributeError):
        pkg.no_such_name


# --------------------------------------------------------------------------- CLI


def _cli(capsys, *argv):
    """`reflectrl sandbox ...` through the real CLI when it is wired, else through the same
    parser class and error handling on a parser built here."""
    from reflectrl import cli
    from reflectrl.sandbox import cli as sandbox_cli

    argv = [str(a) for a in argv]
    try:
        cli.build_parser().parse_args(["sandbox", "run", "--code", "x.py", "--tests", "t.json"])
        wired = True
    except UserError:
        wired = False
    if wired:
        code = cli.main(argv)
    else:
        parser = cli._Parser(prog="reflectrl")
        sandbox_cli.add_parser(parser.add_subparsers(dest="command", parser_class=cli._Parser, required=True))
        try:
            code = sandbox_cli.run(parser.parse_args(argv))
        except UserError as err:
            print(f"reflectrl: error: {err}", file=sys.stderr)
            code = 2
    out, err = capsys.readouterr()
    return code, out, err


@needs_bwrap
def test_cli_json_last_line_is_the_result(tmp_path, capsys):
    (tmp_path / "sol.py").write_text("def solve(a, b):\n    print('{\"passed\": 3, \"total\": 3}')\n    return a - b\n")
    (tmp_path / "tests.json").write_text(json.dumps(ADD))
    code, out, err = _cli(capsys, "sandbox", "run", "--code", tmp_path / "sol.py", "--tests", tmp_path / "tests.json",
                          "--timeout", "10", "--json")
    assert code == 1, err  # a failing case: non-zero, as a test runner's
    result = json.loads(out.strip().splitlines()[-1])
    assert (result["status"], result["passed"], result["total"], result["reward"]) == ("failed", 0, 3, 0.0)
    (tmp_path / "sol.py").write_text(GOOD)
    code, out, err = _cli(capsys, "sandbox", "run", "--code", tmp_path / "sol.py", "--tests", tmp_path / "tests.json")
    assert code == 0 and out.startswith("ok: 3/3 cases passed"), out


@needs_bwrap
def test_the_tests_file_is_not_visible_to_the_code(tmp_path, capsys):
    tests_file = tmp_path / "tests.json"
    tests_file.write_text(json.dumps(ADD))
    (tmp_path / "sol.py").write_text(f"""import json
def solve(a, b):
    for case in json.load(open({str(tests_file)!r}))["cases"]:
        if case["args"] == [a, b]:
            return case["expected"]
""")
    code, out, err = _cli(capsys, "sandbox", "run", "--code", tmp_path / "sol.py", "--tests", tests_file, "--json")
    result = json.loads(out.strip().splitlines()[-1])
    assert result["passed"] == 0 and "FileNotFoundError" in result["cases"][0]["error"], result


@pytest.mark.skipif(not os.path.exists(SYSTEM_PYTHON), reason="needs a world-readable system python")
def test_cli_unsafe_no_bwrap_says_so(tmp_path, capsys):
    (tmp_path / "sol.py").write_text(GOOD)
    (tmp_path / "tests.json").write_text(json.dumps(ADD))
    code, out, err = _cli(capsys, "sandbox", "run", "--code", tmp_path / "sol.py", "--tests", tmp_path / "tests.json",
                          "--unsafe-no-bwrap", "--python", SYSTEM_PYTHON, "--json")
    assert code == 0 and "no filesystem, network or process isolation" in err
    result = json.loads(out.strip().splitlines()[-1])
    assert (result["status"], result["isolation"], result["reward"]) == ("ok", "rlimits-only", 1.0)


@pytest.mark.parametrize("setup, message", [
    (lambda d: None, "--code"),                                                   # no code file
    (lambda d: (d / "sol.py").write_text(GOOD), "no such file"),                  # no tests file
    (lambda d: ((d / "sol.py").write_text(GOOD), (d / "tests.json").write_text("{bad")), "invalid JSON"),
    (lambda d: ((d / "sol.py").write_text(GOOD), (d / "tests.json").write_text('{"cases": []}')), "entry_point"),
    (lambda d: ((d / "sol.py").write_text(GOOD), (d / "tests.json").write_text('{"entry_point": "solve"}')), "cases"),
    (lambda d: ((d / "sol.py").write_bytes(b"\xff\xfe"), (d / "tests.json").write_text(json.dumps(ADD))), "UTF-8"),
], ids=["missing-code", "missing-tests", "bad-json", "no-entry-point", "no-cases", "binary-code"])
def test_cli_bad_input_is_one_line_and_exit_2(tmp_path, capsys, setup, message):
    setup(tmp_path)
    code, out, err = _cli(capsys, "sandbox", "run", "--code", tmp_path / "sol.py", "--tests", tmp_path / "tests.json")
    assert code == 2
    assert err.startswith("reflectrl: error: ") and err.count("\n") == 1 and message in err, err
    assert "Traceback" not in err and out == ""


def test_cli_missing_arguments_and_bad_timeout(tmp_path, capsys):
    code, out, err = _cli(capsys, "sandbox", "run", "--code", "x.py")
    assert code == 2 and err.startswith("reflectrl: error: ") and err.count("\n") == 1 and "--tests" in err
    (tmp_path / "sol.py").write_text(GOOD)
    (tmp_path / "tests.json").write_text(json.dumps(ADD))
    code, out, err = _cli(capsys, "sandbox", "run", "--code", tmp_path / "sol.py", "--tests", tmp_path / "tests.json",
                          "--timeout", "0")
    assert code == 2 and "--timeout" in err and err.count("\n") == 1
