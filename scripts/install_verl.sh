#!/usr/bin/env bash
# Install verl beside reflectrl[all] for reflectrl.integrations.verl and its tests:
#   scripts/install_verl.sh [VENV]
# verl 0.9.1 pins transformers<5.11 (and would pull a CUDA torch on some machines), while the
# adapter only needs verl's advantage-estimator registry, DataProto and its two trainers'
# advantage steps; so verl goes in without its dependencies, with TransferQueue 0.1.11 (what
# verl's default v1 trainer stores its batches in: verl's `verl-core` extra), and the few
# modules those import are installed under constraints that keep torch, numpy, transformers,
# accelerate and ray exactly as they are. Never fatal: where it does not install, the verl
# tests skip and say why.
set -uo pipefail
cd "$(dirname "$0")/.."
venv="${1:-${REFLECTRL_VENV:-.venv}}"
py="$venv/bin/python"
have() {  # verl's registry imports, and every module its v1 trainer imports is installed
  "$py" - <<'EOF' >/dev/null 2>&1
import importlib.util, sys
import verl.trainer.ppo.core_algos  # noqa: F401
sys.exit(any(importlib.util.find_spec(m) is None
             for m in ("transfer_queue", "zmq", "msgspec", "uvicorn", "fastapi", "aiohttp", "ray")))
EOF
}
if have; then
  exit 0
fi
echo "setup: installing verl 0.9.1 and TransferQueue 0.1.11 (no-deps) for reflectrl.integrations.verl"
constraints="$(mktemp)"
# packaging too: tensordict 0.10 pins pyvers<0.2, and pyvers 0.1 pins packaging<26, which would take packaging
# below what navix's setuptools-scm needs; tensordict goes in without its pins, with pyvers 0.2 (no cap),
# under which the verl adapter's tests pass
"$py" -m pip freeze 2>/dev/null | grep -i -E "^(torch|numpy|transformers|accelerate|pandas|ray|packaging)==" > "$constraints"
if "$py" -m pip --disable-pip-version-check -q install --no-deps "verl==0.9.1" "TransferQueue==0.1.11" \
     "tensordict==0.10.0" "pyvers>=0.2" 2>&1 | "$py" scripts/pip_output.py &&
   "$py" -m pip --disable-pip-version-check -q install -c "$constraints" cloudpickle importlib_metadata orjson \
     hydra-core codetiming dill pylatexenc torchdata peft datasets pybind11 pyarrow cachetools \
     pyzmq msgspec psutil "prometheus_client>=0.20" omegaconf uvicorn fastapi aiohttp 2>&1 |
     "$py" scripts/pip_output.py; then
  "$py" -c "import verl.trainer.ppo.core_algos" >/dev/null 2>&1 ||
    echo "setup: verl installed but does not import; its tests will skip" >&2
  "$py" -c "import verl.trainer.ppo.v1.trainer_base" >/dev/null 2>&1 ||
    echo "setup: verl's v1 trainer does not import; its tests will skip" >&2
else
  echo "setup: verl did not install; its tests will skip" >&2
fi
rm -f "$constraints"
exit 0
