"""`rg:NAME`: any reasoning-gym dataset, scored by the dataset's own verifier.

    make_task("rg:basic_arithmetic[min_terms=2;max_terms=2;max_digits=2;operators=+,-;"
              "allow_parentheses=false;allow_negation=false]")

    prompt "Calculate 13 - 92.\\n"   demonstration ["-79"]

The prompt is the entry's question plus a newline; the reward is
`dataset.score_answer(final turn stripped, entry)` (some datasets give partial credit);
the demonstration is the entry's reference answer. Options in brackets are fields of the
dataset's config dataclass (see reasoning_gym/<category>/<name>.py), plus `seed` (default 0)
and `size` (default 10000).

Sampling: the dataset is built once, with a fixed seed, and `sample(rng)` picks one of
its `size` indices with rng. reasoning-gym generates entry i lazily from (seed + i), so
this costs ~0.1 ms per sample for most datasets, whereas building a dataset per sample
costs up to 0.3 s for those that load word lists at construction (codeio, figlet_font,
group_anagrams, word_ladder). A few datasets do work proportional to `size` at
construction (acre: ~2 s for 10000) or cap it (word_ladder: 20000), hence the moderate
default; raise it with `size=` for a larger problem pool.

For a tiny model, use `basic_arithmetic` with a small config (the spec above): prompts
are 16-19 characters ("Calculate 5 - 33."), answers 1-3. Its default config has up to
6 terms of up to 4 digits (prompts ~35 characters, up to ~75). `chain_sum` spends 60
characters on a fixed preamble ("State the final answer to the following arithmetic
problem: "), so its prompts are ~80 characters even with two terms.

`worked=true` (chain_sum and basic_arithmetic only; elsewhere a UserError): the
demonstration writes the computation out, one binary operation at a time in the order
it is evaluated, then the answer after the marker `answer`:

    make_task("rg:chain_sum[min_terms=5;max_terms=8;max_digits=2;worked=true]")
    prompt "State the final answer to the following arithmetic problem: 4 + 1 + 7 - 7 + 7 - 6 =\n"
    demonstration ["4+1=5 5+7=12 12-7=5 5+7=12 12-6=6 answer 6"]

The score is then `score_answer` of the text after the turn's last `answer` (0 without
one). basic_arithmetic's steps follow its own semantics: with parentheses allowed (its
default) Python's precedence, `/` as floor division and `-(...)` written as a step
"-(23)=-23"; with allow_parentheses=false, strictly left to right, as its generator
computes. An entry whose steps do not reproduce the dataset's answer (its generator's
division fallback in the left-to-right mode writes a divisor that is not the one it
used) is skipped: `sample` draws another index.

Chat form (an instruct model, llm/chat.py): the user turn is the question (with worked=true,
followed by a request to work it out and end with `answer N`), and the verifier reads the
reply's answer: where the reference answer is an integer, the number it gives (tasks/base.py's
`chat_number`: the one after its last "answer", else its last number); otherwise the text after
its last "answer:" / "answer is" (else the whole reply), stripped of markdown and a final period.
"""

from __future__ import annotations

import dataclasses
import difflib
import math
import operator
import random
import re

from reflectrl.errors import UserError
from reflectrl.llm.tasks.base import Problem, Task, chat_number

_DEFAULTS = {"seed": 0, "size": 10_000}
_OURS = {"worked": False}  # our options, not the dataset's config
WORKED_DATASETS = ("chain_sum", "basic_arithmetic")
MARKER = "answer"
_CHAT_MARKER = re.compile(r"answer\s*(?:is\s*)?[:=]?", re.IGNORECASE)
_OPS = {"+": operator.add, "-": operator.sub, "*": operator.mul, "/": operator.floordiv}
_TOKEN = re.compile(r"\s*(\d+|[-+*/()])")


def _tokens(expression: str) -> list[str]:
    out, pos = [], 0
    expression = expression.strip()
    while pos < len(expression):
        m = _TOKEN.match(expression, pos)
        if m is None:
            raise ValueError(f"unexpected {expression[pos:]!r}")
        out.append(m.group(1))
        pos = m.end()
    return out


def worked_steps(expression: str, left_to_right: bool = False) -> tuple[list[str], int]:
    """The steps ("3+5=8") that evaluate an arithmetic expression, and its value: Python's
    precedence with `/` as floor division, or strictly left to right."""
    toks, steps = _tokens(expression), []
    pos = 0

    def peek():
        return toks[pos] if pos < len(toks) else None

    def take():
        nonlocal pos
        pos += 1
        return toks[pos - 1]

    def apply(a, op, b):
        value = _OPS[op](a, b)
        steps.append(f"{a}{op}{b}={value}")
        return value

    def atom():
        if peek() == "-":  # unary minus: of a number (part of it) or of a group (a step)
            take()
            if peek() == "(":
                value = atom()
                steps.append(f"-({value})={-value}")
                return -value
            return -int(take())
        if peek() == "(":
            take()
            value = expr()
            if take() != ")":
                raise ValueError("unbalanced parentheses")
            return value
        tok = take()
        if not tok.isdigit():
            raise ValueError(f"expected a number, got {tok!r}")
        return int(tok)

    def term():
        value = atom()
        while peek() in ("*", "/") or (left_to_right and peek() in ("+", "-")):
            op = take()
            value = apply(value, op, atom())
        return value

    def expr():
        value = term()
        while peek() in ("+", "-"):
            op = take()
            value = apply(value, op, term())
        return value

    value = expr()
    if pos != len(toks):
        raise ValueError(f"trailing {toks[pos:]}")
    return steps, value


def _registry() -> dict:
    try:
        from reasoning_gym.factory import DATASETS
    except ImportError:
        raise UserError("the rg:NAME tasks need reasoning-gym; install it with "
                        "`pip install reasoning-gym`") from None
    return DATASETS


def dataset_names() -> list[str]:
    return sorted(_registry())


def dataset_options(name: str) -> dict:
    """The config fields of dataset `name` with their defaults (seed and size: ours)."""
    registry = _registry()
    if name not in registry:
        close = difflib.get_close_matches(name, list(registry), n=3)
        hint = f"did you mean {', '.join('rg:' + c for c in close)}? " if close else ""
        raise UserError(f"unknown reasoning-gym dataset {name!r}; {hint}"
                        f"{len(registry)} datasets exist, e.g. rg:basic_arithmetic, rg:chain_sum "
                        "(list them with python -c 'import reasoning_gym.factory as f; print(sorted(f.DATASETS))')")
    config_cls = registry[name][1]
    options = {}
    for f in dataclasses.fields(config_cls):
        if f.default is not dataclasses.MISSING:
            options[f.name] = f.default
        elif f.default_factory is not dataclasses.MISSING:
            options[f.name] = f.default_factory()
        else:
            options[f.name] = None
    options.update(_DEFAULTS)
    options.update(_OURS)
    return options


class ReasoningGymTask(Task):
    max_turns = 1

    def __init__(self, dataset: str, /, **config):
        import reasoning_gym

        dataset_options(dataset)  # unknown names: UserError with suggestions
        self.worked = bool(config.pop("worked", False))
        config = {**_DEFAULTS, **config}
        self.name = f"rg:{dataset}"
        if self.worked and dataset not in WORKED_DATASETS:
            supported = ", ".join("rg:" + d for d in WORKED_DATASETS)
            raise UserError(f"task {self.name}: worked=true is only for {supported}; "
                            "leave worked out for other datasets")
        self.size = config["size"]
        if self.size < 1:
            raise UserError(f"task {self.name}: size must be >= 1, got {self.size}")
        try:
            self.dataset = reasoning_gym.create_dataset(dataset, **config)
        except (AssertionError, ValueError, TypeError, KeyError) as err:
            raise UserError(f"task {self.name}: invalid config {config} ({type(err).__name__}: {err}); "
                            "check the option values against the dataset's config class") from None
        # Generation budget: the longest reference answer among a few entries, in bytes
        # (a byte-level tokenizer never needs more tokens than bytes), plus slack.
        if self.worked:
            self._left_to_right = dataset == "basic_arithmetic" and not self.dataset.config.allow_parentheses
            # the worked turn is longer: the longest among a few entries (bounded by the
            # number of terms), with room for one more step
            entries = [self.dataset[i] for i in range(min(self.size, 64))]
            texts = [t for t in (self._worked(e) for e in entries) if t is not None]
            if not texts:
                raise UserError(f"task {self.name}: no entry among the first {len(entries)} can be worked "
                                "step by step; use another config or leave worked out")
            longest = max(len(t.encode()) for t in texts)
            self.max_new_tokens = longest + max(len(t.encode()) // max(1, t.count(" ")) for t in texts) + 8
            return
        longest = max(len(str(self.dataset[i]["answer"]).encode()) for i in range(min(self.size, 16)))
        self.max_new_tokens = max(16, longest + 8)

    def _worked(self, entry: dict) -> str | None:
        """The worked turn of an entry, or None where its steps do not reproduce its answer."""
        try:
            steps, value = worked_steps(entry["metadata"]["expression"], self._left_to_right)
            if value != int(str(entry["answer"]).strip()):
                return None
        except (ValueError, KeyError, ZeroDivisionError, IndexError):
            return None
        return " ".join(steps + [f"{MARKER} {entry['answer']}"])

    def sample(self, rng: random.Random) -> Problem:
        if self.worked:  # redraw entries whose steps cannot be written (see the module's doc)
            for _ in range(1000):
                entry = self.dataset[rng.randrange(self.size)]
                worked = self._worked(entry)
                if worked is not None:
                    return Problem(prompt=entry["question"].rstrip() + "\n", answer=entry["answer"],
                                   meta={"entry": entry, "worked": worked})
            raise UserError(f"task {self.name}: 1000 draws found no entry that can be worked step by step")
        entry = self.dataset[rng.randrange(self.size)]
        return Problem(prompt=entry["question"].rstrip() + "\n", answer=entry["answer"], meta={"entry": entry})

    def instruction(self, problem: Problem) -> str:
        question = problem.meta["entry"]["question"].strip()
        return f"{question}\nWork it out one step at a time, then write `answer N`." if self.worked else question

    def final_answer(self, turn: str, problem: Problem | None = None) -> str | None:
        """What the verifier reads: the whole turn, or with worked=true the text after its last marker
        (in chat form, the reply's answer: see the module's doc)."""
        if self.chat and problem is not None:
            return self._chat_answer(turn, problem)
        if not self.worked:
            return turn.strip()
        head, sep, tail = turn.rpartition(MARKER)
        return tail.strip() if sep else None

    def _chat_answer(self, turn: str, problem: Problem) -> str | None:
        marks = list(_CHAT_MARKER.finditer(turn))
        if self.worked and not marks:
            return None
        tail = turn[marks[-1].end():] if marks else turn
        try:
            int(str(problem.answer).strip())
        except ValueError:  # a text answer: what follows the marker, without markdown or a final period
            return tail.strip().strip("*`").strip().rstrip(".").strip() or None
        return chat_number(tail)

    def score(self, problem: Problem, turns: list[str]) -> float:
        answer = self.final_answer(turns[-1], problem) if turns else None
        if answer is None:
            return 0.0
        try:  # a verifier fed arbitrary model output may raise; that answer is simply wrong
            reward = float(self.dataset.score_answer(answer, problem.meta["entry"]))
        except Exception:  # noqa: BLE001
            return 0.0
        return 0.0 if math.isnan(reward) else min(1.0, max(0.0, reward))

    def demonstration(self, problem: Problem) -> list[str]:
        if problem.answer is None:
            raise UserError(f"task {self.name} has no reference answer for this entry, so it cannot be "
                            "demonstrated (SFT); use an RL-only run or another dataset")
        if self.worked:
            return [problem.meta["worked"]]
        return [str(problem.answer)]

    def wrong_turns(self, problem: Problem, rng: random.Random) -> list[str] | None:
        """An integer answer off by 1..10 (scored wrong by the dataset's verifier); None for other answers."""
        try:
            value = int(str(problem.answer).strip())
        except ValueError:
            return None
        wrong_value = str(value + rng.choice((-1, 1)) * rng.randint(1, 10))
        if self.worked:  # the right steps, then a wrong final answer (a slip at the end)
            head = problem.meta["worked"].rpartition(MARKER)[0]
            wrong = [f"{head}{MARKER} {wrong_value}"]
        else:
            wrong = [wrong_value]
        return wrong if self.score(problem, wrong) < 1.0 else None
