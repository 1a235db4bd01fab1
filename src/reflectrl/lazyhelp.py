"""Help text computed only when a help page is printed.

Some option help lists what the registry knows (every `--algo`, every knob section), and
reading that imports every signal module, and so torch: 2 s that `reflectrl --help`, and a
command that never prints the option's help, need not pay. `LazyHelp(prefix, make)` is a
str (the prefix) that argparse stores as an option's help; argparse formats a help text with
`help % params` only when it prints it, and that is when `make()` runs.
"""

from __future__ import annotations

from collections.abc import Callable


class LazyHelp(str):
    def __new__(cls, prefix: str, make: Callable[[], str]):
        text = super().__new__(cls, prefix)
        text.make = make
        return text

    def __mod__(self, params):
        return str(self.make()) % params
