"""The `rag` task: its generated corpus, BM25 search, episodes, reflections and demonstrations."""

from __future__ import annotations

import random

import pytest

from reflectrl.errors import UserError
from reflectrl.llm.tasks import TASK_NAMES, make_task
from reflectrl.llm.tasks.base import turn_pieces, turn_text
from reflectrl.llm.tasks.rag import RagTask
from reflectrl.llm.tasks.reflect import REFLECT_MODES, Reflection

MODES = REFLECT_MODES  # none, verdict, confidence, both


@pytest.fixture(scope="module")
def tasks():
    """One task per reflect mode, built once (an index takes a few milliseconds)."""
    return {mode: RagTask(reflect=mode) for mode in MODES}


def play(task, problem, turns):
    """An episode laid out as the trainer lays it out: (turn texts, tool replies)."""
    texts, replies = [], []
    for turn in turns:
        texts.append(turn_text(turn))
        reply = task.respond(problem, texts)
        replies.append(reply)
        if reply is None or len(texts) == task.max_turns:
            break
    return texts, replies


def sample_kind(task, rng, kind, hops=None):
    """A problem whose demonstration is of `kind` (None: positive, "answer", "search")."""
    for _ in range(1000):
        p = task.sample(rng)
        if p.meta["reflect_demo"]["kind"] == kind and (hops is None or p.meta["hops"] == hops):
            return p
    raise AssertionError(f"no problem with a {kind} demonstration")


# -- the corpus and its search ---------------------------------------------------------------

@pytest.mark.parametrize("people,seed,top_k", [(60, 0, 1), (60, 7, 3), (300, 1, 1), (2, 3, 2)])
def test_bm25_finds_the_planted_documents(people, seed, top_k):
    task = RagTask(people=people, corpus_seed=seed, top_k=top_k)
    rng = random.Random(seed)
    for _ in range(300):
        p = task.sample(rng)
        assert len(p.meta["queries"]) == len(p.meta["docs"]) == p.meta["hops"]
        for query, doc in zip(p.meta["queries"], p.meta["docs"]):
            found = task.search(query)
            assert found[0] == doc, (query, [task.documents[i] for i in found])
            assert len(found) == min(top_k, len(task.documents))
    for i, text in enumerate(task.documents):  # each document's own text finds it first
        assert task.search(text)[0] == i, text


def test_corpus_shape_and_names():
    task = RagTask(people=60)
    assert (len(task.persons), len(task.cities), len(task.regions)) == (60, 20, 6)
    assert len(task.documents) == 86
    names = task.persons + task.cities + task.regions
    assert len(set(names)) == len(names)
    assert all(n.isalpha() and n[0].isupper() and n[1:].islower() and len(n) >= 4 for n in names)
    assert task.documents[0] == f"{task.persons[0]} was born in {task.cities[task.born[0]]}."
    assert task.documents[60] == f"{task.cities[0]} lies in region {task.regions[task.region_of[0]]}."
    assert task.documents[80] == f"{task.regions[0]} is ruled by {task.persons[task.ruler[0]]}."
    small = RagTask(people=2)
    assert (len(small.cities), len(small.regions)) == (2, 2)


def test_same_seed_same_corpus_other_seed_other_corpus():
    a, b, c = RagTask(corpus_seed=5), RagTask(corpus_seed=5), RagTask(corpus_seed=6)
    assert a.documents == b.documents
    assert a.documents != c.documents
    ra, rb = random.Random(1), random.Random(1)
    assert [a.sample(ra).prompt for _ in range(20)] == [b.sample(rb).prompt for _ in range(20)]


def test_search_is_cached_and_case_insensitive():
    task = RagTask()
    p = task.persons[0]
    assert task.search(f"{p} born") == task.search(f"{p.lower()} BORN") == (0,)
    assert f"{p} born" in task._cache
    assert task.search("!!! ?") == ()  # no word of the index


# -- questions and episodes ------------------------------------------------------------------

def test_questions_follow_the_chain():
    task = RagTask()
    rng = random.Random(0)
    seen = set()
    for _ in range(200):
        p = task.sample(rng)
        h, chain = p.meta["hops"], p.meta["chain"]
        seen.add(h)
        person = task.persons.index(chain[0])
        city = task.born[person]
        assert chain[1] == task.cities[city]
        if h >= 2:
            assert chain[2] == task.regions[task.region_of[city]]
        if h == 3:
            assert chain[3] == task.persons[task.ruler[task.region_of[city]]]
        assert p.answer == chain[h]
        assert p.prompt == {1: f"Q: Where was {chain[0]} born?\n",
                            2: f"Q: In which region was {chain[0]} born?\n",
                            3: f"Q: Who rules the region where {chain[0]} was born?\n"}[h]
        assert p.meta["queries"] == [f"{chain[0]} born", f"{chain[1]} region", f"{chain[-2]} ruled"][:h]
    assert seen == {1, 2, 3}


@pytest.mark.parametrize("mode", MODES)
def test_demonstration_episode_scores_one(tasks, mode):
    task = tasks[mode]
    rng = random.Random(3)
    kinds = [None] if mode == "none" else [None, "search"]
    for kind in kinds:
        for _ in range(30):
            p = task.sample(rng) if mode == "none" else sample_kind(task, rng, kind)
            demo = task.demonstration(p)
            assert len(demo) <= task.max_turns
            texts, replies = play(task, p, demo)
            assert len(texts) == len(demo)
            assert replies[-1] is None and all(r.startswith("doc: ") for r in replies[:-1])
            assert task.score(p, texts) == 1.0


def test_demonstration_replies_show_the_needed_documents():
    task = RagTask()
    p = next(q for q in (task.sample(random.Random(s)) for s in range(100)) if q.meta["hops"] == 3)
    texts, replies = play(task, p, task.demonstration(p))
    assert replies[:-1] == [f"doc: {task.documents[i]}\n" for i in p.meta["docs"]]
    assert texts == [f"search {q}" for q in p.meta["queries"]] + [f"answer {p.answer}"]


def test_top_k_replies_one_line_per_document():
    task = RagTask(top_k=3)
    p = task.sample(random.Random(0))
    reply = task.respond(p, [f"search {p.meta['queries'][0]}"])
    lines = reply.splitlines(keepends=True)
    assert len(lines) == 3 and all(line.startswith("doc: ") and line.endswith(".\n") for line in lines)
    assert lines[0] == f"doc: {task.documents[p.meta['docs'][0]]}\n"


def test_wrong_answers_and_bad_calls(tasks):
    task = tasks["none"]
    p = task.sample(random.Random(0))
    wrong = task.wrong_turns(p, random.Random(1))
    assert wrong[:-1] == task.demonstration(p)[:-1] and wrong[-1] != f"answer {p.answer}"
    assert task.respond(p, wrong) is None and task.score(p, wrong) == 0.0
    assert task.score(p, [f"  answer {p.answer}  "]) == 1.0
    assert task.score(p, [f"answer {p.answer.lower()}"]) == 0.0
    assert task.score(p, [f"answer {p.answer}."]) == 0.0
    assert task.score(p, [f"search {p.answer}"]) == 0.0
    assert task.score(p, []) == 0.0
    usage = "error: write one of: search QUERY | answer X\n"
    for bad in ("lookup k3", "searchfoo", "answer", "", "Search x", f"relevant; answer {p.answer}"):
        assert task.respond(p, [bad]) == usage, bad
    assert task.respond(p, ["search"]) == task.respond(p, ["search   "]) == "error: empty query\n"
    assert task.respond(p, ["search ?!"]) == "error: no match\n"
    # reflect=none: a stated reflection is part of the answer, as with every plain task
    assert task.score(p, [f"answer {p.answer} | solved"]) == 0.0


def test_reflective_turns_are_stripped_for_tools_and_verifier(tasks):
    task = tasks["both"]
    p = task.sample(random.Random(2))
    q = p.meta["queries"][0]
    assert task.respond(p, [f"relevant; search {q}"]) == task.respond(p, [f"search {q}"])
    assert task.respond(p, [f"not relevant ;search {q} | 0.3"]) == task.respond(p, [f"search {q}"])
    assert task.respond(p, [f"relevant; answer {p.answer} | solved 0.9"]) is None
    assert task.score(p, [f"search {q}", f"relevant; answer {p.answer} | solved 0.9"]) == 1.0
    assert task.score(p, [f"search {q}", f"answer {p.answer}"]) == 1.0  # format is the reflections' business
    assert task.score(p, [f"search {q}", f"relevant; answer {p.answer}x | solved 0.9"]) == 0.0


def test_episode_ends_at_max_turns():
    task = make_task("rag[max_hops=2]")
    assert task.max_turns == 4
    p = task.sample(random.Random(0))
    texts, replies = play(task, p, ["search nobody"] * 10)
    assert len(texts) == 4 and all(r is not None for r in replies)
    assert task.score(p, texts) == 0.0


# -- reflections -------------------------------------------------------------------------------

def test_reflections_parse_relevance_and_answer(tasks):
    task = tasks["both"]
    p = next(q for q in (task.sample(random.Random(s)) for s in range(100)) if q.meta["hops"] == 2)
    q0, q1 = p.meta["queries"]
    turns = [f"search {q0}", f"relevant; search {q1}", f"not relevant; answer {p.answer} | solved 0.7"]
    got = task.reflections(p, turns)
    assert got == [[], [Reflection(verdict=True, well_formed=True, final=False)],
                   [Reflection(verdict=False, well_formed=True, final=False),
                    Reflection(verdict=True, confidence=0.7, well_formed=True, final=True)]]
    # a missing prefix is a malformed judgement; a missing suffix a malformed reflection
    missing = task.reflections(p, [f"search {q0}", f"answer {p.answer}"])
    assert missing == [[], [Reflection(final=False), Reflection()]]
    assert not missing[1][0].well_formed and missing[1][0].verdict is None
    # verdict alone is malformed in mode both; fine in mode verdict
    assert not task.reflections(p, [f"answer {p.answer} | solved"])[0][0].well_formed
    assert tasks["verdict"].reflections(p, [f"answer {p.answer} | solved"])[0][0].well_formed
    # no relevance is due after a non-search (a usage error, an empty query)
    assert task.reflections(p, ["hello", "search", f"answer {p.answer} | solved 1"]) == \
        [[], [], [Reflection(verdict=True, confidence=1.0, well_formed=True)]]
    # reflect=none: nothing is stated anywhere
    assert tasks["none"].reflections(p, turns) == [[], [], []]
    assert task.reflections(p, []) == []


def test_demonstrated_reflections_are_well_formed_and_true(tasks):
    rng = random.Random(4)
    for mode in ("verdict", "confidence", "both"):
        task = tasks[mode]
        for kind in (None, "answer", "search"):
            for _ in range(10):
                p = sample_kind(task, rng, kind)
                texts = [turn_text(t) for t in task.demonstration(p)]
                stated = task.reflections(p, texts)
                truth = task.search_relevance(p, texts)
                for i, refl in enumerate(stated):
                    for r in refl:
                        assert r.well_formed, (texts, i)
                    relevance = [r for r in refl if not r.final]
                    if i > 0 and truth[i - 1] is not None:
                        assert [r.verdict for r in relevance] == [truth[i - 1]]
                    else:
                        assert relevance == []
                answer = stated[-1][-1]
                assert answer.final
                assert answer.stated_verdict == (task.score(p, texts) == 1.0)
                assert (answer.stated_confidence >= 0.6) == (kind != "answer")


def test_search_relevance_truth(tasks):
    task = tasks["both"]
    rng = random.Random(5)
    p = sample_kind(task, rng, None, hops=3)
    texts = [turn_text(t) for t in task.demonstration(p)]
    assert task.search_relevance(p, texts) == [True, True, True, None]
    # a search for someone else's birth place finds nothing the problem needs
    other = next(n for n in task.persons if not set(task.search(f"{n} born")) & set(p.meta["docs"]))
    turns = [f"search {other} born", "search", "hi", f"relevant; search {p.meta['queries'][1]}"]
    assert task.search_relevance(p, turns) == [False, None, None, True]
    # the bad search of a negative demonstration is judged not relevant, and truly is not
    q = sample_kind(task, rng, "search")
    texts = [turn_text(t) for t in task.demonstration(q)]
    assert task.search_relevance(q, texts)[0] is False
    assert texts[1].startswith("not relevant; ")
    assert task.reflections(q, texts)[1][0].verdict is False


# -- demonstrations and masking ------------------------------------------------------------------

def test_negative_demonstrations(tasks):
    task = tasks["both"]
    rng = random.Random(6)
    problems = [task.sample(rng) for _ in range(400)]
    kinds = [p.meta["reflect_demo"]["kind"] for p in problems]
    assert 0.4 < sum(k is not None for k in kinds) / len(kinds) < 0.6
    assert kinds.count("answer") > 50 and kinds.count("search") > 50
    a = next(p for p in problems if p.meta["reflect_demo"]["kind"] == "answer")
    *before, last = task.demonstration(a)
    wrong = a.meta["reflect_demo"]["wrong"]
    assert wrong != a.answer and wrong in {"city": task.cities, "region": task.regions,
                                           "person": task.persons}[a.meta["kind"]]
    assert all(isinstance(t, str) for t in before)
    assert last[0] == (f"{'relevant; ' if before else ''}answer {wrong}", False)
    assert last[1][1] is True and last[1][0].startswith(" | not solved 0.")
    assert task.score(a, [turn_text(t) for t in task.demonstration(a)]) == 0.0
    b = next(p for p in problems if p.meta["reflect_demo"]["kind"] == "search")
    demo = task.demonstration(b)
    assert demo[0] == [(f"search {b.meta['reflect_demo']['bad_query']}", False)]
    assert demo[1] == f"not relevant; search {b.meta['queries'][0]}"
    assert len(demo) == b.meta["hops"] + 2 <= task.max_turns
    # no negatives asked for: none given
    none = RagTask(reflect="both", reflect_negatives=0.0)
    r = random.Random(0)
    assert all(none.sample(r).meta["reflect_demo"]["kind"] is None for _ in range(100))


def test_problems_do_not_depend_on_reflect_options():
    streams = []
    for spec in ("rag", "rag[reflect=both]", "rag[reflect=verdict;reflect_negatives=1.0]"):
        task, rng = make_task(spec), random.Random(9)
        streams.append([(p.prompt, p.answer) for p in (task.sample(rng) for _ in range(50))])
    assert streams[0] == streams[1] == streams[2]


def test_max_new_tokens_covers_every_demonstrated_turn(tasks):
    for mode, task in tasks.items():
        rng = random.Random(7)
        longest = max(len(turn_text(t).encode()) for _ in range(300) for t in task.demonstration(task.sample(rng)))
        assert longest < task.max_new_tokens <= longest + 16, mode


@pytest.fixture(scope="module")
def tokenizer():
    from reflectrl.llm.model import build_tokenizer

    return build_tokenizer(vocab_size=300, tasks=("arith",))


def test_sft_masks_tool_output_and_unlearned_pieces(tasks, tokenizer):
    from reflectrl.llm.sft import demonstration_tokens

    eos = tokenizer.eos_token
    rng = random.Random(8)
    for mode, kind in (("none", None), ("both", None), ("both", "answer"), ("both", "search"),
                       ("confidence", "answer")):
        task = tasks[mode]
        p = task.sample(rng) if mode == "none" else sample_kind(task, rng, kind)
        demo = task.demonstration(p)
        ids, agent = demonstration_tokens(tokenizer, task, p)
        assert len(ids) == len(agent)
        learned = "".join("".join(text for text, on in turn_pieces(t) if on) + eos for t in demo)
        context = p.prompt
        texts = []
        for t in demo:
            texts.append(turn_text(t))
            context += "".join(text for text, on in turn_pieces(t) if not on)
            context += task.respond(p, texts) or ""
        decode = tokenizer.decode
        assert decode([i for i, a in zip(ids, agent) if a]) == learned, (mode, kind)
        assert decode([i for i, a in zip(ids, agent) if not a]) == context, (mode, kind)
        assert "doc: " in context and "doc: " not in learned
        if kind == "answer":
            assert f"answer {p.meta['reflect_demo']['wrong']}" in context
            assert "answer" not in learned.split(eos)[-2]  # the last turn: its judgement only
        if kind == "search":
            assert p.meta["reflect_demo"]["bad_query"] in context and "not relevant; " in learned


# -- options and the spec ------------------------------------------------------------------------

@pytest.mark.parametrize("spec,message", [
    ("rag[max_hops=4]", "max_hops must be in 1..3, got 4"),
    ("rag[min_hops=0]", "min_hops must be in 1..3, got 0"),
    ("rag[people=0]", "people must be in 2..100000, got 0"),
    ("rag[people=1]", "people must be in 2..100000, got 1"),
    ("rag[min_hops=3;max_hops=2]", "min_hops=3 must not exceed max_hops=2"),
    ("rag[top_k=0]", "top_k must be in 1..20, got 0"),
    ("rag[reflect=bogus]", "reflect='bogus'; use one of none, verdict, confidence, both"),
    ("rag[reflect=both;reflect_negatives=2]", "reflect_negatives=2.0 must be in [0, 1]"),
    ("rag[hops=2]", "unknown option 'hops'"),
    ("rag[people=many]", "option people='many' must be"),
])
def test_bad_options(spec, message):
    with pytest.raises(UserError, match="task rag") as err:
        make_task(spec)
    assert message in str(err.value)
    assert "\n" not in str(err.value)


def test_spec_parser_builds_the_task():
    assert "rag" in TASK_NAMES
    task = make_task("rag[max_hops=2;people=30;top_k=2;corpus_seed=3]")
    assert isinstance(task, RagTask)  # placed its own reflections: not wrapped
    assert (task.max_hops, task.people, task.top_k, task.corpus_seed, task.max_turns) == (2, 30, 2, 3, 4)
    rng = random.Random(0)
    assert {task.sample(rng).meta["hops"] for _ in range(100)} == {1, 2}
    reflective = make_task("rag[reflect=confidence;reflect_negatives=0.25]")
    assert isinstance(reflective, RagTask) and reflective.reflect == "confidence"
    assert reflective.negatives == 0.25
    assert make_task("rag[min_hops=3]").sample(random.Random(0)).meta["hops"] == 3
    with pytest.raises(UserError, match=r"did you mean 'rag'\?.*valid tasks: .*rag"):
        make_task("ragg")
