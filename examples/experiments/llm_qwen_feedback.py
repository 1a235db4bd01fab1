"""The verdict after feedback on a Qwen-class model through TRL, on an accelerator: grpo vs
grpo+verdict vs grpo+confidence on a task whose environment answers the agent before it judges.

    # on a GPU machine whose HF cache holds the model (nothing is downloaded: HF_HUB_OFFLINE=1):
    python examples/experiments/llm_qwen_feedback.py --model Qwen/Qwen2.5-0.5B-Instruct --bf16 --steps 200 \\
        --json feedback.jsonl
    # the packaged SmolLM2-135M-Instruct (reflectrl[lm]; docs/llm.md), the model the CPU runs use, on an accelerator:
    python examples/experiments/llm_qwen_feedback.py --model smollm2-135m --bf16 --steps 200 --json smollm2.jsonl
    # another task, or the reflection on the answer itself for comparison:
    python examples/experiments/llm_qwen_feedback.py --model ... --task 'code[reflect=both;reflect_after=answer]'
    # a smoke run on a CPU with the tiny model (tests/test_llm_recipes.py):
    python examples/experiments/llm_qwen_feedback.py --model DIR --device cpu --no-chat --steps 1 --eval-problems 4

The default task, `code[reflect=both;reflect_after=feedback]`: the model writes a function
body, the task replies with the visible tests' results, and the model's next turn is its
reflection alone ("solved 0.8"), judged against the hidden tests (tasks/reflect.py). `both`
so that the verdict and the confidence entries train on the same task. Each completion is a
whole episode (examples/experiments/llm_qwen_common.py: TRL's rollout_func plays it, the feedback masked out
of the loss); everything else is examples/experiments/llm_qwen_calibration.py's recipe (fp32 weights, --bf16
autocast, the same reward functions, greedy held-out accuracy and calibration before and
after, the `..._after_feedback` metrics among them).

Where it cannot run it says so in one line and exits 2: no accelerator (unless --device cpu),
the model neither a local directory nor in the Hugging Face cache, the task's verifier unable
to run here (the code task's sandbox needs bubblewrap).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import llm_qwen_calibration as recipe  # noqa: E402
import llm_qwen_common as common  # noqa: E402

SCRIPT = "llm_qwen_feedback.py"
TASK = "code[reflect=both;reflect_after=feedback]"


def weights_present(name: str) -> bool:
    """A local model directory, or a hub name whose config is in the local HF cache."""
    if Path(name).exists():
        return True
    try:
        from huggingface_hub import try_to_load_from_cache

        return isinstance(try_to_load_from_cache(name, "config.json"), str)
    except Exception:  # an invalid repo id and the like
        return False


def precheck(a) -> None:
    """One line and exit 2 where the comparison cannot run here."""
    import random

    import torch

    from reflectrl.errors import UserError
    from reflectrl.llm.tasks import make_task
    from reflectrl.llm.tasks.base import turn_text

    if a.device != "cpu" and not torch.cuda.is_available():
        common.fail(SCRIPT, "no accelerator here (torch sees no CUDA device); this comparison is a GPU run "
                            "(a smoke run on a CPU: --device cpu with a tiny model)")
    from reflectrl.llm.model import PACKAGED_MODELS, resolve_model

    if a.model in PACKAGED_MODELS:  # e.g. smollm2-135m: converted once from its installed package
        try:
            resolve_model(a.model)
        except UserError as err:
            common.fail(SCRIPT, f"--model {a.model}: {str(err).splitlines()[0]}")
    elif not weights_present(a.model):
        common.fail(SCRIPT, f"no weights for --model {a.model}: neither a local directory nor in the Hugging Face "
                            "cache, and nothing is downloaded at run time")
    try:
        task = make_task(a.task)
        problem = task.sample(random.Random(0))
        task.score(problem, [turn_text(t) for t in task.demonstration(problem)])  # the verifier runs here
    except UserError as err:
        common.fail(SCRIPT, f"--task {a.task}: {str(err).splitlines()[0]}")


def main(argv=None) -> None:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    ap = recipe.build_parser(__doc__.splitlines()[0], TASK, "grpo,verdict,confidence")
    ap.set_defaults(max_new_tokens=64, out="bench/results/llm-qwen-feedback")
    a = ap.parse_args(argv)
    precheck(a)
    common.run_and_write(SCRIPT, lambda: recipe.run(a, SCRIPT, __file__), a.json)


if __name__ == "__main__":
    main()
