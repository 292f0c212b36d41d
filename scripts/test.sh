#!/usr/bin/env bash
# Installs missing Debian packages, builds gmm (release preset) and runs its test suite.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install-deps.sh
cmake --preset release
cmake --build --preset release -j "$(nproc)"
ctest --preset release -j "$(nproc)"
