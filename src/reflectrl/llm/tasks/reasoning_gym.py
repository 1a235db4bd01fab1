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
"""

from __future__ import annotations

import dataclasses
import difflib
import math
import random

from reflectrl.errors import UserError
from reflectrl.llm.tasks.base import Problem, Task

_DEFAULTS = {"seed": 0, "size": 10_000}


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
    return options


class ReasoningGymTask(Task):
    max_turns = 1

    def __init__(self, dataset: str, /, **config):
        import reasoning_gym

        dataset_options(dataset)  # unknown names: UserError with suggestions
        config = {**_DEFAULTS, **config}
        self.name = f"rg:{dataset}"
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
        longest = max(len(str(self.dataset[i]["answer"]).encode()) for i in range(min(self.size, 16)))
        self.max_new_tokens = max(16, longest + 8)

    def sample(self, rng: random.Random) -> Problem:
        entry = self.dataset[rng.randrange(self.size)]
        return Problem(prompt=entry["question"].rstrip() + "\n", answer=entry["answer"], meta={"entry": entry})

    def score(self, problem: Problem, turns: list[str]) -> float:
        if not turns:
            return 0.0
        try:  # a verifier fed arbitrary model output may raise; that answer is simply wrong
            reward = float(self.dataset.score_answer(turns[-1].strip(), problem.meta["entry"]))
        except Exception:  # noqa: BLE001
            return 0.0
        return 0.0 if math.isnan(reward) else min(1.0, max(0.0, reward))

    def demonstration(self, problem: Problem) -> list[str]:
        if problem.answer is None:
            raise UserError(f"task {self.name} has no reference answer for this entry, so it cannot be "
                            "demonstrated (SFT); use an RL-only run or another dataset")
        return [str(problem.answer)]

    def wrong_turns(self, problem: Problem, rng: random.Random) -> list[str] | None:
        """An integer answer off by 1..10 (scored wrong by the dataset's verifier); None for other answers."""
        try:
            value = int(str(problem.answer).strip())
        except ValueError:
            return None
        wrong = [str(value + rng.choice((-1, 1)) * rng.randint(1, 10))]
        return wrong if self.score(problem, wrong) < 1.0 else None
