#!/usr/bin/env bash
# Copy a finished `oelm run` output directory into docs/results/NAME for committing: everything a run
# writes except model weights (*.safetensors), resumable checkpoints, TensorBoard event files, the saved
# tokenizer.json (derived from the data; each result records its sha256) and the locks (.oelm.lock, and `--worker`'s .oelm.state.lock and .claims/); then rebuild its report with the
# project's oelm (`oelm report`), so the committed comparison.json is what
# tests/test_committed_results.py recomputes from the committed runs.
#
#   scripts/collect_results.sh OUTPUT_DIR NAME
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
[ $# -eq 2 ] || { echo "usage: $0 OUTPUT_DIR NAME" >&2; exit 2; }
src="$(cd "$1" && pwd)"; dest="$ROOT/docs/results/$2"
[ -f "$src/plan.json" ] || { echo "collect: $src has no plan.json: not an oelm run output directory" >&2; exit 2; }
mkdir -p "$dest"
(cd "$src" && find . -type f \
    ! -name '*.safetensors' ! -name '*.pt' ! -name 'events.out.tfevents.*' ! -name '.oelm.lock' ! -name '.oelm.state.lock' \
    ! -path './tokenizer.json' \
    ! -path './.claims/*' ! -path '*/checkpoints/*' ! -path '*/tensorboard/*' -print0) |
  (cd "$src" && xargs -0 -I{} cp --parents {} "$dest/")
"${PYTHON:-$ROOT/.venv/bin/python}" -m oelm report "$dest"
echo "collected $src -> $dest"
