#!/usr/bin/env bash
# Finds the Debian packages the engine needs and installs the missing ones.
# --tests adds what the test suite's PyTorch checks use.
set -euo pipefail
pkgs=(build-essential libopenblas-dev libpng-dev zlib1g-dev dataset-fashion-mnist)
[ "${1:-}" = "--tests" ] && pkgs+=(python3-torch python3-numpy)
missing=()
for p in "${pkgs[@]}"; do
  dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p")
done
[ ${#missing[@]} -eq 0 ] && exit 0
echo "installing: ${missing[*]}"
sudo=""
[ "$(id -u)" -ne 0 ] && sudo="sudo"
$sudo apt-get update -qq
DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}"
