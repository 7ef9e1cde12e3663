#!/usr/bin/env bash
# Issue 10's real-scale runs, from an exported commit, in the background, resumable.
#
#   scripts/evidence.sh [OELM RUN OPTIONS] COMMIT CONFIG [CONFIG ...]
#
# Options before COMMIT go to every `oelm run`, written as one word each, e.g.
# --executor=ray --parallel=2 --cpus-per-run=1 (the runs of each matrix two side by side, one thread each) or
# --allow-missing-weights: passed to `oelm run`, to continue a matrix on a machine that did not hold it:
# before a session stops, `scripts/collect_results.sh --partial $EVIDENCE_DIR/outputs/NAME
# in-progress/evidence-NAME` copies its finished runs (without weights) into docs/results/ to commit;
# on the new machine, `cp -r docs/results/in-progress/evidence-NAME $EVIDENCE_DIR/outputs/NAME` and
# rerun with this flag (the finished runs count without their weights; a selected sweep run is retrained
# for its test split, see `oelm run --help`).
#
# Exports COMMIT with `git archive` to $EVIDENCE_DIR/oelm-<sha> (once), then runs each CONFIG *from
# that export* (its configs/ and src/, so later edits of the working tree cannot change what runs)
# into $EVIDENCE_DIR/outputs/<config name>, one after the other. Rerunning the same command continues
# every unfinished run from its newest checkpoint; finished runs are skipped (oelm run's resume).
# Logs: $EVIDENCE_DIR/logs/<config name>.log. Copy a finished matrix into docs/results/ with
# scripts/collect_results.sh.
#
# Background priority: the chain runs at nice $EVIDENCE_NICE (default 19; 0 keeps the caller's) and, when
# it leads a session of its own (setsid, as below), sets that session's autogroup nice too, so that tests
# and benchmarks beside it are timed nearly as on an idle machine (why both, and the figures:
# docs/scaling.md, "Background runs beside a measurement").
#
# Needs the project's .venv (make install). Typical use (nohup: it outlives the shell; setsid: a session
# of its own):
#   nohup setsid scripts/evidence.sh HEAD configs/evidence/sst2_minilm.yaml > /dev/null 2>&1 &
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
EVIDENCE_DIR="${EVIDENCE_DIR:-$(cd "$ROOT/.." && pwd)/evidence}"
PYTHON="${PYTHON:-$ROOT/.venv/bin/python}"
nice_level="${EVIDENCE_NICE:-19}"
bad_nice="evidence: EVIDENCE_NICE must be a whole number from 0 to 19, got '$nice_level'"
case "$nice_level" in ''|*[!0-9]*) echo "$bad_nice" >&2; exit 2 ;; esac
[ "$nice_level" -le 19 ] || { echo "$bad_nice" >&2; exit 2; }
if [ "$nice_level" -gt 0 ]; then
  current="$(ps -o ni= -p $$ | tr -d ' ')"   # `nice -n` adds (POSIX); renice's -n differs between versions
  if [ "$current" -lt "$nice_level" ]; then exec nice -n "$((nice_level - current))" "$0" "$@"; fi
  # the session's autogroup, where this chain leads its own session (never the caller's shell session)
  if [ "$(ps -o sid= -p $$ | tr -d ' ')" = "$$" ] && [ -w /proc/self/autogroup ]; then
    echo "$nice_level" > /proc/self/autogroup 2>/dev/null || true
  fi
fi
flags=()
while [[ "${1:-}" == --* ]]; do flags+=("$1"); shift; done
[ $# -ge 2 ] || { echo "usage: $0 [--executor=ray --parallel=2 --cpus-per-run=1 --allow-missing-weights ...] COMMIT CONFIG [CONFIG ...]" >&2; exit 2; }
sha="$(git -C "$ROOT" rev-parse --short=12 "$1^{commit}")"; shift
src="$EVIDENCE_DIR/oelm-$sha"
mkdir -p "$EVIDENCE_DIR/outputs" "$EVIDENCE_DIR/logs"
if [ ! -f "$src/.exported" ]; then
  # Extract into a private folder and rename it into place: two chains started together on the
  # same COMMIT must not delete or half-write each other's export (the second rename fails: its
  # copy is dropped). A folder without .exported is a leftover of an interrupted older export.
  [ -d "$src" ] && rm -rf "$src"
  tmp="$(mktemp -d "$EVIDENCE_DIR/.export-$sha-XXXXXX")"
  git -C "$ROOT" archive "$sha" | tar -x -C "$tmp"
  touch "$tmp/.exported"
  mv -T "$tmp" "$src" 2>/dev/null || rm -rf "$tmp"
fi
export OELM_DATA_DIR="${OELM_DATA_DIR:-$(cd "$ROOT/../shared/data" 2>/dev/null && pwd)}"
export HF_HUB_OFFLINE=1 OMP_WAIT_POLICY=PASSIVE TOKENIZERS_PARALLELISM=false
export PYTHONPATH="$src/src"   # the export's oelm, ahead of the editable install in .venv
cd "$src"
for config in "$@"; do
  [ -f "$config" ] || { echo "evidence: $config is not in commit $sha" >&2; exit 2; }
  name="$(basename "$config" .yaml)"
  log="$EVIDENCE_DIR/logs/$name.log"
  {
    echo "=== $(date -Is) oelm $sha: $config -> $EVIDENCE_DIR/outputs/$name"
    "$PYTHON" -c 'import oelm, sys; print("oelm from", oelm.__file__); sys.exit(0)'
    "$PYTHON" -m oelm run "$config" --output-dir "$EVIDENCE_DIR/outputs/$name" "${flags[@]}"
    echo "=== $(date -Is) done: $config"
  } >> "$log" 2>&1
done
