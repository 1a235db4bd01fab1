"""`reflectrl llm ...`: language-model agents.

    reflectrl llm init-tiny --out DIR [--arch llama|qwen2] [--hidden-size 64] [--layers 2]
    reflectrl llm model [NAME]       (a packaged pretrained model, e.g. smollm2-135m: its cached directory)
    reflectrl llm sft --model DIR --task T --steps N --out DIR [--batch-size 32] [--lr 1e-3]
    reflectrl llm train --algo grpo|gear|refgrpo --task T --model DIR --steps N --seed N --out DIR [--set k=v ...]
    reflectrl llm train --resume DIR
    reflectrl llm eval --model DIR --task T [--problems 64] [--json] [--reliability PNG] [--temperature 1 --seed 0]

Wired into `reflectrl.cli` by `add_parser(sub)` and `run(args)`; torch and transformers are
imported only when a command runs. A command module, above the LLM pieces (llm/) and the GRPO trainer
(trainers/grpo/) it drives.
"""

from __future__ import annotations

import argparse

from reflectrl.errors import UserError

MODEL_HELP = "model directory, a packaged model (smollm2-135m: 'reflectrl llm model') or a Hugging Face name"


def add_parser(subparsers) -> argparse.ArgumentParser:
    from reflectrl.lazyhelp import LazyHelp
    from reflectrl.registry import algo_names
    from reflectrl.trainers.grpo.config import LLMRunConfig

    def default_of(where: str, name: str, text: str = "") -> LazyHelp:
        """'TEXT(default D)', D read from the keyword defaults of `where` ("module:function") when
        help is printed: the functions live in modules that import torch."""
        def make():
            import importlib

            module, _, function = where.partition(":")
            return f"{text}(default {_defaults(getattr(importlib.import_module(module), function))[name]})"

        return LazyHelp(text or "(default ...)", make)

    def tiny_default(name: str, text: str = "") -> LazyHelp:
        return default_of("reflectrl.llm.model:init_tiny", name, text)

    def sft_default(name: str, text: str = "") -> LazyHelp:
        return default_of("reflectrl.llm.sft:sft", name, text)

    d = LLMRunConfig()  # help shows the dataclass's defaults; the options pass "not given" through
    llm = subparsers.add_parser("llm", help="language-model agents: tiny model, SFT, GRPO / GEAR / refgrpo")
    sub = llm.add_subparsers(dest="llm_command", metavar="{init-tiny,model,sft,train,eval}", required=True)

    tiny = sub.add_parser("init-tiny", help="write a tiny random causal LM and its tokenizer (no download)")
    tiny.add_argument("--out", required=True, help="model directory to create")
    tiny.add_argument("--task", action="append", default=None, metavar="SPEC",
                      help="train the tokenizer on this task's demonstrations too (repeatable), e.g. "
                           "'arith[reflect=both]' or rag")
    tiny.add_argument("--arch", default=None, help=tiny_default("arch", "llama or qwen2 "))
    for flag, name in (("--hidden-size", "hidden_size"), ("--layers", "layers"), ("--heads", "heads"),
                       ("--vocab-size", "vocab_size"), ("--seed", "seed")):
        tiny.add_argument(flag, type=int, default=None, help=tiny_default(name))

    packaged = sub.add_parser("model", help="a packaged pretrained model (e.g. smollm2-135m): convert it once "
                              "from its installed package and print its model directory; no name: list them")
    packaged.add_argument("name", nargs="?", default=None, help="e.g. smollm2-135m; --model takes the same name")

    sft = sub.add_parser("sft", help="warm-start a model on a task's demonstrations")
    sft.add_argument("--model", required=True, help=MODEL_HELP)
    sft.add_argument("--task", required=True, help="arith, rg:NAME, code, tools or rag")
    sft.add_argument("--steps", type=int, required=True, help="optimisation steps (batches of demonstrations)")
    sft.add_argument("--out", required=True, help="model directory to create")
    sft.add_argument("--batch-size", type=int, default=None, help=sft_default("batch_size"))
    sft.add_argument("--lr", type=float, default=None, help=sft_default("learning_rate"))
    sft.add_argument("--seed", type=int, default=None, help=sft_default("seed"))
    sft.add_argument("--device", default=None, help="auto (cuda where available), cpu, cuda or cuda:N "
                     f"(default {d.device}, as for llm train)")
    sft.add_argument("--reference-share", type=float, default=None,
                     help=sft_default("reference_share", "share of examples that read the task's reference after "
                                      "the prompt (in context, not learned), so the model can serve as the "
                                      "divergence signal's teacher "))
    sft.add_argument("--no-progress", action="store_true", help="no progress bar")

    train = sub.add_parser("train", help="RL on a task: grpo, grpo+gear (GEAR weights), "
                                         "grpo+calibration (turn calibration bonus), grpo+verdict (stated "
                                         "verdict bonus), grpo+confidence (scored stated confidence)")
    train.add_argument("--algo", default=None, help=LazyHelp(
        "TRAINER[+SIGNAL...]", lambda: f"TRAINER[+SIGNAL...]: {', '.join(algo_names('llm'))} (default {d.algo}); "
        "knobs may follow a part in brackets: grpo+gear[top_frac=0.5]. "
        "The papers' methods: grpo+verdict (RefGRPO's verbal verdict), grpo+divergence (GEAR's segments), "
        "grpo+confidence (RLCR); the seeds' forms: refgrpo = grpo+calibration (seed 000's calibration bonus, "
        "not the RefGRPO paper's method), gear = grpo+gear (seed 003's value head)"))
    train.add_argument("--task", default=None, help=f"arith, rg:NAME, code, tools or rag (default {d.task})")
    train.add_argument("--model", default=None, help=MODEL_HELP)
    train.add_argument("--steps", type=int, default=None, help=f"GRPO steps (default {d.steps})")
    train.add_argument("--seed", type=int, default=None, help=f"random seed (default {d.seed})")
    train.add_argument("--out", default=None, help="run directory to create")
    train.add_argument("--device", default=None, help=f"auto (cuda where available), cpu, cuda or cuda:N "
                       f"(default {d.device}); precision=bf16 and gradient_checkpointing=true go in --set")
    train.add_argument("--set", action="append", nargs="+", metavar="KEY=VALUE",
                       help="override a knob, e.g. --set group_size=8 loss_type=dapo gear.top_frac=0.5")
    train.add_argument("--resume", metavar="DIR", default=None, help="continue the interrupted run in DIR")
    train.add_argument("--no-progress", action="store_true", help="no progress bar")

    ev = sub.add_parser("eval", help="greedy accuracy of a model on a task's held-out problems")
    ev.add_argument("--model", required=True,
                    help="model directory, a run directory (its DIR/model is used), a packaged model "
                         "(smollm2-135m) or HF name")
    ev.add_argument("--task", required=True, help="arith, rg:NAME, code, tools or rag, with options in brackets "
                    "(e.g. arith[max_operand=9;ops=+-*]); as given to llm train")
    ev.add_argument("--problems", type=int, default=64, help="held-out problems to score (default 64)")
    ev.add_argument("--temperature", type=float, default=0.0,
                    help="0 (default): greedy; > 0: sample at this temperature (seeded by --seed), e.g. 1 to "
                         "measure calibration on the distribution GRPO trains on")
    ev.add_argument("--seed", type=int, default=0, help="the sampling seed with --temperature (default 0)")
    ev.add_argument("--json", action="store_true", help="print one JSON object (with the calibration metrics of "
                    "the stated reflections, also split before/after the environment's feedback, e.g. "
                    "reflection_accuracy_after_feedback: null where the task states none)")
    ev.add_argument("--reliability", metavar="PNG", default=None,
                    help="write a reliability diagram of the stated confidences (a task with reflect=...)")
    return llm


def run(args) -> int:
    command = args.llm_command
    if command == "init-tiny":
        from reflectrl.llm.model import init_tiny

        _check_out(args.out)
        if args.task:
            from reflectrl.llm.model import CORPUS_TASKS
            from reflectrl.llm.tasks import make_task

            for spec in args.task:
                make_task(spec)  # a bad spec fails here, in one line
        path = init_tiny(args.out, **_given(arch=args.arch, hidden_size=args.hidden_size, layers=args.layers,
                                            heads=args.heads, vocab_size=args.vocab_size, seed=args.seed,
                                            corpus_tasks=CORPUS_TASKS + tuple(args.task) if args.task else None))
        print(f"tiny model: {path}")
        return 0
    if command == "model":
        return _packaged(args.name)
    if command == "sft":
        return _sft(args)
    if command == "train":
        return _train_resume(args) if args.resume else _train_new(args)
    if command == "eval":
        return _eval(args)
    raise UserError(f"unknown llm command {command}")


def _packaged(name: str | None) -> int:
    import difflib

    from reflectrl.llm.model import PACKAGED_MODELS, packaged_model_dir

    if name is None:
        for short, model in PACKAGED_MODELS.items():
            print(f"{short}: {model.description}; from the package {model.distribution} "
                  f"({model.install_hint()})")
        return 0
    if name not in PACKAGED_MODELS:
        close = difflib.get_close_matches(name, list(PACKAGED_MODELS), n=1)
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        raise UserError(f"llm model {name}: not a packaged model{hint}; packaged: {', '.join(PACKAGED_MODELS)}")
    print(packaged_model_dir(name))
    return 0


def _defaults(fn) -> dict:
    """A function's keyword defaults: the one place the CLI's help reads them from."""
    import inspect

    return {k: p.default for k, p in inspect.signature(fn).parameters.items()
            if p.default is not inspect.Parameter.empty}


def _given(**options) -> dict:
    """Only the options given on the command line: the rest take the function's defaults."""
    return {k: v for k, v in options.items() if v is not None}


def _check_out(out: str) -> None:
    """A model --out must be a new or empty directory we can create."""
    from pathlib import Path

    from reflectrl.runs.rundir import make_dir

    path = Path(out)
    if path.exists() and (not path.is_dir() or any(path.iterdir())):
        raise UserError(f"{out} exists and is not an empty directory; choose a new --out directory")
    existed = path.exists()
    make_dir(path)  # fails here, in one line, where --out cannot be created
    if not existed:
        path.rmdir()


def _sft(args) -> int:
    from reflectrl.llm.model import load_model
    from reflectrl.llm.sft import sft
    from reflectrl.llm.tasks import make_task
    from reflectrl.trainers.grpo.config import LLMRunConfig, check_device

    task = make_task(args.task)
    _check_out(args.out)
    model, tokenizer = load_model(args.model)
    from reflectrl.trainers.grpo.trainer import resolve_device

    device = args.device or LLMRunConfig.device  # the same default as llm train's
    check_device(device)
    from reflectrl.torch_setup import optimizers_without_dynamo

    optimizers_without_dynamo()  # 2.5 s of start-up that only a compiler needs (torch_setup.py)
    args.device = str(resolve_device(device, "fp32")[0])
    result = sft(model, tokenizer, task, steps=args.steps, out=args.out, progress=not args.no_progress,
                 **_given(batch_size=args.batch_size, learning_rate=args.lr, seed=args.seed,
                          reference_share=args.reference_share, device=args.device))
    print(f"sft on {args.task}: {result['steps']} steps, final loss {result['final_loss']:.4f}, "
          f"{result['seconds']:.0f}s; model: {args.out}")
    return 0


def _config(args):
    from reflectrl.llm.tasks import make_task
    from reflectrl.trainers.grpo.config import new_llm_config

    cfg = new_llm_config(algo=args.algo, task=args.task, model=args.model, steps=args.steps, seed=args.seed,
                         device=args.device, sets=[item for group in (args.set or []) for item in group])
    make_task(cfg.task)  # a bad task spec fails here, before a run directory exists
    return cfg


def _trainer(cfg, model, tokenizer, run):
    """The LLM trainer --algo names (the registry's), built for a resolved config."""
    from reflectrl.registry import parse_algo, trainer_class
    from reflectrl.torch_setup import optimizers_without_dynamo

    optimizers_without_dynamo()  # 2.5 s of start-up that only a compiler needs (torch_setup.py)

    return trainer_class(parse_algo(cfg.algo, "llm").trainer)(cfg, model, tokenizer, run)


def _train_new(args) -> int:
    if args.out is None:
        raise UserError("llm train needs --out DIR (a new run directory), or --resume DIR to continue a run")
    cfg = _config(args)
    from reflectrl.llm.model import load_model  # (after the checks: these import torch)
    from reflectrl.runs.session import train_new_run

    model, tokenizer = load_model(cfg.model)
    return train_new_run(args.out, cfg.to_dict(), lambda run: _trainer(cfg, model, tokenizer, run), _finish,
                         progress=not args.no_progress, resume_command="reflectrl llm train")


def _train_resume(args) -> int:
    from reflectrl.llm.model import load_model
    from reflectrl.runs.session import resume_run
    from reflectrl.trainers.grpo.config import LLMRunConfig

    def build(run):
        cfg = LLMRunConfig.from_dict(run.config())
        model, tokenizer = load_model(cfg.model)  # the reference policy is the starting model
        return _trainer(cfg, model, tokenizer, run)

    given = [("--algo", args.algo), ("--task", args.task), ("--model", args.model), ("--steps", args.steps),
             ("--seed", args.seed), ("--out", args.out), ("--set", args.set), ("--device", args.device)]
    return resume_run(args.resume, given, "llm", build, _finish, progress=not args.no_progress,
                      resume_command="reflectrl llm train")


def _finish(trainer, run) -> None:
    from reflectrl.registry import finish_signals
    from reflectrl.runs.rundir import atomic_dir

    model_dir = run.path / "model"
    with atomic_dir(model_dir) as tmp:
        trainer.save_model(tmp)
    result = trainer.evaluate() if trainer.eval_set else {}
    if trainer.last_eval is not None:  # the stated reflections' calibration on the held-out set
        from reflectrl.llm.calibration import calibration_metrics, plot_reliability
        from reflectrl.runs.rundir import atomic_write_bytes

        metrics = calibration_metrics(*trainer.last_eval)
        from reflectrl.runs.jsonfile import dumps

        atomic_write_bytes(run.path / "calibration.json", (dumps(metrics, indent=1) + "\n").encode())
        plot_reliability(*trainer.last_eval, run.path / "reliability.png",
                         title=f"{trainer.cfg.algo} on {trainer.cfg.task}")
    from reflectrl.trainers.policies import params_sha256

    run.set_status("finished", step=trainer.step, params_sha256=params_sha256(trainer.model), **result)
    finish_signals(trainer.cfg.algo, "llm", run.path)
    acc = f", held-out greedy accuracy {result['eval_accuracy']:.3f}" if result else ""
    print(f"finished {trainer.cfg.algo} on {trainer.cfg.task}: {trainer.step} steps{acc}; run: {run.path} "
          f"(policy: {model_dir})")


def _eval(args) -> int:
    import random

    import torch

    from reflectrl.llm.calibration import calibration_metrics, plot_reliability, relevance_metrics
    from reflectrl.llm.chat import speak
    from reflectrl.llm.model import load_model
    from reflectrl.llm.tasks import make_task
    from reflectrl.trainers.grpo.trainer import EVAL_SEED, rollout

    if args.problems < 1:
        raise UserError(f"--problems {args.problems}: must be a positive integer")
    if args.reliability:
        from reflectrl.outputs import check_writable

        check_writable(args.reliability, "--reliability")  # before the rollouts, not after them
    task = make_task(args.task)
    model, tokenizer = load_model(args.model)
    speak(task, tokenizer)  # a chat model's instruct form and budget (llm/chat.py), before max_new_tokens is read
    rng = random.Random(EVAL_SEED)
    problems = [task.sample(rng) for _ in range(args.problems)]
    if not args.temperature >= 0 or args.temperature == float("inf"):
        raise UserError(f"--temperature {args.temperature}: must be a finite number >= 0 (0: greedy)")
    torch.manual_seed(args.seed)
    episodes = rollout(model.eval(), tokenizer, task, problems, max_new_tokens=task.max_new_tokens,
                       greedy=args.temperature == 0, temperature=args.temperature or 1.0)
    rewards = task.score_batch(problems, episodes.turns)
    correct = [r >= 1.0 for r in rewards]
    finals = episodes.final_reflections(task)
    result = {"task": args.task, "model": args.model, "checkpoint_step": getattr(model, "checkpoint_step", None),
              "problems": len(problems), "temperature": args.temperature,
              "reward": sum(rewards) / len(rewards), **calibration_metrics(correct, finals),
              **relevance_metrics(task, problems, episodes.turns, episodes.reflections), "reliability_png": None}
    if args.reliability:
        if task.reflect == "none":
            raise UserError(f"--reliability: task {args.task!r} states no confidence; add [reflect=confidence] "
                            "(or verdict, both) to the task")
        result["reliability_png"] = str(plot_reliability(correct, finals, args.reliability, title=args.task))
    if args.json:
        from reflectrl.runs.jsonfile import dumps

        print(dumps(result))  # strict JSON: a NaN metric as "NaN"
    else:
        how = "greedy" if args.temperature == 0 else f"sampled (temperature {args.temperature:g})"
        print(f"{args.task}: {how} accuracy {result['accuracy']:.3f}, mean reward {result['reward']:.3f} "
              f"over {len(problems)} held-out problems")
        if task.reflect != "none":
            shown = {k: result[k] for k in ("reflection_format_rate", "reflection_accuracy", "under_confidence_rate",
                                            "over_confidence_rate", "ece", "brier", "auroc", "selective_auc")}
            print("  " + ", ".join(f"{k} {'n/a' if v is None else f'{v:.3f}'}" for k, v in shown.items()))
            from reflectrl.llm.calibration import FEEDBACK_KEYS

            split = {k: result[k] for k in FEEDBACK_KEYS if result[k] is not None}
            if split:  # where the reflections were stated: before or after the environment's feedback
                print("  " + ", ".join(f"{k} {v:.3f}" for k, v in split.items()))
    return 0
