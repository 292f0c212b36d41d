#!/usr/bin/env bash
# Installs missing Debian packages, builds and runs the gmm demo (one MoE layer, three passes).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install-deps.sh
cmake --preset release
cmake --build --preset release -j "$(nproc)" --target gmm_demo
./build/release/examples/gmm_demo "$@"
