"""A reflectrl task and its stated-reflection signals as reward functions for TRL's GRPOTrainer
(or any trainer that takes `reward_funcs(prompts, completions, **columns) -> list[float]`).

    from trl import GRPOConfig, GRPOTrainer
    from reflectrl.integrations.rewards import task_dataset, task_rewards

    rows = task_dataset("arith[max_operand=99;reflect=both]", 2000, seed=0, instruct=True)
    trainer = GRPOTrainer(model="Qwen/Qwen2.5-0.5B-Instruct", args=GRPOConfig(...),
                          train_dataset=datasets.Dataset.from_list(rows),
                          reward_funcs=task_rewards("arith[max_operand=99;reflect=both]", ["verdict"]))

TRL sums the reward functions (`reward_weights` 1 each) and normalises the sum within each
group, which is exactly how reflectrl's own GRPO trainer treats the signals' terms on a
single-turn task: `outcome` is the task's verifier, `verdict` the RefGRPO paper's
c * 1[verdict == outcome], `confidence` RLCR's proper score, each with the knobs and the
schedule of its signal (signals/verdict/torch.py, signals/confidence/torch.py; the schedule reads TRL's
`trainer_state.global_step / max_steps`). The verdict, confidence and outcome are read from
the completion exactly as reflectrl reads them (tasks/reflect.py). Single-turn tasks only:
TRL's GRPOTrainer generates one completion per prompt.

`instruct=True` prefixes each prompt with one sentence describing the reflection format, for
a model that was not taught it by `reflectrl llm sft`.

For an instruct model (one with a chat template), `chat=True` in both functions gives what
`reflectrl llm train` gives that model (llm/chat.py): each row's prompt is the task's
instruction as a user turn, `{"prompt": [{"role": "user", "content": task.instruction(p)}]}`
(TRL renders conversational rows through the template with its generation prompt), and the
reward functions read the completions as an instruct model writes them (the number after prose,
the ```python block). `chat="raw"` keeps the task's raw continuation prompt as the user turn and
reads completions in the raw form (what `chat=True` meant before; the Qwen scripts in
examples/experiments use it, and pin their own instruction sentence).
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence

from reflectrl.errors import UserError
from reflectrl.llm.tasks import make_task
from reflectrl.llm.tasks.reflect import wants
from reflectrl.signals.base import scheduled

INSTRUCTIONS = {
    "verdict": "Give only the final answer, then ' | ' and 'solved' if you are sure it is right or "
               "'not solved' otherwise, e.g. '42 | solved'.",
    "confidence": "Give only the final answer, then ' | ' and the probability from 0 to 1 that it is right, "
                  "e.g. '42 | 0.7'.",
    "both": "Give only the final answer, then ' | ', 'solved' or 'not solved', and the probability from 0 to 1 "
            "that it is right, e.g. '42 | solved 0.8'.",
}


def _task(spec: str, chat: bool | str):
    """The task of `spec` in the form `chat` asks for (True: chat form; False or "raw": raw)."""
    if chat not in (True, False, "raw"):
        raise UserError(f"chat={chat!r}: use True (the task's chat form), 'raw' (its raw prompt as a user turn) "
                        "or False (plain text)")
    task = make_task(spec)
    task.use_chat(chat is True)
    return task


def task_dataset(spec: str, n: int, seed: int = 0, instruct: bool = False, chat: bool | str = False,
                 reference: str | None = None, instruction: str | None = None) -> list[dict]:
    """`n` problems of the task as rows {"prompt", "problem"} (`problem`: the row's index, which
    the reward functions read back); with `reference` ("solution" or "answer"), also the task's
    reference for each (the column DivergenceGRPOTrainer's teacher reads); `instruction`: a
    sentence put before each prompt; `chat`: True (the task's chat form, as `reflectrl llm train`
    gives a chat model), "raw" (the raw prompt as a user turn) or False (plain text rows)."""
    task = _task(spec, chat)
    if task.max_turns != 1:
        hint = ("; a reflection after the tests' feedback is a turn of its own: add reflect_after=answer to "
                "reflect in the answer's turn") if "reflect" in spec and "reflect_after=answer" not in spec else ""
        raise UserError(f"task {spec!r} is multi-turn; TRL's GRPOTrainer generates one completion per prompt: "
                        f"train it with 'reflectrl llm train'{hint}")
    rng = random.Random(seed)
    rows = []
    for i in range(n):
        problem = task.sample(rng)
        prompt = task.instruction(problem) if chat is True else problem.prompt
        if instruct and task.reflect != "none":
            prompt = f"{INSTRUCTIONS[task.reflect]}\n{prompt}"
        if instruction:
            prompt = f"{instruction}\n{prompt}"
        row = {"prompt": [{"role": "user", "content": prompt}] if chat else prompt, "problem": i}
        if reference is not None:
            row["reference"] = task.reference(problem, reference)
        rows.append(row)
    return rows


def _text(completion) -> str:
    if isinstance(completion, list):  # conversational: [{"role": "assistant", "content": ...}]
        return completion[-1]["content"]
    return completion


def task_rewards(spec: str, signals: Sequence[str] = (), n: int | None = None, seed: int = 0,
                 configs: dict | None = None, chat: bool | str = False) -> list[Callable]:
    """[outcome, then one reward function per signal] for rows made by task_dataset(spec, n, seed)
    (with the same `chat`: True reads completions as an instruct model writes them).
    `configs`: {"verdict": VerdictConfig(...), "confidence": ConfidenceConfig(...)}."""
    from reflectrl.signals.confidence.torch import ConfidenceConfig, confidence_terms
    from reflectrl.signals.verdict.torch import VerdictConfig, verdict_terms

    task = _task(spec, chat)
    configs = dict(configs or {})
    for name in signals:
        if name not in ("verdict", "confidence"):
            raise UserError(f"signal '{name}' has no TRL reward function; use verdict or confidence")
        need = wants(task.reflect)[0 if name == "verdict" else 1]
        if not need:
            raise UserError(f"signal '{name}' needs the task to state a {name}; add [reflect=both] to {spec!r}")
        configs.setdefault(name, VerdictConfig() if name == "verdict" else ConfidenceConfig())
        configs[name].validate()
    problems: list = []
    rng = random.Random(seed)
    judged_cache: dict = {}  # the reward functions of one batch judge the same completions: verify each once

    def lookup(index: int):
        while len(problems) <= index:  # the same stream as task_dataset's, drawn as far as needed
            problems.append(task.sample(rng))
        return problems[index]

    def judge(completion, index) -> tuple[float, list]:
        """(the verifier's score, the reflections per turn) of one completion."""
        turns = [_text(completion)]
        key = (int(index), turns[0])
        if key not in judged_cache:
            if len(judged_cache) > 4096:
                judged_cache.clear()
            p = lookup(int(index))
            judged_cache[key] = (task.score(p, turns), task.reflections(p, turns))
        return judged_cache[key]

    def coef(config, trainer_state) -> float:
        step, total = (0, 1) if trainer_state is None else (trainer_state.global_step, trainer_state.max_steps)
        return scheduled(config.coef, config.schedule, config.until, step, total)

    def outcome(prompts, completions, problem=None, **kwargs):
        return [judge(c, i)[0] for c, i in zip(completions, problem)]

    def verdict(prompts, completions, problem=None, trainer_state=None, **kwargs):
        c = coef(configs["verdict"], trainer_state)
        judged = [judge(x, i) for x, i in zip(completions, problem)]
        return [sum(verdict_terms(refl, float(score >= 1.0), c)[0]) for score, refl in judged]

    def confidence(prompts, completions, problem=None, trainer_state=None, **kwargs):
        cfg = configs["confidence"]
        c = coef(cfg, trainer_state)
        judged = [judge(x, i) for x, i in zip(completions, problem)]
        return [sum(confidence_terms(refl, float(score >= 1.0), c, cfg)[0]) for score, refl in judged]

    if n is not None:
        lookup(n - 1)
    chosen = {"verdict": verdict, "confidence": confidence}
    return [outcome] + [chosen[name] for name in signals]
