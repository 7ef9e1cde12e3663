#!/usr/bin/env bash
# Copy a finished `oelm run` output directory into docs/results/NAME for committing: everything a run
# writes except model weights (*.safetensors), resumable checkpoints, TensorBoard event files, the saved
# tokenizer.json (derived from the data; each result records its sha256) and the locks (.oelm.lock, and
# the retired `--worker` scheme's .oelm.state.lock and .claims/); then rebuild its report with the project's oelm
# (`oelm report`), so the committed comparison.json is what tests/test_committed_results.py recomputes
# from the committed runs.
#
#   scripts/collect_results.sh OUTPUT_DIR NAME
#   scripts/collect_results.sh --partial OUTPUT_DIR in-progress/NAME
#
# --partial: a matrix that has not finished, to carry its finished runs to another machine (a long
# matrix outlives a session, and a session's machine may not come back): only runs that have a
# result.json (finished or failed), no report. Copy it back into a fresh output directory there and
# continue with `oelm run ... --allow-missing-weights` (scripts/evidence.sh --allow-missing-weights):
# the finished runs count without their weights, and a selected sweep run is retrained for its test.
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
partial=0
if [ "${1:-}" = "--partial" ]; then partial=1; shift; fi
[ $# -eq 2 ] || { echo "usage: $0 [--partial] OUTPUT_DIR NAME" >&2; exit 2; }
src="$(cd "$1" && pwd)"
case "$2" in /*) dest="$2" ;; *) dest="$ROOT/docs/results/$2" ;; esac  # an absolute NAME is the destination itself
[ -f "$src/plan.json" ] || { echo "collect: $src has no plan.json: not an oelm run output directory" >&2; exit 2; }
skip=()
if [ "$partial" = 1 ]; then
  # runs still training (no result.json) are left out whole: they restart on the other machine
  rm -rf "$dest"
  for run in "$src"/runs/*/; do
    [ -f "$run/result.json" ] || skip+=(! -path "./runs/$(basename "$run")/*")
  done
fi
mkdir -p "$dest"
(cd "$src" && find . -type f \
    ! -name '*.safetensors' ! -name '*.pt' ! -name 'events.out.tfevents.*' ! -name '.oelm.lock' ! -name '.oelm.state.lock' \
    ! -path './tokenizer.json' \
    ! -path './.claims/*' ! -path '*/checkpoints/*' ! -path '*/tensorboard/*' "${skip[@]}" -print0) |
  (cd "$src" && xargs -0 -r -I{} cp --parents {} "$dest/")
if [ "$partial" = 1 ]; then
  echo "collected the $(find "$dest/runs" -name result.json 2>/dev/null | wc -l) runs with a result of $src -> $dest (no report: the matrix has not finished)"
  exit 0
fi
"${PYTHON:-$ROOT/.venv/bin/python}" -m oelm report "$dest"
echo "collected $src -> $dest"
