"""Episodes as tokens: the one place where a task's prompt, the agent's turns and the
environment's replies become token ids (the rollout, SFT's demonstrations and the teacher's
inputs all go through it).

Raw form, for a tokenizer without a chat template (the tiny model): the prompt is encoded as it
is (with a BOS where the tokenizer adds one), each agent turn ends in eos, and a reply is its
text encoded after it; a hint (a reference the teacher reads) follows the prompt:

    "12+7=" "19" <eos>                           the tokens of one arith episode

Chat form, for a tokenizer with one (`tokenizer.chat_template`, e.g. SmolLM2-Instruct's ChatML):
the task switches to its instruct form (`Task.use_chat`: the instruction's wording, a longer
generation budget, answers read the way an instruct model writes them), the prompt is the
task's `instruction(problem)` as a user turn rendered with the generation prompt, the agent's
turn ends at its end-of-turn token (the tokenizer's eos, where generation stops), and every
reply is a new user turn followed by the generation prompt again; a hint goes inside the user
turn, after the instruction:

    <|im_start|>system ... <|im_end|>\\n<|im_start|>user\\nINSTRUCTION<|im_end|>\\n<|im_start|>assistant\\n
    TURN<|im_end|>                                  (the agent's tokens: the loss's)
    \\n<|im_start|>user\\nREPLY<|im_end|>\\n<|im_start|>assistant\\n    (the environment's: context only)

The text between an assistant turn's end and a user turn's content, and after it, is read from
the template itself (rendered once with placeholders), so any template that ends an assistant
turn with the eos token works. A turn the budget cut off before its eos is closed with one, as
context, before the next reply.
"""

from __future__ import annotations

from reflectrl.errors import UserError

# placeholders rendered through a template to find where a turn's content sits (no template trims them)
_USER, _ASSISTANT, _REPLY = "@@reflectrl-user@@", "@@reflectrl-assistant@@", "@@reflectrl-reply@@"
_FRAMES: dict[tuple[str, str], tuple[str, str]] = {}  # (template, eos) -> (before a reply, after it)


def has_chat(tokenizer) -> bool:
    """Whether episodes are rendered as chat turns: the tokenizer has a chat template."""
    return bool(getattr(tokenizer, "chat_template", None))


def speak(task, tokenizer) -> bool:
    """Put `task` in the form `tokenizer` speaks (chat where it has a template, raw otherwise);
    returns whether that is chat. Call it before reading the task's `max_new_tokens`."""
    chat = has_chat(tokenizer)
    task.use_chat(chat)
    return chat


def _render(tokenizer, messages: list[dict], generation_prompt: bool) -> str:
    return tokenizer.apply_chat_template(messages, add_generation_prompt=generation_prompt, tokenize=False)


def _frame(tokenizer) -> tuple[str, str]:
    """(the text from an assistant turn's eos to a user reply's content, the text after that content
    up to and including the next generation prompt), as the tokenizer's template writes them."""
    key = (tokenizer.chat_template, tokenizer.eos_token)
    if key not in _FRAMES:
        full = _render(tokenizer, [{"role": "user", "content": _USER}, {"role": "assistant", "content": _ASSISTANT},
                                   {"role": "user", "content": _REPLY}], True)
        end = full.find(_ASSISTANT) + len(_ASSISTANT)
        if not full.startswith(tokenizer.eos_token, end) or _REPLY not in full[end:]:
            raise UserError(f"the model's chat template does not end an assistant turn with its eos token "
                            f"{tokenizer.eos_token!r}, which ends every agent turn; use a model whose template "
                            "does, or one without a chat template")
        start = end + len(tokenizer.eos_token)
        reply = full.index(_REPLY, start)
        _FRAMES[key] = (full[start:reply], full[reply + len(_REPLY):])
    return _FRAMES[key]


def prompt_ids(tokenizer, task, problem, hint: str | None = None) -> list[int]:
    """The tokens before the agent's first turn: the prompt (with `hint` after it, where given)."""
    if not has_chat(tokenizer):
        ids = tokenizer.encode(problem.prompt)  # with a BOS where the model has one
        return ids + tokenizer.encode(hint, add_special_tokens=False) if hint is not None else ids
    content = task.instruction(problem)
    if hint is not None:
        content = f"{content}\n\n{hint.strip()}"
    text = _render(tokenizer, [{"role": "user", "content": content}], True)
    return tokenizer.encode(text, add_special_tokens=False)


def reply_ids(tokenizer, reply: str, context: list[int]) -> list[int]:
    """The tokens of an environment reply to the agent's turn that ends `context` (the episode's
    tokens so far): in chat form a user turn and the generation prompt, after an eos that closes
    a turn the budget cut off before one."""
    if not has_chat(tokenizer):
        return tokenizer.encode(reply, add_special_tokens=False)
    before, after = _frame(tokenizer)
    close = [] if context and context[-1] == tokenizer.eos_token_id else [tokenizer.eos_token_id]
    return close + tokenizer.encode(before + reply.strip() + after, add_special_tokens=False)
