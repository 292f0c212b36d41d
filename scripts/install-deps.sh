#!/usr/bin/env bash
# Installs the Debian packages gmm builds, tests and benchmarks with (only those missing).
set -euo pipefail
want=(cmake g++ make libeigen3-dev libfmt-dev libgtest-dev libbenchmark-dev)
if [[ "${1:-}" == "--bench" ]]; then want+=(libopenblas-dev libdnnl-dev gnuplot-nox); fi
missing=()
for p in "${want[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  echo "installing: ${missing[*]}"
  sudo_cmd=""; [[ $(id -u) -eq 0 ]] || sudo_cmd="sudo"
  $sudo_cmd apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo_cmd apt-get install -y -qq "${missing[@]}"
fi
