"""Filter pip's output for scripts/setup.sh: `pip install ... 2>&1 | python scripts/pip_output.py`.

Two packages go in without their dependency pins on purpose (scripts/setup.sh, scripts/install_verl.sh):
gymnax (pins gymnasium<1.4 for its renderer only), verl (pins transformers<5.11; the adapter uses only
its advantage-estimator registry) and verl's tensordict (pins pyvers<0.2, whose packaging<26 cap would
break navix's setuptools-scm). After that, every later `pip install` in the same environment ends
with "ERROR: pip's dependency resolver does not currently take into account ..." and a line per such
pin, although the install succeeded, and a newcomer reads that as a failure. This filter drops those
expected lines and says in one line of our own what they were; a conflict about any other package is
passed through untouched, ERROR line included, since that one may be real. It also drops the
"WARNING: Location ... is ignored" lines these machines' local package index prints.
"""

from __future__ import annotations

import re
import sys

# package -> why its pin is left unmet (said once, in our own words)
DELIBERATE = {
    "gymnax": "gymnax's gymnasium<1.4 (its renderer only)",
    "verl": "verl's transformers/torch pins (the adapter needs only its estimator registry)",
    "tensordict": "tensordict's pyvers<0.2 (verl's; it would hold packaging below what navix needs)",
}
RESOLVER = "ERROR: pip's dependency resolver does not currently take into account"
CONFLICT = re.compile(r"^(?P<package>[A-Za-z0-9_.-]+) [^ ]+ requires .*, but you have .* which is incompatible\.$")
NOISE = re.compile(r"^WARNING: Location .* is ignored")


def filter_lines(lines: list[str]) -> list[str]:
    """pip's output lines, less the expected resolver report (replaced by one note) and the index noise."""
    out, held, expected = [], None, []
    for line in (raw.rstrip("\n") for raw in lines):
        if NOISE.match(line):
            continue
        if line.startswith(RESOLVER):
            held = line  # kept back until we know whether every conflict under it is a deliberate one
            continue
        match = CONFLICT.match(line)
        if match and held is not None:
            package = match.group("package").lower()
            if package in DELIBERATE:
                expected.append(package)
            else:
                if held:
                    out.append(held)
                out.append(line)
                held = ""  # the report's header is out; later conflict lines follow it as they are
            continue
        if held is not None and not match:
            held = None
        out.append(line)
    if expected:
        said = "; ".join(DELIBERATE[p] for p in dict.fromkeys(expected))
        out.append(f"setup: pip's conflict report about {', '.join(dict.fromkeys(expected))} is expected and "
                   f"harmless (installed without their pins on purpose: {said})")
    return out


def main() -> int:
    for line in filter_lines(sys.stdin.readlines()):
        print(line, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
