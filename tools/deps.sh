#!/usr/bin/env bash
# Installs the Debian packages the engine needs, those not installed yet:
# the compiler and make (build-essential), OpenBLAS, libpng, zlib,
# libjpeg-turbo and libwebp (img2img's JPEG and WebP pictures), libzstd
# (compressed MDS shards) and the
# Fashion-MNIST data set. Works on a machine with nothing installed: as root
# it calls apt-get directly, otherwise through sudo.
#   --tests  adds what the full test suite and `make fuzz` use: PyTorch and
#            numpy (the interoperability checks, which skip without them) and
#            clang with libFuzzer and the sanitizer runtimes.
set -euo pipefail
pkgs=(build-essential libopenblas-dev libpng-dev zlib1g-dev libjpeg62-turbo-dev libwebp-dev libzstd-dev dataset-fashion-mnist)
case "${1:-}" in
  "") ;;
  --tests) pkgs+=(python3-torch python3-numpy python3-regex python3-zstd clang-14 libclang-rt-14-dev libomp-14-dev) ;;
  *) echo "usage: tools/deps.sh [--tests]" >&2; exit 2 ;;
esac

missing=()
for p in "${pkgs[@]}"; do
  # "install ok installed" only: a removed package can leave its record behind
  [ "$(dpkg-query -W -f='${Status}' "$p" 2>/dev/null)" = "install ok installed" ] || missing+=("$p")
done
[ ${#missing[@]} -eq 0 ] && exit 0

if ! command -v apt-get > /dev/null; then
  echo "deps: no apt-get here; install the equivalents of these Debian packages: ${missing[*]}" >&2
  exit 1
fi
sudo=()
if [ "$(id -u)" -ne 0 ]; then
  if ! command -v sudo > /dev/null; then
    echo "deps: run as root (or install sudo) to install: ${missing[*]}" >&2
    exit 1
  fi
  sudo=(sudo)
fi
echo "installing: ${missing[*]}"
# env, not a plain assignment: sudo would drop it
"${sudo[@]}" env DEBIAN_FRONTEND=noninteractive apt-get update -qq
"${sudo[@]}" env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
  "${missing[@]}"
