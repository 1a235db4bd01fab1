"""Language models: load any Hugging Face causal LM, or build a tiny one that trains on a CPU.

`init_tiny` makes an ordinary HF model directory (config, weights, tokenizer) with no
download: a byte-level BPE tokenizer trained with the `tokenizers` library on text the
tasks generate, and a randomly initialised Llama- or Qwen2-style decoder of a few layers.
`load_model` reads any causal LM by local path (or hub name, when the user's machine may
download) and prepares its tokenizer for batched generation (left padding, a pad token).
"""

from __future__ import annotations

import os
import random
from pathlib import Path

import torch

from reflectrl.errors import UserError
from reflectrl.runs.rundir import atomic_dir

ARCHS = ("llama", "qwen2")
EOS = "<|eos|>"
PAD = "<|pad|>"
MIN_VOCAB = 256 + 2  # every byte, and PAD and EOS
# a reasoning-gym task short enough for the tiny model (prompts of ~17 characters)
RG_SHORT = ("rg:basic_arithmetic[min_terms=2;max_terms=2;max_digits=1;operators=+,-;"
            "allow_parentheses=false;allow_negation=false]")
# the tokenizer learns merges on what the tasks look like, so short prompts stay short
CORPUS_TASKS = ("arith", "tools", "code", "rg:basic_arithmetic",
                RG_SHORT)


def _corpus(tasks=CORPUS_TASKS, per_task: int = 400, seed: int = 0) -> list[str]:
    from reflectrl.llm.tasks import make_task
    from reflectrl.llm.tasks.base import turn_text

    rng = random.Random(seed)
    lines = []
    for spec in tasks:
        try:
            task = make_task(spec)
        except Exception:  # an optional task that cannot be built here (e.g. no reasoning-gym): skip it
            continue
        for _ in range(per_task):
            problem = task.sample(rng)
            text, turns = problem.prompt, []
            for turn in task.demonstration(problem):
                turns.append(turn_text(turn))
                text += turns[-1] + "\n"
                reply = task.respond(problem, turns)
                if reply:
                    text += reply
            lines.append(text)
    return lines


def build_tokenizer(vocab_size: int = 512, tasks=CORPUS_TASKS):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    # byte-level: every string is encodable, whatever a model or a tool writes
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=[PAD, EOS],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(_corpus(tasks), trainer=trainer)
    return PreTrainedTokenizerFast(tokenizer_object=tok, eos_token=EOS, pad_token=PAD, padding_side="left")


def init_tiny(out: str | os.PathLike, *, arch: str = "llama", hidden_size: int = 64, layers: int = 2,
              heads: int = 4, intermediate_size: int = 256, vocab_size: int = 512, max_positions: int = 512,
              seed: int = 0, corpus_tasks: tuple[str, ...] | None = None) -> Path:
    """Write a tiny, randomly initialised causal LM and its tokenizer to `out`; the tokenizer's
    merges are learnt on the demonstrations of `corpus_tasks` (default CORPUS_TASKS)."""
    import transformers

    transformers.utils.logging.disable_progress_bar()
    if arch not in ARCHS:
        raise UserError(f"--arch {arch}: use one of {', '.join(ARCHS)}")
    for flag, value in (("--hidden-size", hidden_size), ("--layers", layers), ("--heads", heads),
                        ("intermediate_size", intermediate_size), ("max_positions", max_positions)):
        if value < 1:
            raise UserError(f"{flag} {value}: must be a positive integer")
    if vocab_size < MIN_VOCAB:
        raise UserError(f"--vocab-size {vocab_size}: the byte-level tokenizer needs at least {MIN_VOCAB} entries "
                        f"(256 bytes and {MIN_VOCAB - 256} special tokens); give {MIN_VOCAB} or more")
    if hidden_size % heads:
        raise UserError(f"--hidden-size {hidden_size} must be a multiple of --heads {heads}")
    out = Path(out)
    if out.exists() and any(out.iterdir()):
        raise UserError(f"{out} exists and is not empty; choose a new --out directory")
    tokenizer = build_tokenizer(vocab_size, tasks=corpus_tasks or CORPUS_TASKS)
    common = dict(vocab_size=len(tokenizer), hidden_size=hidden_size, num_hidden_layers=layers,
                  num_attention_heads=heads, num_key_value_heads=heads, intermediate_size=intermediate_size,
                  max_position_embeddings=max_positions, eos_token_id=tokenizer.eos_token_id,
                  pad_token_id=tokenizer.pad_token_id, bos_token_id=None, tie_word_embeddings=True)
    config = (transformers.LlamaConfig(**common) if arch == "llama" else transformers.Qwen2Config(**common))
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = transformers.AutoModelForCausalLM.from_config(config)
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    with atomic_dir(out) as tmp:  # a crash leaves no half-written model at `out`
        model.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
    return out


def load_model(name_or_path: str, *, dtype: torch.dtype = torch.float32, device: str | torch.device = "cpu"):
    """(model, tokenizer) of a causal LM, the tokenizer set up for left-padded batches."""
    import transformers

    local = Path(name_or_path)
    if (local / "run.json").is_file():
        # a run directory (`llm train --out`): its policy is saved in DIR/model when the run finishes
        from reflectrl.runs.rundir import RunDir

        run = RunDir.open(local, kind="llm")  # an env run: one line naming the commands that take it
        if not (local / "model" / "config.json").is_file():
            # an unfinished run: its policy is the last checkpoint's weights on its starting model
            return _load_checkpoint_policy(run, name_or_path, dtype=dtype, device=device)
        local = local / "model"
        name_or_path = str(local)
    if not local.exists() and (name_or_path.startswith((".", "/")) or os.sep in name_or_path.strip("/")
                               and len(name_or_path.split("/")) != 2):
        raise UserError(f"--model {name_or_path}: no such directory "
                        "(make one with 'reflectrl llm init-tiny --out DIR')")
    if local.exists() and not (local / "config.json").exists():
        raise UserError(f"--model {name_or_path}: not a Hugging Face model directory (no config.json)")
    transformers.logging.set_verbosity_error()
    transformers.utils.logging.disable_progress_bar()
    try:  # the hub client logs every retry of an unreachable server; the one-line error below says it all
        import huggingface_hub

        huggingface_hub.utils.logging.set_verbosity_error()
    except ImportError:
        pass
    if not local.exists():
        _check_hub_reachable(name_or_path)
    try:
        tokenizer = transformers.AutoTokenizer.from_pretrained(name_or_path)
        model = transformers.AutoModelForCausalLM.from_pretrained(name_or_path, dtype=dtype)
    except (OSError, ValueError) as err:
        first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        raise UserError(f"--model {name_or_path}: cannot load it as a causal LM ({first})") from None
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    tokenizer.padding_side = "left"
    if tokenizer.eos_token_id is None:
        raise UserError(f"--model {name_or_path}: its tokenizer has no eos token, which ends every agent turn")
    model.to(device)
    return model, tokenizer


def _load_checkpoint_policy(run, name: str, *, dtype, device):
    """(model, tokenizer) of an unfinished run: the model it started from, with the weights of
    its last checkpoint; says so on stderr (DIR/model appears only once a run finishes)."""
    import sys

    saved = run.config()  # the run's config.json: the model it started from, and its budget
    if not isinstance(saved, dict) or not isinstance(saved.get("model"), str):
        raise UserError(f"--model {name}: its config.json names no starting model; was it written by "
                        "'reflectrl llm train'?")
    if not run.has_checkpoint():
        raise UserError(f"--model {name} is a run directory without a saved policy or a checkpoint; "
                        f"continue it with 'reflectrl llm train --resume {name}' or pass a model directory")
    state = run.load_checkpoint()
    model, tokenizer = load_model(saved["model"], dtype=dtype, device="cpu")
    try:
        model.load_state_dict(state["model"])
    except (KeyError, RuntimeError) as err:
        first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        raise UserError(f"--model {name}: its checkpoint does not fit its starting model {saved['model']} ({first}); "
                        "was that model directory changed since the run started?") from None
    model.to(device)
    model.checkpoint_step = int(state["step"])  # what `llm eval --json` reports as checkpoint_step
    print(f"reflectrl: note: {name} is unfinished (status '{run.status().get('status', '?')}'): using the policy of "
          f"its last checkpoint, step {state['step']} of {saved.get('steps', '?')}", file=sys.stderr)
    return model, tokenizer


HUB_HOST = ("huggingface.co", 443)
HUB_PROBE_SECONDS = 3.0


def _hub_reachable(host: tuple[str, int] = HUB_HOST, timeout: float = HUB_PROBE_SECONDS) -> bool:
    """One quick TCP probe of the hub (name resolution included, bounded by `timeout`)."""
    import socket
    import threading

    result = []

    def probe():
        try:
            with socket.create_connection(host, timeout=timeout):
                result.append(True)
        except OSError:
            result.append(False)

    thread = threading.Thread(target=probe, daemon=True)  # getaddrinfo ignores socket timeouts
    thread.start()
    thread.join(timeout)
    return bool(result and result[0])


def _check_hub_reachable(name: str) -> None:
    """Fail in seconds, not after the hub client's minute of retries, when `name` would need a
    download that cannot happen. A model already in the local HF cache still loads offline."""
    offline = os.environ.get("HF_HUB_OFFLINE", "").lower() in ("1", "true", "yes", "on")
    try:
        from huggingface_hub import try_to_load_from_cache

        cached = isinstance(try_to_load_from_cache(name, "config.json"), str)
    except Exception:  # an invalid repo id and the like: let from_pretrained say what is wrong
        cached = False
    if cached:
        return
    if offline or not _hub_reachable():
        why = "HF_HUB_OFFLINE is set" if offline else "the Hugging Face hub cannot be reached from here"
        raise UserError(f"--model {name}: no such local directory, and {why}; pass a model directory "
                        "(make a tiny one with 'reflectrl llm init-tiny --out DIR')")


def hidden_size(model) -> int:
    return int(model.config.get_text_config().hidden_size)
