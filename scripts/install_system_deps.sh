#!/usr/bin/env bash
# Install the system packages reflectrl needs beyond pip:
#   bubblewrap (`bwrap`)  contains model-generated code (reflectrl.llm.sandbox)
#   chromium              renders the HTML report in the report test (headless)
#   scripts/install_system_deps.sh
# Idempotent: installs only what is missing. Uses apt-get (Debian/Ubuntu), as root or through
# sudo; elsewhere, or without either, it says what to install and exits 0 so that setup
# scripts and CI can call it unconditionally (the features that need a missing package then
# fail with a clear message, and their tests say why).
set -euo pipefail

missing=()
command -v bwrap >/dev/null 2>&1 || missing+=(bubblewrap)
command -v chromium >/dev/null 2>&1 || missing+=(chromium)
if [ ${#missing[@]} -eq 0 ]; then
  exit 0
fi

if ! command -v apt-get >/dev/null 2>&1; then
  echo "install_system_deps: no apt-get here; install ${missing[*]} with your package manager; skipping" >&2
  exit 0
fi

if [ "$(id -u)" -eq 0 ]; then
  as_root=()
elif command -v sudo >/dev/null 2>&1 && sudo -n true 2>/dev/null; then
  as_root=(sudo -n)
else
  echo "install_system_deps: ${missing[*]} missing and this is neither root nor passwordless sudo;" \
       "skipping (run: sudo apt-get install ${missing[*]})" >&2
  exit 0
fi

echo "install_system_deps: installing ${missing[*]} with apt-get (about a minute)"
export DEBIAN_FRONTEND=noninteractive
${as_root[@]+"${as_root[@]}"} apt-get update -qq >/dev/null \
  || echo "install_system_deps: apt-get update failed; trying the cached package lists" >&2
${as_root[@]+"${as_root[@]}"} apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
command -v bwrap >/dev/null 2>&1 || { echo "install_system_deps: bubblewrap installed but bwrap not on PATH" >&2; exit 1; }
