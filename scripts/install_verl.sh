#!/usr/bin/env bash
# Install verl beside reflectrl[all] for reflectrl.integrations.verl and its tests:
#   scripts/install_verl.sh [VENV]
# verl 0.9.1 pins transformers<5.11 (and would pull a CUDA torch on some machines), while the
# adapter only needs verl's advantage-estimator registry and DataProto; so verl goes in without
# its dependencies, and the few it imports for those are installed under constraints that keep
# torch, numpy, transformers and accelerate exactly as they are. Never fatal: where it does not
# install, the verl tests skip and say why.
set -uo pipefail
cd "$(dirname "$0")/.."
venv="${1:-${REFLECTRL_VENV:-.venv}}"
py="$venv/bin/python"
if "$py" -c "import verl.trainer.ppo.core_algos" >/dev/null 2>&1; then
  exit 0
fi
echo "setup: installing verl (no-deps) for reflectrl.integrations.verl"
constraints="$(mktemp)"
"$py" -m pip freeze 2>/dev/null | grep -i -E "^(torch|numpy|transformers|accelerate|pandas)==" > "$constraints"
if "$py" -m pip --disable-pip-version-check -q install --no-deps "verl==0.9.1" &&
   "$py" -m pip --disable-pip-version-check -q install -c "$constraints" "tensordict>=0.8,<=0.10.0,!=0.9.0" \
     hydra-core codetiming dill pylatexenc torchdata peft datasets pybind11 pyarrow cachetools 2>&1 |
     grep -v -E "^WARNING: Location .* is ignored"; then
  "$py" -c "import verl.trainer.ppo.core_algos" >/dev/null 2>&1 ||
    echo "setup: verl installed but does not import; its tests will skip" >&2
else
  echo "setup: verl did not install; its tests will skip" >&2
fi
rm -f "$constraints"
exit 0
