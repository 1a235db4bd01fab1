"""Reflection in the output format: the agent states, after its answer, whether it solved the
task and/or how confident it is (the RefGRPO paper's verbal verdict, RLCR's confidence).

Every task takes the option `reflect=verdict|confidence|both` (`none`, the default, asks for
nothing), e.g. `arith[reflect=both]`. The final agent turn is then the task's own answer
followed by ` | ` and the reflection:

    reflect=verdict      "19 | solved"            "18 | not solved"
    reflect=confidence   "19 | 0.8"               "18 | 0.2"
    reflect=both         "19 | solved 0.8"        "18 | not solved 0.2"

The confidence is a number in [0, 1] (`1`, `0.85`, `.3`); the parser reads a verdict and a
confidence wherever they are stated, whatever the mode, and calls a reflection well formed
when it states what the mode asks for. A suffix that does not read as a reflection is part
of the answer (so `return a | b` stays code), and the reflection is then missing: it counts
as wrong (a verdict) or uninformative (a confidence) in every metric (llm/calibration.py)
and earns the signals' worst reward.

Reflection after feedback (`reflect_after=feedback|answer`; `auto`, the default, is `feedback`
on a task whose environment answers the agent, `Task.feedback`: code, tools, rag, and `answer`
otherwise; `feedback` on a task without, e.g. arith, is refused). The RefGRPO paper's agent acts,
sees the environment's feedback, then judges:

    code   the agent writes the body; the task replies with the output of the VISIBLE tests
           (`Task.answer_feedback`: "pass f(3) == 6" / "fail f(5) = 9, expected 8" / an error);
           the agent's next turn is the reflection alone ("solved 0.8"). The outcome it is
           judged against is the HIDDEN tests' (the task's score, which the feedback never shows).
    tools  the final turn follows the last tool output already: the format is the one above.
    rag    as tools; besides, each "relevant" / "not relevant" judgement has its own truth
           (whether the search it judges found a needed document: `Reflection.target`), which
           the verdict signal rewards it against instead of the final outcome.

`reflect_after=answer` is the format above on every task (on rag: every judgement against the
final outcome). Every Reflection records `after_feedback`: whether the agent had seen an
environment reply in the episode when it stated it (its turn is not the first one); the
metrics split on it (llm/calibration.py, `..._before_feedback` / `..._after_feedback`).

Chat form (an instruct model, llm/chat.py: `Task.use_chat`): the request to reflect is in the
user turn (in the instruction, for a reflection in the answer's turn; after the test results,
for a reflection turn of its own), and the parser tolerates prose around the reflection: the
raw format first, else the last "solved" / "not solved" / "unsolved" in the turn (case
ignored) and a confidence after it or after the word "confidence" (a number in [0, 1], or a
percentage); in the answer's turn the answer is the text before the reflection:

    "The answer is 19.\nSolved, confidence 0.9"   -> ("The answer is 19.", solved, 0.9)
    "I think it is not solved. Confidence: 30%"   -> not solved, 0.3

`Reflective(task, mode)` wraps any task: the inner task sees its turns with the reflection
cut off (so its tools and verifier are unchanged), and its demonstrations, for SFT, end with
a reflection. A share `reflect_negatives` (default 0.5) of demonstrations ends instead in a
wrong answer (the inner task's `wrong_turns`, where it has one) followed by "not solved" and
a low confidence, with the wrong answer's tokens masked out of the SFT loss: the model learns
the format and to judge an answer, not to give wrong ones (DECISION: without negatives, SFT
teaches "solved 1.0" on every answer and there is nothing to calibrate; with the answer
masked, it does not teach errors). Demonstrated confidences are drawn uniformly from
0.6..0.9 on correct answers and 0.1..0.4 on wrong ones, in steps of 0.1, so sampling
explores the scale from the start; SFT teaches no certainty (0 or 1), and every stated
number is then " 0", ".", a digit that must depend on the verdict (with 0.0 and 1.0 among
them, the digit "0" was the most frequent one and a tiny model decoded "solved 0.0" greedily).
"""

from __future__ import annotations

import random
import re
from dataclasses import dataclass, field, replace

from reflectrl.errors import UserError
from reflectrl.llm.tasks.base import Problem, Task

REFLECT_MODES = ("none", "verdict", "confidence", "both")
REFLECT_AFTER = ("auto", "feedback", "answer")  # auto: feedback where the task has feedback, else answer
SEPARATOR = " | "
_NUMBER = r"(?:1(?:\.0*)?|0?\.\d+|0)"
_REFLECTION = re.compile(rf"^\s*(?:(solved|not solved)\s*)?(?:({_NUMBER})\s*)?$")
_VERDICT_PREFIX = re.compile(r"^\s*(relevant|not relevant)\s*;\s*", re.DOTALL)
POSITIVE_CONFIDENCES = (0.6, 0.7, 0.8, 0.9)
NEGATIVE_CONFIDENCES = (0.1, 0.2, 0.3, 0.4)
# chat form: the reflection in prose (see the module's doc)
_CHAT_VERDICT = re.compile(r"\b(not\s+solved|unsolved|solved)\b", re.IGNORECASE)
_CHAT_CONFIDENCE_WORD = re.compile(r"\bconfiden(?:ce|t)\b", re.IGNORECASE)
_CHAT_CONFIDENCE = re.compile(r"(?<![\w.])(?:(\d{1,3}(?:\.\d+)?)\s*%|(1(?:\.0*)?|0?\.\d+|0)(?![\w%]|\.\d))")
_CHAT_REFLECTION_TOKENS = 24  # the chat form's generation budget for a reflection in prose
# what the user turn asks for, by mode
_ASKED = {"verdict": "`solved` if it is correct, else `not solved`",
          "confidence": "your confidence that it is correct, a number from 0 to 1",
          "both": "`solved` or `not solved`, then your confidence from 0 to 1 that it is correct (e.g. `solved 0.8`)"}


@dataclass(frozen=True)
class Reflection:
    """What an agent stated about one turn's work: a verdict (True: "solved" / "relevant"),
    a confidence in [0, 1], either None where it stated none or none that parses;
    `well_formed`: it stated what the task's mode asks for."""

    verdict: bool | None = None
    confidence: float | None = None
    well_formed: bool = False
    final: bool = True  # on the answer (False: on an intermediate step, e.g. a search's result)
    # what the judgement is measured against where it has its own truth (a search's relevance);
    # None: the episode's outcome
    target: bool | None = field(default=None, compare=False)
    # whether the agent had seen an environment reply (tool output, test results) when it stated it
    after_feedback: bool = field(default=False, compare=False)

    @property
    def stated_verdict(self) -> bool | None:
        """The verdict, or the confidence read as one (>= 0.5: solved) where only that is stated."""
        if self.verdict is not None:
            return self.verdict
        return None if self.confidence is None else self.confidence >= 0.5

    @property
    def stated_confidence(self) -> float | None:
        """The confidence, or a verdict read as one (1 or 0) where only that is stated."""
        if self.confidence is not None:
            return self.confidence
        return None if self.verdict is None else float(self.verdict)


def check_mode(mode: str, where: str) -> str:
    if mode not in REFLECT_MODES:
        raise UserError(f"{where}: reflect={mode!r}; use one of {', '.join(REFLECT_MODES)}")
    return mode


def resolve_after(after: str, task: Task) -> str:
    """`reflect_after` as a task runs it: feedback or answer (auto: feedback where the task has it)."""
    name = task.name
    if after not in REFLECT_AFTER:
        raise UserError(f"task {name}: reflect_after={after!r}; use one of {', '.join(REFLECT_AFTER)}")
    if after == "feedback" and not task.feedback:
        raise UserError(f"task {name}: reflect_after=feedback needs a task whose environment answers the agent "
                        f"(code, tools, rag); {name} gives no feedback: use reflect_after=answer (its default)")
    if after == "auto":
        return "feedback" if task.feedback else "answer"
    return after


def wants(mode: str) -> tuple[bool, bool]:
    """(a verdict, a confidence): what a mode asks for."""
    return mode in ("verdict", "both"), mode in ("confidence", "both")


def _stated(verdict: bool | None, confidence: float | None, mode: str) -> Reflection:
    want_verdict, want_confidence = wants(mode)
    ok = (verdict is not None or not want_verdict) and (confidence is not None or not want_confidence)
    return Reflection(verdict, confidence, ok)


def split_reflection(text: str, mode: str, chat: bool = False) -> tuple[str, Reflection]:
    """`ANSWER | REFLECTION` -> (ANSWER, Reflection); a turn with no parseable reflection is all
    answer. `chat`: also prose around the reflection (`chat_reflection`) where the format is not met."""
    head, sep, tail = text.rpartition(SEPARATOR.strip())
    m = _REFLECTION.match(tail) if sep else None
    if m is None or not (m.group(1) or m.group(2)):
        return chat_reflection(text, mode) if chat else (text, Reflection())
    verdict = None if m.group(1) is None else m.group(1) == "solved"
    confidence = None if m.group(2) is None else float(m.group(2))
    return head.rstrip(), _stated(verdict, confidence, mode)


def parse_reflection(text: str, mode: str, chat: bool = False) -> Reflection:
    """A turn that is only a reflection ("solved 0.8": the turn after feedback); missing where it does not parse."""
    if chat:
        return chat_reflection(text, mode, whole=True)[1]
    return split_reflection(SEPARATOR + text, mode)[1]


def _confidence(text: str) -> float | None:
    m = _CHAT_CONFIDENCE.search(text)
    if m is None:
        return None
    value = float(m.group(1)) / 100 if m.group(1) is not None else float(m.group(2))
    return value if 0.0 <= value <= 1.0 else None


def chat_reflection(text: str, mode: str, whole: bool = False) -> tuple[str, Reflection]:
    """(the answer before the reflection, the Reflection) of an instruct model's turn: the last
    verdict stated and a confidence after it or after the word "confidence" (on the verdict's line
    or after it); `whole`: the turn is all reflection (the turn after feedback)."""
    verdicts = list(_CHAT_VERDICT.finditer(text))
    words = list(_CHAT_CONFIDENCE_WORD.finditer(text))
    if not verdicts and not words:
        return text, Reflection()
    start = verdicts[-1].start() if verdicts else words[-1].start()
    line = text.rfind("\n", 0, start) + 1
    # "Confidence: 0.9, solved": a confidence stated before the verdict on its line
    before = [w.start() for w in words if line <= w.start() < start]
    start = min([start] + before)
    verdict = None
    if verdicts:
        verdict = not re.match(r"not|un", verdicts[-1].group(1), re.IGNORECASE)
    after_word = [w.end() for w in words if w.start() >= start]
    confidence = _confidence(text[after_word[0]:]) if after_word else None
    if confidence is None:
        confidence = _confidence(text[start:])
    if whole and confidence is None:  # a confidence stated before the verdict, on another line
        confidence = _confidence(text)
    return (text if whole else text[:start].rstrip()), _stated(verdict, confidence, mode)


def at_turn(reflection: Reflection, k: int) -> Reflection:
    """The reflection as stated in turn k: after feedback where an environment reply came before it."""
    return replace(reflection, after_feedback=k > 0)


def format_reflection(verdict: bool, confidence: float, mode: str) -> str:
    """The reflection suffix a mode asks for (with its separator), e.g. ' | not solved 0.2'."""
    want_verdict, want_confidence = wants(mode)
    parts = ([("solved" if verdict else "not solved")] if want_verdict else []) + \
            ([f"{confidence:.1f}"] if want_confidence else [])
    return SEPARATOR + " ".join(parts)


def split_relevance(text: str) -> tuple[str, Reflection]:
    """`relevant; ACTION` / `not relevant; ACTION` -> (ACTION, Reflection on the last step's
    result); a turn without the prefix is all action, its reflection missing."""
    m = _VERDICT_PREFIX.match(text)
    if m is None:
        return text, Reflection(final=False)
    return text[m.end():], Reflection(verdict=m.group(1) == "relevant", well_formed=True, final=False)


def format_relevance(relevant: bool) -> str:
    return "relevant; " if relevant else "not relevant; "


class Reflective(Task):
    """Any task with a reflection: at the end of its final agent turn, or (reflect_after=feedback on
    a task with `answer_feedback`, i.e. code) in a turn of its own after the feedback on the
    answer (see the module's doc)."""

    def __init__(self, inner: Task, mode: str, negatives: float = 0.5, seed: int = 0, after: str = REFLECT_AFTER[0]):
        if mode == "none":
            raise ValueError("Reflective needs a mode other than none")
        if not 0.0 <= negatives <= 1.0:
            raise UserError(f"task {inner.name}: reflect_negatives={negatives} must be in [0, 1]")
        self.inner, self.reflect, self.negatives = inner, mode, negatives
        self.reflect_after = resolve_after(after, inner)
        self.name = inner.name
        self.feedback = inner.feedback
        # a turn of its own after the answer's feedback (code); elsewhere the answer's turn ends in it
        self.own_turn = self.reflect_after == "feedback" and type(inner).answer_feedback is not Task.answer_feedback
        self.max_turns = inner.max_turns + self.own_turn
        self.max_new_tokens = inner.max_new_tokens + len(format_reflection(False, 0.0, "both")) + 2
        self._demo_rng = random.Random(seed)  # the demonstrations' choices; the problems' stream is the inner task's

    def use_chat(self, on: bool) -> None:
        self.inner.use_chat(on)
        self.chat = bool(on)
        extra = _CHAT_REFLECTION_TOKENS if self.chat else len(format_reflection(False, 0.0, "both")) + 2
        self.max_new_tokens = self.inner.max_new_tokens + extra

    def instruction(self, problem: Problem) -> str:
        """The inner task's instruction; with the reflection in the answer's turn, the request for it after."""
        text = self.inner.instruction(problem)
        return text if self.own_turn else f"{text} After your answer, end with a line stating {_ASKED[self.reflect]}."

    def _ask(self, feedback: str) -> str:
        """The feedback on the answer, in chat form followed by the request to reflect."""
        return f"{feedback.rstrip()}\nJudge your answer from these results: reply with {_ASKED[self.reflect]}." \
            if self.chat else feedback

    def _inner_over(self, problem: Problem, turns: list[str]) -> int | None:
        """The index of the inner episode's last turn among `turns`, None while it goes on."""
        for k in range(min(len(turns), self.inner.max_turns)):
            if self.inner.respond(problem, turns[:k + 1]) is None or k + 1 == self.inner.max_turns:
                return k
        return None

    def sample(self, rng: random.Random) -> Problem:
        problem = self.inner.sample(rng)
        r = self._demo_rng
        negative = r.random() < self.negatives
        problem.meta["reflect_demo"] = {"negative": negative, "seed": r.getrandbits(32),
                                        "confidence": r.choice(NEGATIVE_CONFIDENCES if negative
                                                               else POSITIVE_CONFIDENCES)}
        return problem

    def respond(self, problem: Problem, turns: list[str]) -> str | None:
        return self.respond_batch([problem], [turns])[0]

    def respond_batch(self, problems: list[Problem], episodes: list[list[str]]) -> list[str | None]:
        if not self.own_turn:
            return self.inner.respond_batch(problems, [self._inner_turns(p, t) for p, t in zip(problems, episodes)])
        out: list[str | None] = [None] * len(problems)
        ask, answered = [], []  # episodes still in the inner task; those whose answer was just given
        for i, (problem, turns) in enumerate(zip(problems, episodes)):
            end = self._inner_over(problem, turns)
            if end is None:
                ask.append(i)
            elif end == len(turns) - 1:
                answered.append(i)
        for i, reply in zip(ask, self.inner.respond_batch([problems[i] for i in ask], [episodes[i] for i in ask])):
            out[i] = reply
        feedback = self.inner.answer_feedback_batch([problems[i] for i in answered], [episodes[i] for i in answered])
        for i, reply in zip(answered, feedback):
            out[i] = self._ask(reply)
        return out

    def _strip(self, turns: list[str]) -> list[str]:
        """The inner task's turns of an episode (a reflection turn dropped, or the suffix cut off)."""
        return self._inner_turns(None, turns)  # code's respond does not read the problem

    def _inner_turns(self, problem: Problem, turns: list[str]) -> list[str]:
        if not self.own_turn:
            return [split_reflection(t, self.reflect, self.chat)[0] for t in turns]
        end = self._inner_over(problem, turns)
        return turns if end is None else turns[:end + 1]

    def score(self, problem: Problem, turns: list[str]) -> float:
        return self.inner.score(problem, self._inner_turns(problem, turns))

    def score_batch(self, problems: list[Problem], episodes: list[list[str]]) -> list[float]:
        return self.inner.score_batch(problems, [self._inner_turns(p, t) for p, t in zip(problems, episodes)])

    def reflections(self, problem: Problem, turns: list[str]) -> list[list[Reflection]]:
        """Per turn, the reflections stated there: the final turn's (with a reflection turn, the
        turn after the answer's feedback; missing where the episode ended before it); none on the others."""
        if not turns:
            return []
        out: list[list[Reflection]] = [[] for _ in turns]
        if not self.own_turn:
            out[-1] = [at_turn(split_reflection(turns[-1], self.reflect, self.chat)[1], len(turns) - 1)]
            return out
        end = self._inner_over(problem, turns)
        if end is not None and end + 1 < len(turns):
            out[end + 1] = [at_turn(parse_reflection(turns[end + 1], self.reflect, self.chat), end + 1)]
        else:  # the turns ran out before the reflection: missing, on the last turn
            out[-1] = [at_turn(Reflection(), len(turns) - 1)]
        return out

    def demonstration(self, problem: Problem) -> list:
        demo = problem.meta.get("reflect_demo") or {"negative": False, "seed": 0, "confidence": 1.0}
        wrong = None
        if demo["negative"]:
            wrong = self.inner.wrong_turns(problem, random.Random(demo["seed"]))
        if wrong is None:
            turns = list(self.inner.demonstration(problem))
            confidence = (demo["confidence"] if not demo["negative"]  # a task with no wrong answers to show
                          else random.Random(demo["seed"]).choice(POSITIVE_CONFIDENCES))
            if self.own_turn:
                return turns + [format_reflection(True, confidence, self.reflect)[len(SEPARATOR):]]
            return turns[:-1] + [turns[-1] + format_reflection(True, confidence, self.reflect)]
        # the wrong answer is in the context but not learned; its judgement is
        *before, last = wrong
        if self.own_turn:  # after the wrong answer's feedback, a turn of its own
            judgement = format_reflection(False, demo["confidence"], self.reflect)[len(SEPARATOR):]
            return before + [[(last, False)], judgement]
        return before + [[(last, False), (format_reflection(False, demo["confidence"], self.reflect), True)]]

    def wrong_turns(self, problem: Problem, rng: random.Random):
        return self.inner.wrong_turns(problem, rng)

    def reference(self, problem: Problem, kind: str = "solution") -> str:
        return self.inner.reference(problem, kind)  # the task's ground truth, without a reflection


def wrap(task: Task, mode: str, negatives: float, after: str) -> Task:
    resolve_after(after, task)  # a refused reflect_after fails whatever the mode
    return task if mode == "none" else Reflective(task, mode, negatives, after=after)


def union(modes) -> str:
    """The one mode that states everything `modes` ask for."""
    verdict = any(wants(m)[0] for m in modes)
    confidence = any(wants(m)[1] for m in modes)
    return {(False, False): "none", (True, False): "verdict", (False, True): "confidence",
            (True, True): "both"}[(verdict, confidence)]


def require_reflect(spec: str, needs: dict[str, str]) -> str:
    """The task spec with the reflection `needs` ({who: mode}) switched on: `reflect` added where
    the spec has none; one line saying what is missing where it has one that lacks a need."""
    from reflectrl.llm.tasks import parse_spec

    if not needs:
        return spec
    name, options = parse_spec(spec)
    given = options.get("reflect")
    want = union(needs.values())
    if given is None:
        body = spec.strip()
        return body[:-1] + f";reflect={want}]" if body.endswith("]") else body + f"[reflect={want}]"
    check_mode(given, f"task {name}")
    for who, mode in needs.items():
        if union([given, mode]) != given:
            raise UserError(f"{who} needs the task to state a {mode} but --task {spec!r} has reflect={given}; "
                            f"use reflect={union([given, mode])} (or leave reflect out)")
    return spec
