"""`rag`: agentic retrieval: the agent searches a small corpus, hop by hop, then answers.

The corpus is generated at construction from `corpus_seed`, so neither a download nor
memorised facts help: made-up, capitalised names built from syllables ("Zorvek", "Qelmar"),
all distinct, for three kinds of entity, each with one fact in one short document:

    person P   "P was born in C."        (C a city)
    city C     "C lies in region R."     (R a region)
    region R   "R is ruled by Q."        (Q a person)

A problem is one person P and a number of hops h, drawn uniformly from min_hops..max_hops:

    h=1   "Q: Where was P born?\\n"                       answer C   searches "P born"
    h=2   "Q: In which region was P born?\\n"             answer R   searches "P born", "C region"
    h=3   "Q: Who rules the region where P was born?\\n"  answer Q   searches "P born", "C region", "R ruled"

The agent writes one call per turn; the task replies with the tool's output, which the
trainer appends to the context and masks out of the loss (surrounding whitespace ignored):

    search QUERY   BM25 (the bm25s library) over the corpus: one "doc: TEXT\\n" line for
                   each of the `top_k` best documents; "error: empty query\\n" for no query;
                   "error: no match\\n" when no document shares a word with the query
    answer X       the final answer; ends the episode
    anything else  "error: write one of: search QUERY | answer X\\n"

    prompt   "Q: In which region was Zorvek born?\\n"
    agent    "search Zorvek born"      -> reply "doc: Zorvek was born in Qelmar.\\n"
    agent    "search Qelmar region"    -> reply "doc: Qelmar lies in region Dravis.\\n"
    agent    "answer Dravis"           -> episode over (respond returns None); score 1.0

An episode lasts at most `max_turns` = max_hops + 2 agent turns (the searches, the answer,
one spare). Score: 1.0 iff the last turn is exactly `answer X` with X the answer (the
relevance prefix and the answer reflection removed, see below), else 0.0. Queries and
documents are lowercased and split into words of two or more letters (bm25s.tokenize, no
stemmer, no stopwords: nothing mangles the made-up names); the results of each query are
cached, since the same queries recur throughout RL.

Reflection (`reflect=verdict|confidence|both`; the task places its own, `native_reflect`):
every turn that follows a search (a `search` call with a query) starts with a judgement of
that search's result, "relevant; " or "not relevant; " (tasks/reflect.py, `split_relevance`),
and the final turn ends with the answer reflection of the mode (`split_reflection`):

    prompt   "Q: In which region was Zorvek born?\\n"
    agent    "search Zorvek born"                       -> "doc: Zorvek was born in Qelmar.\\n"
    agent    "relevant; search Qelmar region"           -> "doc: Qelmar lies in region Dravis.\\n"
    agent    "relevant; answer Dravis | solved 0.8"     -> episode over; score 1.0

The tools and the verifier see each turn with the prefix and the suffix removed.
`reflections` gives, per turn, the relevance judgement where one is due (`Reflection(final=
False)`, malformed where the prefix is missing) and, on the last turn, the answer reflection
(final=True, as `Reflective` does); `search_relevance` gives the truth the judgements are
measured against: per search turn, whether its results include a document the problem needs.
With `reflect_after=feedback` (the default: every judgement here follows the tool output it
judges) a relevance judgement carries that truth as its `target`, and the verdict signal
rewards it against it; with `reflect_after=answer` (the format's first version) every
judgement is rewarded against the episode's final outcome.

Demonstrations (for `llm sft`) are the needed searches and the answer. With reflect on, a
share `reflect_negatives` of them is negative, half of one kind and half of the other:
(a) the right searches, then a wrong answer (another entity of the answer's kind) that is
shown but not learned, judged "not solved" with a low confidence (that judgement learned);
(b) a search for another person first ("X born", shown but not learned), then the right
chain, whose first turn judges the bad search "not relevant; " and whose correct answer is
judged solved. Demonstrated confidences are drawn as in tasks/reflect.py (0.6..0.9 correct,
0.1..0.4 wrong), by a generator the task owns, so the problems are the same whatever the
reflect options. Options:

    people        persons (default 60, 2..100000); cities: max(2, people // 3), regions: max(2, people // 9)
    min_hops      the fewest hops a question needs (default 1, 1..3)
    max_hops      the most (default 3, 1..3, at least min_hops)
    top_k         documents a search returns (default 1, 1..20)
    corpus_seed   the corpus's seed (default 0)

Chat form (an instruct model, llm/chat.py): the user turn is the question and the two calls
explained (with reflect on, also the relevance prefix and the answer reflection asked for); a
search's result is a user turn; a reply's call is the first `search QUERY` (the rest of its line)
or `answer X` (X's first word) written in it, prose and markdown around it ignored, and its
reflections are read as tasks/reflect.py reads them in chat form.
"""

from __future__ import annotations

import random
import re
from dataclasses import replace

import numpy as np

from reflectrl.errors import UserError
from reflectrl.llm.tasks.base import Problem, Task
from reflectrl.llm.tasks.reflect import (
    NEGATIVE_CONFIDENCES,
    POSITIVE_CONFIDENCES,
    Reflection,
    at_turn,
    check_mode,
    format_reflection,
    format_relevance,
    resolve_after,
    split_reflection,
    split_relevance,
)

_SEARCH = re.compile(r"search(?:\s+(.*))?", re.DOTALL)
_ANSWER = re.compile(r"answer\s+(\S.*)", re.DOTALL)
_USAGE = "error: write one of: search QUERY | answer X\n"
_EMPTY = "error: empty query\n"
_NO_MATCH = "error: no match\n"
# chat form: the first call written anywhere in a reply
_CHAT_CALL = re.compile(r"(?i:\b(search))\s+([^\n`*]*\w)|(?i:\b(answer)(?:\s+is)?)\s*[:=]?\s*\**([A-Z]\w*)")
_CHAT_RELEVANCE = re.compile(r"^\W*(not relevant|relevant)\b\W*", re.IGNORECASE)
_CACHE_LIMIT = 200_000  # queries remembered before the cache starts afresh (a model may write many)

_ONSETS = ("b", "d", "f", "g", "k", "l", "m", "n", "p", "r", "s", "t", "v", "z", "q", "dr", "th", "kr")
_VOWELS = ("a", "e", "i", "o", "u")
_CODAS = ("", "", "l", "n", "r", "s", "k", "m", "x", "v")
# the documents' and the calls' own words: no name may be one of them
_RESERVED = frozenset("was born in lies region is ruled by search answer doc error no match relevant not "
                      "solved where who which rules the".split())
_TOKENIZE = dict(lower=True, stopwords=None, stemmer=None, return_ids=False, show_progress=False)
_KINDS = ("city", "region", "person")  # the answer's kind, by hops 1, 2, 3
_PROMPTS = ("Q: Where was {} born?\n", "Q: In which region was {} born?\n",
            "Q: Who rules the region where {} was born?\n")


def _names(rng: random.Random, n: int) -> list[str]:
    """n distinct made-up names of two or three syllables, capitalised."""
    names: list[str] = []
    seen: set[str] = set()
    while len(names) < n:
        syllables = rng.choice((2, 2, 3))
        name = "".join(rng.choice(_ONSETS) + rng.choice(_VOWELS) + rng.choice(_CODAS) for _ in range(syllables))
        if name not in seen and name not in _RESERVED:
            seen.add(name)
            names.append(name.capitalize())
    return names


class RagTask(Task):
    name = "rag"
    native_reflect = True  # make_task passes reflect and reflect_negatives instead of wrapping
    max_turns = 5          # set per instance: max_hops + 2
    max_new_tokens = 48    # set per instance: the longest correct turn in bytes, plus slack
    feedback = True        # the search results

    def __init__(self, people: int = 60, min_hops: int = 1, max_hops: int = 3, top_k: int = 1,
                 corpus_seed: int = 0, reflect: str = "none", reflect_negatives: float = 0.5,
                 reflect_after: str = "auto"):
        if not 2 <= people <= 100_000:
            raise UserError(f"task rag: people must be in 2..100000, got {people}")
        if not 1 <= min_hops <= 3:
            raise UserError(f"task rag: min_hops must be in 1..3, got {min_hops}")
        if not 1 <= max_hops <= 3:
            raise UserError(f"task rag: max_hops must be in 1..3, got {max_hops}")
        if min_hops > max_hops:
            raise UserError(f"task rag: min_hops={min_hops} must not exceed max_hops={max_hops}")
        if not 1 <= top_k <= 20:
            raise UserError(f"task rag: top_k must be in 1..20, got {top_k}")
        self.reflect = check_mode(reflect, "task rag")
        self.reflect_after = resolve_after(reflect_after, self)
        if not 0.0 <= reflect_negatives <= 1.0:
            raise UserError(f"task rag: reflect_negatives={reflect_negatives} must be in [0, 1]")
        self.people, self.min_hops, self.max_hops, self.top_k = people, min_hops, max_hops, top_k
        self.corpus_seed, self.negatives = corpus_seed, reflect_negatives
        self.max_turns = max_hops + 2

        rng = random.Random(corpus_seed)
        cities, regions = max(2, people // 3), max(2, people // 9)
        names = _names(rng, people + cities + regions)
        self.persons = names[:people]
        self.cities = names[people:people + cities]
        self.regions = names[people + cities:]
        self.born = [rng.randrange(cities) for _ in range(people)]         # person -> city
        self.region_of = [rng.randrange(regions) for _ in range(cities)]   # city -> region
        self.ruler = [rng.randrange(people) for _ in range(regions)]       # region -> person
        # documents: the persons', then the cities', then the regions', in order
        self.documents = ([f"{p} was born in {self.cities[c]}." for p, c in zip(self.persons, self.born)]
                          + [f"{c} lies in region {self.regions[r]}." for c, r in zip(self.cities, self.region_of)]
                          + [f"{r} is ruled by {self.persons[q]}." for r, q in zip(self.regions, self.ruler)])

        import bm25s  # imported here: it takes a quarter of a second (scipy)

        self._bm25s = bm25s
        self._index = bm25s.BM25()
        self._index.index(bm25s.tokenize(self.documents, **_TOKENIZE), show_progress=False)
        self._cache: dict[str, tuple[int, ...]] = {}
        self._demo_rng = random.Random(f"rag-demo-{corpus_seed}")  # the demonstrations' choices; never the problems'

        relevance = len(format_relevance(False)) if self.reflect != "none" else 0
        suffix = len(format_reflection(False, 0.0, "both")) if self.reflect != "none" else 0
        searches = [f"search {p} born" for p in self.persons] + [f"search {c} region" for c in self.cities] + \
                   [f"search {r} ruled" for r in self.regions]
        longest = max(max(len(s.encode()) for s in searches) + relevance,
                      max(len(f"answer {n}".encode()) for n in names) + relevance + suffix)
        self.max_new_tokens = longest + 4

    # -- search ---------------------------------------------------------------------------

    def search(self, query: str) -> tuple[int, ...]:
        """The indices of the (at most top_k) best documents for `query`, best first; none
        when no document shares a word with it. Ties go to the earlier document."""
        key = query.strip()
        hit = self._cache.get(key)
        if hit is not None:
            return hit
        tokens = [t for t in self._bm25s.tokenize(key, **_TOKENIZE)[0] if t in self._index.vocab_dict]
        result: tuple[int, ...] = ()
        if tokens:
            scores = self._index.get_scores(tokens)
            order = np.argsort(-scores, kind="stable")[:self.top_k]
            result = tuple(int(i) for i in order if scores[i] > 0)
        if len(self._cache) >= _CACHE_LIMIT:
            self._cache.clear()
        self._cache[key] = result
        return result

    def _query(self, action: str) -> str | None:
        """The query of a `search` call with one; None for anything else."""
        m = _SEARCH.fullmatch(action)
        if m is None or not (m.group(1) or "").strip():
            return None
        return m.group(1).strip()

    # -- the format -----------------------------------------------------------------------

    def instruction(self, problem: Problem) -> str:
        text = (f"{problem.prompt[len('Q: '):].strip()} Find out by searching the documents. Write one call per "
                "message: `search QUERY` searches them, and `answer X` gives your final answer (one name).")
        if self.reflect != "none":
            text += (" Start each message after a search with `relevant;` or `not relevant;` (whether its result "
                     "helps), and end your answer with " + {"verdict": "`solved` or `not solved`.",
                                                           "confidence": "your confidence from 0 to 1.",
                                                           "both": "`solved` or `not solved` and your confidence "
                                                                   "from 0 to 1."}[self.reflect])
        return text

    def _parse(self, turn: str) -> tuple[str, Reflection, Reflection]:
        """A turn -> (its action, its relevance judgement, its answer reflection)."""
        if self.reflect == "none":
            return self._chat_call(turn) if self.chat else turn.strip(), Reflection(final=False), Reflection()
        head, answer_reflection = split_reflection(turn, self.reflect, self.chat)
        if self.chat:
            m = _CHAT_RELEVANCE.match(head)
            relevance = (Reflection(final=False) if m is None else
                         Reflection(verdict=m.group(1).lower() == "relevant", well_formed=True, final=False))
            return self._chat_call(head if m is None else head[m.end():]), relevance, answer_reflection
        action, relevance = split_relevance(head)
        return action.strip(), relevance, answer_reflection

    @staticmethod
    def _chat_call(text: str) -> str:
        """The first call written in an instruct model's reply, as the raw format writes it."""
        m = _CHAT_CALL.search(text)
        if m is None:
            return text.strip()
        return f"search {m.group(2).strip()}" if m.group(1) else f"answer {m.group(4)}"

    def _action(self, turn: str) -> str:
        return self._parse(turn)[0]

    # -- the Task protocol ----------------------------------------------------------------

    def sample(self, rng: random.Random) -> Problem:
        person = rng.randrange(self.people)
        hops = rng.randint(self.min_hops, self.max_hops)
        city = self.born[person]
        region = self.region_of[city]
        ruler = self.ruler[region]
        names = [self.persons[person], self.cities[city], self.regions[region], self.persons[ruler]]
        docs = [person, self.people + city, self.people + len(self.cities) + region][:hops]
        queries = [f"{names[0]} born", f"{names[1]} region", f"{names[2]} ruled"][:hops]
        problem = Problem(prompt=_PROMPTS[hops - 1].format(names[0]), answer=names[hops],
                          meta={"hops": hops, "chain": names[:hops + 1], "docs": docs, "queries": queries,
                                "kind": _KINDS[hops - 1]})
        if self.reflect != "none":
            problem.meta["reflect_demo"] = self._demo_choices(problem)
        return problem

    def _demo_choices(self, problem: Problem) -> dict:
        r = self._demo_rng
        negative = r.random() < self.negatives
        kind = r.choice(("answer", "search")) if negative else None
        bad_query = None
        if kind == "search":  # a search for another person whose results hold nothing the problem needs
            for _ in range(20):
                other = r.choice(self.persons)
                if other != problem.meta["chain"][0] and \
                        not set(self.search(f"{other} born")) & set(problem.meta["docs"]):
                    bad_query = f"{other} born"
                    break
            else:
                kind = "answer"
        wrong = self._wrong_answer(problem, r) if kind == "answer" else None
        confidence = r.choice(NEGATIVE_CONFIDENCES if kind == "answer" else POSITIVE_CONFIDENCES)
        return {"negative": negative, "kind": kind, "wrong": wrong, "bad_query": bad_query,
                "confidence": confidence}

    def _wrong_answer(self, problem: Problem, rng: random.Random) -> str:
        pool = {"city": self.cities, "region": self.regions, "person": self.persons}[problem.meta["kind"]]
        return rng.choice([n for n in pool if n != problem.answer])

    def respond(self, problem: Problem, turns: list[str]) -> str | None:
        action = self._action(turns[-1])
        if _ANSWER.fullmatch(action):
            return None
        if _SEARCH.fullmatch(action) is None:
            return _USAGE
        query = self._query(action)
        if query is None:
            return _EMPTY
        found = self.search(query)
        if not found:
            return _NO_MATCH
        return "".join(f"doc: {self.documents[i]}\n" for i in found)

    def score(self, problem: Problem, turns: list[str]) -> float:
        m = _ANSWER.fullmatch(self._action(turns[-1])) if turns else None
        return float(m is not None and m.group(1).strip() == problem.answer)

    def reflections(self, problem: Problem, turns: list[str]) -> list[list[Reflection]]:
        """Per turn: the relevance judgement of the previous turn's search, where that was a
        search; on the last turn also the answer reflection. Empty lists with reflect=none."""
        if self.reflect == "none":
            return [[] for _ in turns]
        parsed = [self._parse(t) for t in turns]
        truth = self.search_relevance(problem, turns) if self.reflect_after == "feedback" else [None] * len(turns)
        out: list[list[Reflection]] = []
        for i, (_, relevance, answer_reflection) in enumerate(parsed):
            stated = []
            if i > 0 and self._query(parsed[i - 1][0]) is not None:
                stated.append(replace(at_turn(relevance, i), target=truth[i - 1]))
            if i == len(turns) - 1:
                stated.append(at_turn(answer_reflection, i))
            out.append(stated)
        return out

    def search_relevance(self, problem: Problem, turns: list[str]) -> list[bool | None]:
        """Per turn: for a search, whether its results include a document the problem needs
        (the truth a relevance judgement is measured against); None for other turns."""
        needed = set(problem.meta["docs"])
        out: list[bool | None] = []
        for turn in turns:
            query = self._query(self._action(turn))
            out.append(None if query is None else bool(set(self.search(query)) & needed))
        return out

    def _chain(self, problem: Problem, after_bad_search: bool = False) -> list[str]:
        """The needed searches, each judged as the task's format asks, without the answer."""
        turns = []
        for i, query in enumerate(problem.meta["queries"]):
            prefix = "" if self.reflect == "none" else \
                format_relevance(True) if i else (format_relevance(False) if after_bad_search else "")
            turns.append(f"{prefix}search {query}")
        return turns

    def _answer_turn(self, answer: str) -> str:
        return ("" if self.reflect == "none" else format_relevance(True)) + f"answer {answer}"

    def demonstration(self, problem: Problem) -> list:
        turns = self._chain(problem)
        if self.reflect == "none":
            return turns + [self._answer_turn(problem.answer)]
        demo = problem.meta.get("reflect_demo") or {"negative": False, "kind": None, "confidence": 1.0}
        if demo["kind"] == "answer":  # a wrong answer shown, not learned; its judgement learned
            return turns + [[(self._answer_turn(demo["wrong"]), False),
                             (format_reflection(False, demo["confidence"], self.reflect), True)]]
        final = self._answer_turn(problem.answer) + format_reflection(True, demo["confidence"], self.reflect)
        if demo["kind"] == "search":  # a bad search shown, not learned; judged "not relevant" after it
            return [[(f"search {demo['bad_query']}", False)]] + self._chain(problem, True) + [final]
        return turns + [final]

    def reference(self, problem: Problem, kind: str = "solution") -> str:
        """A correct episode's calls, one per line (the searches, then the answer; with their
        relevance judgements where the format asks for them), without a reflection."""
        if kind == "answer":
            return str(problem.answer)
        return "\n".join(self._chain(problem) + [self._answer_turn(problem.answer)])

    def wrong_turns(self, problem: Problem, rng: random.Random) -> list[str]:
        """The right searches (judged, with reflect on), then a wrong answer, without its reflection."""
        return self._chain(problem) + [self._answer_turn(self._wrong_answer(problem, rng))]
