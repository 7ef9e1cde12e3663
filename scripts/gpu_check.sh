#!/usr/bin/env bash
# The GPU check: one command for anyone with an NVIDIA GPU (our own sessions usually have none).
#
#   make gpu-check                      # or: bash scripts/gpu_check.sh
#   make gpu-check OUT=/tmp/gpu-run     # another output folder
#
# Writes into OUT (default docs/results/gpu-<YYYYMMDD>-<gpu-name-slug>/):
#   env.json                      `oelm env`: versions, GPU, driver, matmul probe
#   nvidia-smi.txt                `nvidia-smi` and `nvidia-smi -q` at the start
#   pytest-cuda.log               the test suite with OELM_TEST_DEVICE=cuda (see the note in the log)
#   bench-gpt-medium-512-bf16-compile.json / -nocompile.json   `oelm bench`, torch.compile on / off
#   bench-dispatch-proxy-fp32-nocompile.json / -reduce-overhead.json
#                                 the dispatch-bound proxy (tiny model, tiny batch): engine / plain
#                                 per step and operators per step, eager and with CUDA graphs
#   bench-gpt2-124m-bf16-nocompile.json / -compile.json / -reduce-overhead.json
#                                 GPT-2 124M (12 x 768, 1,024 tokens, V 50,304), batch found
#                                 automatically: MFU, tokens/s, memory, Freeze/baseline, engine/plain
#   bench-bert-base-cls-bf16-nocompile.json / -compile.json
#                                 a BERT-base-sized classifier (12 x 768, 128 tokens), batch automatic
#   tinystories/                  `oelm run configs/tinystories-tiny.yaml`, 200 steps, bf16, seed 0
#   sst2/                         `oelm run configs/quickstart.yaml` (MiniLM on SST-2), bf16, seed 0
#   tinystories-reduce-overhead/, sst2-reduce-overhead/
#                                 the same single runs with training.compile=reduce-overhead
#   logs/<step>.log, steps.tsv    each step's output; name, exit status, seconds per step
#   SUMMARY.md                    scripts/gpu_summary.py: every step's status and the numbers
# A failing step is recorded in steps.tsv and SUMMARY.md and does not stop the next ones; the
# script exits 1 when any step failed, 0 when all passed.
#
# Needs a CUDA build of torch in the venv. Without a usable CUDA GPU it stops at once with one
# line "gpu-check: no CUDA GPU: ..." and exit status 3, before writing anything.
#
# In parts (a machine lent for short jobs, e.g. 10 minutes each): GPU_CHECK_STEPS names the steps to
# run (space-separated, in the order below; default all), GPU_CHECK_DEADLINE (Unix time, seconds)
# is when the last step must have ended: a step is stopped there (`timeout`, exit status 124) and the
# steps after it are recorded as skipped; GPU_CHECK_STEP_TIMEOUT (seconds) bounds each step.
# scripts/offline_kit.py runs the parts on a machine with no network and merges them afterwards.
#
# Environment: PYTHON (default .venv/bin/python), OUT, PYTEST_MARK (pytest -m expression, default
# "not slow"; empty: the whole suite; more pytest options through pytest's own PYTEST_ADDOPTS),
# BENCH_ARGS (extra `oelm bench` flags, e.g. "--steps 50 --batch-size 8 --seq-len 512"),
# TINYSTORIES_ARGS / SST2_ARGS (extra `oelm run` overrides, e.g. "training.max_steps=100").
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
PY="${PYTHON:-.venv/bin/python}"

# Every step, in the order it runs (tests/test_gpu_check.py keeps this list and the calls below equal).
ALL_STEPS=(env nvidia-smi pytest-cuda bench-compile bench-nocompile bench-proxy bench-proxy-reduce-overhead
  bench-gpt2-124m bench-gpt2-124m-compile bench-gpt2-124m-reduce-overhead bench-bert-base bench-bert-base-compile
  tinystories sst2 tinystories-reduce-overhead sst2-reduce-overhead)
read -r -a SELECTED <<< "${GPU_CHECK_STEPS:-${ALL_STEPS[*]}}"
for name in ${SELECTED[@]+"${SELECTED[@]}"}; do
  case " ${ALL_STEPS[*]} " in
    *" $name "*) ;;
    *) echo "gpu-check: GPU_CHECK_STEPS names an unknown step '$name'; the steps are: ${ALL_STEPS[*]}" >&2; exit 2 ;;
  esac
done
for var in GPU_CHECK_DEADLINE GPU_CHECK_STEP_TIMEOUT; do
  case "${!var:-0}" in
    ''|*[!0-9]*) echo "gpu-check: $var must be a whole number of seconds, got '${!var}'" >&2; exit 2 ;;
  esac
done

# -- 0. a CUDA GPU, seen by this torch ---------------------------------------------------------
if ! CUDA_LINE="$("$PY" - <<'EOF' 2>&1
import sys
try:
    import torch
except Exception as exc:  # no torch, or a broken one
    print(f"torch does not import ({type(exc).__name__}: {exc})")
    sys.exit(1)
if not torch.cuda.is_available():
    built = f"built for CUDA {torch.version.cuda}" if torch.version.cuda else "a CPU-only build"
    print(f"torch.cuda.is_available() is False (torch {torch.__version__}, {built})")
    sys.exit(1)
print(torch.cuda.get_device_name(0))
EOF
)"; then
  echo "gpu-check: no CUDA GPU: ${CUDA_LINE##*$'\n'}. Needs an NVIDIA GPU and a CUDA build of torch in the venv, e.g. .venv/bin/pip install --force-reinstall 'torch==2.13.0' --index-url https://download.pytorch.org/whl/cu128 (pick the cuXXX your driver supports; see docs/scaling.md 'The GPU check')." >&2
  exit 3
fi
GPU_NAME="${CUDA_LINE##*$'\n'}"  # the last line: torch may warn first
SLUG="$(printf '%s' "$GPU_NAME" | tr '[:upper:]' '[:lower:]' | sed -E 's/[^a-z0-9]+/-/g; s/^-+//; s/-+$//')"
OUT="${OUT:-docs/results/gpu-$(date +%Y%m%d)-${SLUG:-gpu}}"
mkdir -p "$OUT/logs"
OUT="$(cd "$OUT" && pwd)"
STEPS="$OUT/steps.tsv"
printf 'step\texit_status\tseconds\tlog\n' > "$STEPS"
echo "gpu-check: $GPU_NAME -> $OUT"

export HF_HUB_OFFLINE="${HF_HUB_OFFLINE:-1}" TOKENIZERS_PARALLELISM="${TOKENIZERS_PARALLELISM:-false}"
export OMP_WAIT_POLICY="${OMP_WAIT_POLICY:-PASSIVE}"
# Real data as the Makefile finds it: ../shared/data when it is there, else $OELM_DATA_DIR.
if [ -z "${OELM_DATA_DIR:-}" ] && [ -f ../shared/data/MANIFEST.md ]; then
  OELM_DATA_DIR="$(cd ../shared/data && pwd)"
  export OELM_DATA_DIR
fi
# Exported, and oelm called through a function, so a step under `timeout` (a child bash) sees them.
export OUT PY GPU_NAME
oelm_cli() { "$PY" -m oelm.cli "$@"; }
FAILED=0

# step NAME CMD... : run CMD with its output in logs/NAME.log; record the exit status, go on.
# A step not in GPU_CHECK_STEPS is left out; one whose time is up (GPU_CHECK_DEADLINE) is recorded
# as skipped; a running step is stopped at the deadline or after GPU_CHECK_STEP_TIMEOUT (exit 124).
step() {
  local name="$1"; shift
  case " ${SELECTED[*]-} " in *" $name "*) ;; *) return 0 ;; esac
  local log="$OUT/logs/$name.log" start=$SECONDS rc=0 limit="${GPU_CHECK_STEP_TIMEOUT:-0}"
  if [ "${GPU_CHECK_DEADLINE:-0}" -gt 0 ]; then
    local left=$((GPU_CHECK_DEADLINE - $(date +%s)))
    if [ "$left" -le 0 ]; then
      echo "gpu-check: $name skipped: GPU_CHECK_DEADLINE has passed" >&2
      printf '%s\t%s\t%s\t%s\n' "$name" "skipped" "0" "" >> "$STEPS"
      FAILED=1  # asked for and not run: the check is not complete
      return 0
    fi
    if [ "$limit" -eq 0 ] || [ "$left" -lt "$limit" ]; then limit="$left"; fi
  fi
  echo "gpu-check: $name ..."
  if [ "$limit" -gt 0 ]; then
    # --kill-after: a step that ignores SIGTERM (a stuck CUDA call) is killed 10 s later
    timeout --kill-after=10 "$limit" bash -c "$(declare -f); $(printf '%q ' "$@")" > "$log" 2>&1 || rc=$?
    if [ "$rc" -eq 124 ] || [ "$rc" -eq 137 ]; then echo "gpu-check: $name stopped after its $limit s (time limit)" >> "$log"; fi
  else
    "$@" > "$log" 2>&1 || rc=$?
  fi
  printf '%s\t%s\t%s\t%s\n' "$name" "$rc" "$((SECONDS - start))" "logs/$name.log" >> "$STEPS"
  if [ "$rc" -ne 0 ]; then
    FAILED=1
    echo "gpu-check: $name FAILED (exit $rc), see $log" >&2
  fi
}

env_json() { oelm_cli env > "$OUT/env.json"; }

smi() {
  { nvidia-smi; echo; nvidia-smi -q; } > "$OUT/nvidia-smi.txt"
}

pytest_cuda() {
  local args=(-q) mark="${PYTEST_MARK-not slow}"
  if [ -n "$mark" ]; then args+=(-m "$mark"); fi
  {
    echo "# OELM_TEST_DEVICE=cuda $PY -m pytest ${args[*]}"
    echo "# CUDA available: $GPU_NAME. No test reads OELM_TEST_DEVICE yet: the suite runs as on CPU, on a machine with CUDA."
  } > "$OUT/pytest-cuda.log"
  OELM_TEST_DEVICE=cuda "$PY" -m pytest "${args[@]}" >> "$OUT/pytest-cuda.log" 2>&1
}

bench() {  # bench compile|nocompile  (gpt-medium-512, bf16: the first GPU check's shape)
  bench_shape gpt-medium-512 bf16 "$1"
}

bench_shape() {  # bench_shape MODEL fp32|bf16 nocompile|compile|reduce-overhead|max-autotune
  local model="$1" precision="$2" how="$3" extra flags=()
  case "$how" in
    nocompile) flags=(--no-compile) ;;
    compile) flags=(--compile) ;;
    *) flags=(--compile-mode "$how") ;;
  esac
  read -r -a extra <<< "${BENCH_ARGS:-}"
  oelm_cli bench --model "$model" --precision "$precision" --device cuda "${flags[@]}" \
    --json "$OUT/bench-$model-$precision-$how.json" ${extra[@]+"${extra[@]}"}
}

run_tinystories() { run_tinystories_to tinystories; }
run_sst2() { run_sst2_to sst2; }  # 12,000 sentences, 1 epoch = 375 steps per method: a minute or two on an H100

# The same single runs with CUDA graphs (torch.compile mode reduce-overhead), beside the eager ones.
run_tinystories_ro() { TINYSTORIES_ARGS="training.compile=reduce-overhead ${TINYSTORIES_ARGS:-}" run_tinystories_to tinystories-reduce-overhead; }
run_sst2_ro() { SST2_ARGS="training.compile=reduce-overhead ${SST2_ARGS:-}" run_sst2_to sst2-reduce-overhead; }

run_tinystories_to() {  # run_tinystories_to SUBDIR
  local extra
  read -r -a extra <<< "${TINYSTORIES_ARGS:-}"
  oelm_cli run configs/tinystories-tiny.yaml --output-dir "$OUT/$1" \
    training.max_steps=200 training.eval_every=50 training.mixed_precision=bf16 'seeds=[0]' \
    training.progress_bar=false ${extra[@]+"${extra[@]}"}
}

run_sst2_to() {  # run_sst2_to SUBDIR
  local extra
  read -r -a extra <<< "${SST2_ARGS:-}"
  oelm_cli run configs/quickstart.yaml --output-dir "$OUT/$1" \
    training.mixed_precision=bf16 'seeds=[0]' training.progress_bar=false ${extra[@]+"${extra[@]}"}
}

step env env_json
step nvidia-smi smi
step pytest-cuda pytest_cuda
step bench-compile bench compile
step bench-nocompile bench nocompile
step bench-proxy bench_shape dispatch-proxy fp32 nocompile
step bench-proxy-reduce-overhead bench_shape dispatch-proxy fp32 reduce-overhead
step bench-gpt2-124m bench_shape gpt2-124m bf16 nocompile
step bench-gpt2-124m-compile bench_shape gpt2-124m bf16 compile
step bench-gpt2-124m-reduce-overhead bench_shape gpt2-124m bf16 reduce-overhead
step bench-bert-base bench_shape bert-base-cls bf16 nocompile
step bench-bert-base-compile bench_shape bert-base-cls bf16 compile
step tinystories run_tinystories
step sst2 run_sst2
step tinystories-reduce-overhead run_tinystories_ro
step sst2-reduce-overhead run_sst2_ro

if ! "$PY" scripts/gpu_summary.py "$OUT" > "$OUT/logs/summary.log" 2>&1; then
  echo "gpu-check: writing SUMMARY.md failed, see $OUT/logs/summary.log" >&2
  FAILED=1
fi
echo "gpu-check: done -> $OUT/SUMMARY.md"
exit "$FAILED"
