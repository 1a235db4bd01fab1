"""Set-up as a newcomer meets it: the install commands our errors name work, and scripts/setup.sh's
output does not read as a failure when it succeeded."""

import importlib.util
import re
import sys
from pathlib import Path

import pytest

from reflectrl.envs import jax_ids
from reflectrl.errors import UserError

ROOT = Path(__file__).resolve().parents[1]


def _pip_output():
    spec = importlib.util.spec_from_file_location("pip_output", ROOT / "scripts" / "pip_output.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


RESOLVER = ("ERROR: pip's dependency resolver does not currently take into account all the packages that are "
            "installed. This behaviour is the source of the following dependency conflicts.")
VERL = "verl 0.9.1 requires transformers<5.11, but you have transformers 5.25.0 which is incompatible."
GYMNAX = "gymnax 1.0.1 requires gymnasium<1.4,>=1.1, but you have gymnasium 1.4.0 which is incompatible."


def test_the_expected_conflict_report_becomes_one_line_of_ours():
    out = _pip_output().filter_lines([
        "WARNING: Location 'file:///opt/pypi-more/simple/x/' is ignored: it is neither a file nor a directory.",
        RESOLVER, VERL, GYMNAX, "Successfully installed reflectrl-0.1.0"])
    assert not any(line.startswith("ERROR") or "WARNING: Location" in line for line in out), out
    assert out[0] == "Successfully installed reflectrl-0.1.0"
    assert len(out) == 2 and out[1].startswith("setup: pip's conflict report about verl, gymnax is expected")


def test_a_conflict_about_any_other_package_is_passed_through_with_its_error_line():
    other = "foo 1.0 requires bar<2, but you have bar 3.0 which is incompatible."
    out = _pip_output().filter_lines([RESOLVER, VERL, other, "done"])
    assert out[:2] == [RESOLVER, other] and "done" in out
    assert "verl" in out[-1] and VERL not in out


def test_output_without_a_conflict_report_is_unchanged():
    lines = ["Collecting x", "x requires y, but you have y 2 which is incompatible.", "done"]
    assert _pip_output().filter_lines(lines) == lines  # no resolver header: nothing is taken for its report


def test_a_missing_gymnax_names_the_install_that_works(monkeypatch):
    """`pip install 'reflectrl[jax]'` alone cannot install gymnax (it pins gymnasium<1.4): the error names
    the --no-deps install that scripts/setup.sh itself runs, so following it gives a working gymnax."""
    pytest.importorskip("jax")
    from reflectrl.envs import jax_envs

    monkeypatch.setitem(sys.modules, "gymnax", None)  # an import of it fails, as where it is not installed
    monkeypatch.setattr(jax_envs, "_MADE", {})
    with pytest.raises(UserError) as err:
        jax_envs.make_env("gymnax:CartPole-v1")
    message = str(err.value)
    assert jax_ids.GYMNAX_INSTALL in message and jax_ids.JAX_INSTALL in message
    setup = (ROOT / "scripts" / "setup.sh").read_text()
    spec = re.search(r'install --no-deps "(gymnax[^"]*)"', setup).group(1)
    assert jax_ids.GYMNAX_INSTALL == f"pip install --no-deps '{spec}'"


def test_a_torch_run_of_a_gymnax_id_names_both_installs():
    with pytest.raises(UserError, match=re.escape(jax_ids.GYMNAX_INSTALL)):
        jax_ids.check_jax_env_id("gymnax:CartPole-v1", "torch")
    with pytest.raises(UserError) as err:
        jax_ids.check_jax_env_id("navix:Navix-Empty-5x5-v0", "torch")
    assert "gymnax" not in str(err.value)
