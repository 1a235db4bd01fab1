"""`tools`: a multi-turn task where the agent must call tools to answer.

A hidden key-value table (in `Problem.meta`, never in the prompt) holds small numbers;
the question asks for a key's value, or that value combined with a constant. The agent
writes one tool call per turn; the task replies with the tool's output, which the
trainer appends to the context and masks out of the loss:

    prompt   "What is k3*7?\\n"
    agent    "lookup k3"      -> reply "= 17\\n"
    agent    "calc 17*7"      -> reply "= 119\\n"
    agent    "answer 119"     -> episode over (respond returns None); score 1.0

    prompt   "What is k5?\\n"
    agent    "lookup k5"      -> reply "= 4\\n"
    agent    "answer 4"       -> episode over

Tool syntax (one call per turn, surrounding whitespace ignored):

    lookup KEY     the value of KEY in the table           "= 17\\n", or "error: no key k9\\n"
    calc A OP B    integers A and B, OP one of + - *       "= 119\\n"
    answer N       the final answer; ends the episode

Anything else gets "error: ..." naming the three calls, and the episode goes on until
`max_turns` (3) agent turns. Score: 1.0 if the last turn is `answer N` with N the right
integer, else 0.0. The value is unknowable without `lookup`, so the tool use is needed;
`calc` is what the demonstration uses, though a model may also do the arithmetic itself.
With `reflect=...` the answer turn ends in the reflection (`answer 119 | solved 0.8`), which
comes after the last tool output: `reflect_after=feedback` (the default here) and `answer` are
the same format on this task (tasks/reflect.py). Options:

    keys         entries in the table, named k0, k1, ... (default 5, at most 100)
    max_value    values are drawn from 0..max_value (default 50)
    max_operand  the constant is drawn from 1..max_operand; 0 asks for lookups only (default 9)
    ops          the operators for the constant, any of "+-*" (default "+-*")
    calls        0 (default): the questions above, 2 or 3 calls. 4..12: a long chain of
                 exactly `calls` tool calls, the answer included: the question combines
                 calls // 2 distinct keys (and, for an odd `calls`, a constant last),
                 evaluated left to right, each operator drawn from `ops`:

    calls=6  prompt "What is k3+k1-k4?\n"   (3 keys: 3 lookups + 2 calcs + answer)
             lookup k3 | lookup k1 | calc 17+5 | lookup k4 | calc 22-9 | answer 13
    calls=7  prompt "What is k3+k1-k4*6?\n" (left to right: ((k3+k1)-k4)*6; one more calc)

                 The demonstration looks each key up when it is needed and folds it in at
                 once. The episode may last `calls` + 2 agent turns (slack for a bad call).
                 `keys` must be >= calls // 2; the largest possible intermediate value must
                 fit `calc`'s 9 digits (use ops=+- or a smaller max_value otherwise).

Chat form (an instruct model, llm/chat.py): the user turn is the question and the three calls
explained; a tool's output is a user turn; the call a reply makes is the first one written in it
(prose and markdown around it ignored: "I will look it up: `lookup k3`" calls `lookup k3`).
"""

from __future__ import annotations

import operator
import random
import re

from reflectrl.errors import UserError
from reflectrl.llm.tasks.base import Problem, Task

_OPS = {"+": operator.add, "-": operator.sub, "*": operator.mul}
_LOOKUP = re.compile(r"lookup\s+(\S+)")
_CALC = re.compile(r"calc\s+(-?\d{1,9})\s*([-+*])\s*(-?\d{1,9})")  # 9 digits: no huge products
_ANSWER = re.compile(r"answer\s+(-?\d{1,18})")
_USAGE = "error: write one of: lookup KEY | calc A+B | answer N\n"
# chat form: the first call written anywhere in a reply
_CHAT_CALL = re.compile(r"\b(lookup\s+\w+|calc\s+-?\d{1,9}\s*[-+*]\s*-?\d{1,9}|answer\s+-?\d{1,18})\b",
                        re.IGNORECASE)


class ToolsTask(Task):
    name = "tools"
    max_turns = 3
    max_new_tokens = 12  # set per instance: the longest correct call in bytes, plus slack
    feedback = True      # the tools' output; the answer turn comes after the last of it (reflect_after)

    def __init__(self, keys: int = 5, max_value: int = 50, max_operand: int = 9, ops: str = "+-*",
                 calls: int = 0):
        if not 1 <= keys <= 100:
            raise UserError(f"task tools: keys must be in 1..100, got {keys}")
        if not 0 <= max_value <= 10**6:
            raise UserError(f"task tools: max_value must be in 0..1000000, got {max_value}")
        if not 0 <= max_operand <= 10**6:
            raise UserError(f"task tools: max_operand must be in 0..1000000 (0: lookups only), got {max_operand}")
        if not ops or any(op not in _OPS for op in ops):
            raise UserError(f"task tools: ops must be a non-empty string of '+', '-', '*', got {ops!r}")
        self.keys, self.max_value, self.max_operand = keys, max_value, max_operand
        self.ops = "".join(sorted(set(ops), key="+-*".index))
        # a byte-level tokenizer never needs more tokens than bytes
        longest = max(len(f"lookup k{keys - 1}"), len(f"calc {max_value}*{max_operand}"),
                      len(f"answer {max_value * max(1, max_operand)}"), len(f"answer -{max_operand}"))
        self.max_new_tokens = longest + 2
        self.calls = calls
        if calls:
            self._check_chain(calls)

    def _check_chain(self, calls: int) -> None:
        if not 4 <= calls <= 12:
            raise UserError(f"task tools: calls must be 0 (the short questions) or in 4..12, got {calls}")
        n_keys, constant = calls // 2, calls % 2 == 1
        if n_keys > self.keys:
            raise UserError(f"task tools: calls={calls} chains {n_keys} distinct keys but keys={self.keys}; "
                            f"use keys>={n_keys}")
        if constant and not self.max_operand:
            raise UserError(f"task tools: an odd calls={calls} ends with a constant, but max_operand=0; "
                            "use an even calls or max_operand>=1")
        bound = self.max_value  # the largest |value| any step can reach
        for i in range(1, n_keys + constant):
            other = self.max_operand if i == n_keys else self.max_value
            bound = max(bound * other, bound + other) if "*" in self.ops else bound + other
        if bound >= 10**9:
            raise UserError(f"task tools: calls={calls} with ops={self.ops!r} and max_value={self.max_value} can "
                            f"reach {bound}, more than calc's 9 digits; use ops=+- or a smaller max_value")
        self.max_turns = calls + 2
        longest = max(len(f"lookup k{self.keys - 1}"),
                      len(f"calc -{bound}*{max(self.max_value, self.max_operand)}"), len(f"answer -{bound}"))
        self.max_new_tokens = longest + 2

    def _sample_chain(self, rng: random.Random) -> Problem:
        table = {f"k{i}": rng.randint(0, self.max_value) for i in range(self.keys)}
        keys = rng.sample(list(table), self.calls // 2)
        constant = rng.randint(1, self.max_operand) if self.calls % 2 else None
        ops = [rng.choice(self.ops) for _ in range(len(keys) - 1 + (constant is not None))]
        terms = keys + ([str(constant)] if constant is not None else [])
        value = table[keys[0]]
        for op, term in zip(ops, terms[1:]):
            value = _OPS[op](value, table[term] if term in table else constant)
        question = terms[0] + "".join(op + term for op, term in zip(ops, terms[1:]))
        return Problem(prompt=f"What is {question}?\n", answer=value,
                       meta={"table": table, "chain": keys, "ops": ops, "constant": constant})

    def sample(self, rng: random.Random) -> Problem:
        if self.calls:
            return self._sample_chain(rng)
        table = {f"k{i}": rng.randint(0, self.max_value) for i in range(self.keys)}
        key = rng.choice(list(table))
        if self.max_operand and rng.random() < 2 / 3:  # most problems need both tools
            op, c = rng.choice(self.ops), rng.randint(1, self.max_operand)
            question, answer = f"{key}{op}{c}", _OPS[op](table[key], c)
        else:
            op = c = None
            question, answer = key, table[key]
        return Problem(prompt=f"What is {question}?\n", answer=answer,
                       meta={"table": table, "key": key, "op": op, "constant": c})

    def instruction(self, problem: Problem) -> str:
        return (f"{problem.prompt.strip()} The values of the keys (k0, k1, ...) are hidden: look them up. "
                "Write one tool call per message: `lookup KEY` gives a key's value, `calc A+B` computes "
                "(+, - or *), and `answer N` gives your final answer.")

    def _call(self, turn: str) -> str:
        """The call a turn makes: the whole turn stripped (in chat form, the first call written in it)."""
        if self.chat:
            m = _CHAT_CALL.search(turn)
            if m is not None:
                word, _, rest = m.group(1).partition(" ")
                return f"{word.lower()} {rest.strip()}"
        return turn.strip()

    def respond(self, problem: Problem, turns: list[str]) -> str | None:
        turn = self._call(turns[-1])
        if _ANSWER.fullmatch(turn):
            return None
        m = _LOOKUP.fullmatch(turn)
        if m:
            value = problem.meta["table"].get(m.group(1))
            return f"error: no key {m.group(1)}\n" if value is None else f"= {value}\n"
        m = _CALC.fullmatch(turn)
        if m:
            return f"= {_OPS[m.group(2)](int(m.group(1)), int(m.group(3)))}\n"
        return _USAGE

    def score(self, problem: Problem, turns: list[str]) -> float:
        m = _ANSWER.fullmatch(self._call(turns[-1])) if turns else None
        return float(m is not None and int(m.group(1)) == problem.answer)

    def demonstration(self, problem: Problem) -> list[str]:
        meta = problem.meta
        if "chain" in meta:  # calls=N: look each key up when it is needed, fold it in at once
            table, keys = meta["table"], meta["chain"]
            turns, value = [f"lookup {keys[0]}"], table[keys[0]]
            operands = [table[k] for k in keys[1:]] + ([meta["constant"]] if meta["constant"] is not None else [])
            for i, (op, operand) in enumerate(zip(meta["ops"], operands)):
                if i + 1 < len(keys):
                    turns.append(f"lookup {keys[i + 1]}")
                turns.append(f"calc {value}{op}{operand}")
                value = _OPS[op](value, operand)
            return turns + [f"answer {value}"]
        turns = [f"lookup {meta['key']}"]
        if meta["op"] is not None:
            turns.append(f"calc {meta['table'][meta['key']]}{meta['op']}{meta['constant']}")
        return turns + [f"answer {problem.answer}"]

    def wrong_turns(self, problem: Problem, rng: random.Random) -> list[str]:
        """The demonstration's calls, then an answer off by 1..10."""
        turns = self.demonstration(problem)
        return turns[:-1] + [f"answer {problem.answer + rng.choice((-1, 1)) * rng.randint(1, 10)}"]
