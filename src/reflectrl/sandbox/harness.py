"""The harness: the program that runs inside the sandbox, and its wire format.

`HARNESS` is run as `python -S -B -c HARNESS`, one process per run. It reads its payload
(a marshal'ed dict: the code, the entry point, each case's *arguments*, the nonce, the
rlimits, the uid to drop to, extra sys.path entries, the result pipe's fd) from stdin,
points stdin at /dev/null, drops to the run's uid and sets the rlimits before any of the
snippet runs, compiles and imports the code, calls the entry point per case and writes
one line per case to the private result pipe:

    <nonce> <i> ok <json>        the case returned (compact JSON, ASCII, no NaN)
    <nonce> <i> err <message>    it raised (a JSON string: "ExcType: text", 2000 chars at most)
    <nonce> end <n>              every case was reported
    <nonce> syntax <message>     the code does not compile (the only line)
    <nonce> load <message>       importing it or finding the entry point failed (the only line)

The nonce is random per run. The harness imports only built-in modules (marshal, posix,
_json) and resource, so start-up stays near bare-interpreter cost, and binds everything
it needs after the snippet is imported to locals first: monkeypatching json, _json,
posix.write, sys.exit, os._exit or builtins does not touch it, and whatever the snippet
does to it can only garble or drop outputs. The harness never sees the expected values,
so it cannot be talked into a pass; it does not judge anything.

`parse_channel` is the parent's side of the same format: it decodes the lines with
`json.loads` (NaN/Infinity rejected) and checks the framing (nonce, indices in order, one
end marker, nothing after it); anything else makes the channel 'malformed'. Comparing
the outputs with the expected values is `reflectrl.sandbox.verdict`; isolation (bwrap,
which rlimits) is `reflectrl.sandbox.isolation`.
"""

from __future__ import annotations

import json

__all__ = ["HARNESS", "parse_channel"]

# Runs as `python -S -B -c HARNESS` (see the module docstring); keep it to built-in modules.
HARNESS = r"""
import sys, posix, marshal, resource, _json
def _h():
    rd, wr, ex, BE, cal, ty, st = posix.read, posix.write, posix._exit, BaseException, callable, type, str
    esc, mk, out, err = _json.encode_basestring_ascii, _json.make_encoder, sys.stdout, sys.stderr
    buf = []
    while True:
        b = rd(0, 1048576)
        if not b:
            break
        buf.append(b)
    p = marshal.loads(b"".join(buf))
    del buf
    n = posix.open("/dev/null", posix.O_RDWR)
    posix.dup2(n, 0)
    posix.close(n)
    if sys.path and sys.path[0] == "":
        del sys.path[0]
    sys.path.extend(p["paths"])
    if p["uid"] is not None:
        posix.setgroups([])
        posix.setresgid(p["gid"], p["gid"], p["gid"])
        posix.setresuid(p["uid"], p["uid"], p["uid"])
    for r, soft, hard in p["limits"]:
        resource.setrlimit(r, (soft, hard))
    fd, nonce, entry, cases, src = p["fd"], p["nonce"].encode(), p["entry"], p["cases"], p["code"]
    del p
    def emit(line):
        while line:
            line = line[wr(fd, line):]
    def say(e):
        try:
            s = ty(e).__name__ + ": " + st(e)
        except BE:
            s = "unprintable exception"
        return esc(s[:2000]).encode()
    def no_json(o):
        raise TypeError("output of type %s is not JSON-serialisable" % ty(o).__name__)
    def done():
        try:
            out.flush()
            err.flush()
        except BE:
            pass
        ex(0)
    try:
        code = compile(src, "solution.py", "exec", dont_inherit=True)
    except BE as e:
        emit(nonce + b" syntax " + say(e) + b"\n")
        done()
    del src
    ns = {"__name__": "solution", "__builtins__": __builtins__}
    try:
        exec(code, ns)
        fn = ns.get(entry)
        if fn is None:
            raise NameError("the code defines no %r" % entry)
        if not cal(fn):
            raise TypeError("%r is not callable" % entry)
    except BE as e:
        emit(nonce + b" load " + say(e) + b"\n")
        done()
    i = 0
    for a, k in cases:
        try:
            r = fn(*a, **k)
            line = (nonce + b" %d ok " % i
                    + "".join(mk({}, no_json, esc, None, ":", ",", False, False, False)(r, 0)).encode() + b"\n")
        except BE as e:
            line = nonce + b" %d err " % i + say(e) + b"\n"
        emit(line)
        i += 1
    emit(nonce + b" end %d\n" % i)
    done()
_h()
"""


def _strict_constant(name):
    raise ValueError(f"{name} is not allowed")


def parse_channel(data: bytes, nonce: bytes, total: int, cut_short: bool):
    """Decode the child's result lines. Returns (kind, payload): kind is 'cases' (payload: a list of
    ('ok', value) / ('err', message), complete flag), 'syntax' / 'load' (payload: message), or
    'malformed' (payload: why)."""
    lines = data.split(b"\n")
    if lines[-1]:
        if not cut_short:
            return "malformed", "a result line without its newline"
    lines.pop()
    prefix = nonce + b" "
    records: list = []
    ended = False

    def decode(raw: bytes):
        return json.loads(raw, parse_constant=_strict_constant)

    for n, line in enumerate(lines):
        if ended:
            return "malformed", "result lines after the end marker"
        if not line.startswith(prefix):
            return "malformed", "a result line without this run's nonce"
        parts = line[len(prefix):].split(b" ", 2)
        try:
            if parts[0] in (b"syntax", b"load") and len(parts) >= 2:
                if n != 0 or len(lines) != 1:
                    return "malformed", f"a '{parts[0].decode()}' record that is not the only one"
                msg = decode(b" ".join(parts[1:]))
                if not isinstance(msg, str):
                    return "malformed", "a non-string error message"
                return parts[0].decode(), msg
            if parts[0] == b"end" and len(parts) == 2:
                if int(parts[1]) != len(records) or len(records) != total:
                    return "malformed", "an end marker with the wrong case count"
                ended = True
                continue
            if len(parts) != 3 or int(parts[0]) != len(records) or len(records) >= total \
                    or parts[1] not in (b"ok", b"err") or not parts[0].isdigit():
                return "malformed", "a result line out of order or badly framed"
            value = decode(parts[2])
            if parts[1] == b"err" and not isinstance(value, str):
                return "malformed", "a non-string error message"
            records.append(("ok", value) if parts[1] == b"ok" else ("err", value[:2000]))
        except (ValueError, RecursionError, UnicodeDecodeError, MemoryError):
            return "malformed", "a result line that is not valid JSON"
    return "cases", (records, ended)
