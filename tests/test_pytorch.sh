#!/usr/bin/env bash
# Interoperability with PyTorch: export -> load_state_dict(strict=True) -> same outputs,
# and plain official state dicts -> diffusion forward. Needs python3 with torch and numpy.
source "$(dirname "$0")/lib.sh"
PY=""
for p in /usr/bin/python3 python3; do
  if "$p" -c "import torch, numpy" 2>/dev/null; then PY=$p; break; fi
done
if [ -z "$PY" ]; then echo "SKIP (no python3-torch) PyTorch interoperability: no python3 with torch and numpy (bash tools/deps.sh --tests)"; exit 0; fi
"$PY" "$(dirname "$0")/pytorch_interop.py" "$BIN" "$TMP"
