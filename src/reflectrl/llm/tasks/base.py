"""The task protocol: procedurally generated, seeded problems with a verifier.

An episode is a conversation. The prompt comes first; then the agent writes a turn, the
task answers it (a tool's output, which the trainer masks out of the loss) or ends the
episode, and so on for at most `max_turns` agent turns:

    problem = task.sample(rng)                  # rng: random.Random, the only randomness
    text = problem.prompt
    turns = []
    while True:
        turn = <the model continues `text`, stopping at its end-of-turn token>
        turns.append(turn)
        reply = task.respond(problem, turns)    # str: tool output, appended; None: episode over
        if reply is None or len(turns) == task.max_turns:
            break
        text += turn + <eos> + reply
    reward = task.score(problem, turns)         # in [0, 1]; 1 means solved

`reference(problem, kind)` is the ground truth a teacher may read (the divergence signal):
`kind="solution"` a worked solution (by default the demonstration's turns, one per line),
`"answer"` only the answer. `reference_hint` lays it out as the teacher reads it, between
the prompt and the completion (and as `llm sft --reference-share` teaches it).

`demonstration(problem)` returns the agent turns of a correct episode, used by `llm sft`
to warm-start a model and by `llm init-tiny` to train the tokenizer. A turn is a string, or
a list of (text, learned) pieces where some of it is in the context but not learned (a
wrong answer shown so that its judgement can be learned: tasks/reflect.py). Single-turn
tasks have `max_turns = 1` and `respond` always returns None.

Reflection (tasks/reflect.py): `reflect` is the mode a task was built with (`none`,
`verdict`, `confidence`, `both`); `reflections(problem, turns)` gives, per turn, the list of
`Reflection`s the agent stated there (empty where the task asks for none); `wrong_turns`
gives the turns of a plausible wrong episode (None: the task has none to show).

Feedback: `feedback` says whether the environment answers the agent at all (tool output, test
results: code, tools, rag); `answer_feedback(problem, turns)` is what it shows about a final
answer without revealing the outcome (code: the visible tests' output), which a reflection
stated after it reads (`reflect_after=feedback`, tasks/reflect.py); the `_batch` forms let a
task with an expensive environment (the sandbox) serve a batch in parallel, and the rollout
calls `respond_batch`.

Chat form (llm/chat.py): where the model's tokenizer has a chat template, `use_chat(True)` puts
the task in its instruct form: the prompt is the user turn `instruction(problem)` (by default the
raw prompt), the environment's replies are user turns (a task may word them for an instruct
model where `chat` is set), and the verifier reads answers the way such models write them (a
number after prose, a fenced code block). The problems themselves (`sample`) are the same in
both forms, and a tokenizer without a template keeps the raw format, byte for byte.
"""

from __future__ import annotations

import random
import re
from dataclasses import dataclass, field
from typing import Any


@dataclass
class Problem:
    prompt: str
    answer: Any = None
    meta: dict = field(default_factory=dict)


class Task:
    name = "task"
    max_turns = 1
    max_new_tokens = 32     # per agent turn: a good default generation budget for this task
    chat = False            # the instruct form (use_chat): llm/chat.py sets it from the tokenizer
    chat_max_new_tokens = 64  # per agent turn in chat form, where an instruct model writes prose around its answer

    def use_chat(self, on: bool) -> None:
        """Switch the instruct form on or off (the generation budget becomes the chat one, or back)."""
        on = bool(on)
        if on == self.chat:
            return
        if on:
            self._raw_max_new_tokens = self.max_new_tokens
            self.max_new_tokens = max(self.max_new_tokens, self.chat_max_new_tokens)
        else:
            self.max_new_tokens = self._raw_max_new_tokens
        self.chat = on

    def instruction(self, problem: Problem) -> str:
        """The user turn that asks for `problem` in chat form (by default the raw prompt)."""
        return problem.prompt

    def sample(self, rng: random.Random) -> Problem:
        raise NotImplementedError

    feedback = False  # whether the environment answers the agent (reflect_after=feedback is possible)

    def respond(self, problem: Problem, turns: list[str]) -> str | None:
        return None

    def respond_batch(self, problems: list[Problem], episodes: list[list[str]]) -> list[str | None]:
        """`respond` for many episodes at once (what the rollout calls)."""
        return [self.respond(p, t) for p, t in zip(problems, episodes)]

    def answer_feedback(self, problem: Problem, turns: list[str]) -> str:
        """What the environment shows about the final answer in `turns` (never the outcome itself);
        only tasks that have it (code) override it."""
        raise NotImplementedError

    def answer_feedback_batch(self, problems: list[Problem], episodes: list[list[str]]) -> list[str]:
        return [self.answer_feedback(p, t) for p, t in zip(problems, episodes)]

    def score(self, problem: Problem, turns: list[str]) -> float:
        raise NotImplementedError

    def score_batch(self, problems: list[Problem], episodes: list[list[str]]) -> list[float]:
        """Rewards for many episodes; tasks with expensive verifiers (code) run them in parallel."""
        return [self.score(p, t) for p, t in zip(problems, episodes)]

    def demonstration(self, problem: Problem) -> list:
        raise NotImplementedError

    def reference(self, problem: Problem, kind: str = "solution") -> str:
        """The ground truth a teacher reads: a worked solution (the demonstration's turns, one per
        line) or only the answer."""
        if kind == "answer" and problem.answer is not None:
            return str(problem.answer)
        return "\n".join(turn_text(t) for t in self.demonstration(problem))

    reflect = "none"

    def reflections(self, problem: Problem, turns: list[str]) -> list:
        return [[] for _ in turns]

    def wrong_turns(self, problem: Problem, rng: random.Random) -> list[str] | None:
        return None


def turn_text(turn) -> str:
    """A demonstration turn's text (a string, or (text, learned) pieces)."""
    return turn if isinstance(turn, str) else "".join(text for text, _ in turn)


def turn_pieces(turn) -> list[tuple[str, bool]]:
    return [(turn, True)] if isinstance(turn, str) else list(turn)


REFERENCE_TEMPLATE = "Reference:\n{}\nSolve:\n"


def reference_hint(task: Task, problem: Problem, kind: str = "solution") -> str:
    """The text a ground-truth-conditioned teacher reads between the prompt and the completion."""
    return REFERENCE_TEMPLATE.format(task.reference(problem, kind))


# ---------------------------------------------------------------------------- answers in chat form

_NUMBER = r"-?\d+(?:\.\d+)?"
_NUMBERS = re.compile(rf"(?<![\w.]){_NUMBER}")
_ANSWER_MARK = re.compile(rf"answer(?:\s+is)?[\s:=*$]*({_NUMBER})", re.IGNORECASE)
_FENCE = re.compile(r"```[ \t]*([\w+-]*)[^\n]*\n(.*?)(?:```|\Z)", re.DOTALL)


def chat_number(text: str) -> str | None:
    """The number an instruct model's reply gives as its answer: the one after its last "answer"
    ("answer 19", "The answer is: 19"), else the last number in it; thousands separators and a
    trailing ".0" dropped ("1,234.0" -> "1234"); None where it has no number."""
    text = re.sub(r"(?<=\d),(?=\d{3}\b)", "", text)
    marked = _ANSWER_MARK.findall(text)
    numbers = marked or _NUMBERS.findall(text)
    if not numbers:
        return None
    value = numbers[-1]
    return value[:-2] if value.endswith(".0") else value


def code_block(text: str) -> str | None:
    """The code of a reply's fenced block: the first ```python one, else the first of any language
    (an unclosed fence, a reply cut off by the budget, runs to the end); None without a fence."""
    blocks = _FENCE.findall(text)
    if not blocks:
        return None
    python = [code for lang, code in blocks if lang.lower() in ("python", "py", "python3")]
    return (python or [code for _, code in blocks])[0]
