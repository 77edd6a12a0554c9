#!/usr/bin/env bash
# Builds and runs the test suite, installing what is missing first
# (tools/deps.sh), so it works on a machine with nothing installed. The
# PyTorch interoperability checks skip, saying so, unless python3-torch is
# there (`bash tools/deps.sh --tests` installs it, and clang for `make fuzz`).
set -euo pipefail
cd "$(dirname "$0")/.."
bash tools/deps.sh
make -j"$(nproc)" test
