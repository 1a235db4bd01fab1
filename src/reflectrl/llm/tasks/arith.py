"""`arith`: exact-match arithmetic on two small operands.

    prompt "12+7="   demonstration ["19"]   answer "19"
    prompt "4-9="    demonstration ["-5"]   (results may be negative)
    prompt "6*7="    demonstration ["42"]   (only with ops containing '*')

The format is as compact as it gets so that a tiny transformer (2 layers, width 64, a
byte-level BPE of a few hundred tokens) can learn it from a short SFT on a CPU. Options:

    max_operand  operands are drawn uniformly from 0..max_operand (default 30)
    ops          the operators to draw from, any of "+-*" (default "+-")

With the defaults there are 31*31*2 = 1922 distinct problems; two-digit addition with
carries is where a tiny model stays at intermediate accuracy after SFT, which leaves RL
room to improve. Score: 1.0 if the turn, stripped, equals the answer exactly, else 0.0.

Chat form (an instruct model, llm/chat.py): the user turn asks "What is 12 + 7? Give the
number." and the answer is the number the reply gives (tasks/base.py's `chat_number`: the one
after "answer", else the last one), so "12 + 7 = 19." scores 1.0.
"""

from __future__ import annotations

import operator
import random

from reflectrl.errors import UserError
from reflectrl.llm.tasks.base import Problem, Task, chat_number

_OPS = {"+": operator.add, "-": operator.sub, "*": operator.mul}


class ArithTask(Task):
    name = "arith"
    max_turns = 1
    max_new_tokens = 8  # answers are at most 6 bytes (999*999 = 998001)

    def __init__(self, max_operand: int = 30, ops: str = "+-"):
        if not 1 <= max_operand <= 999:
            raise UserError(f"task arith: max_operand must be in 1..999, got {max_operand}")
        if not ops or any(op not in _OPS for op in ops):
            raise UserError(f"task arith: ops must be a non-empty string of '+', '-', '*', got {ops!r}")
        self.max_operand = max_operand
        self.ops = "".join(sorted(set(ops), key="+-*".index))  # canonical order: same spec, same stream

    def sample(self, rng: random.Random) -> Problem:
        a = rng.randint(0, self.max_operand)
        op = rng.choice(self.ops)
        b = rng.randint(0, self.max_operand)
        return Problem(prompt=f"{a}{op}{b}=", answer=str(_OPS[op](a, b)), meta={"a": a, "op": op, "b": b})

    def instruction(self, problem: Problem) -> str:
        m = problem.meta
        return f"What is {m['a']} {m['op']} {m['b']}? Give the number."

    def score(self, problem: Problem, turns: list[str]) -> float:
        if self.chat:
            return float(bool(turns) and chat_number(turns[-1]) == problem.answer)
        return float(bool(turns) and turns[-1].strip() == problem.answer)

    def demonstration(self, problem: Problem) -> list[str]:
        return [problem.answer]

    def wrong_turns(self, problem: Problem, rng: random.Random) -> list[str]:
        """A near miss, as a tiny model's errors are: the answer off by 1..10."""
        return [str(int(problem.answer) + rng.choice((-1, 1)) * rng.randint(1, 10))]
