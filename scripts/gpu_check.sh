#!/usr/bin/env bash
# The GPU check: everything GPU-specific in one script, for whoever has an NVIDIA GPU (our own
# sessions usually have none). In two parts, each one command that ends well inside 7 minutes on an
# H100 (a lent machine gives 15 minutes in all, no network: docs/scaling.md, "The GPU check in two
# commands"; scripts/offline_kit.py carries what they need and runs them):
#
#   bash scripts/gpu_check.sh speed    # CUDA tests; oelm bench on GPT-2 124M (eager, compile, CUDA graphs),
#                                      # the MiniLM-shaped classifier, the dispatch proxy; a short gpt-tiny run
#   bash scripts/gpu_check.sh scale    # the original's IMDB gpt-medium-512 matrix, 3 methods x 3 seeds, test once
#   bash scripts/gpu_check.sh          # (or `all`, or make gpu-check) every step below, the older ones too
#
# Writes into OUT (default docs/results/gpu-<YYYYMMDD>-<gpu-name-slug>/):
#   env.json, nvidia-smi.txt      `oelm env` (versions, GPU, driver, matmul probe) and `nvidia-smi -q`
#   pytest-cuda.log               tests/test_cuda.py (skipped without a GPU) with OELM_TEST_DEVICE=cuda
#   bench-<shape>-<precision>-<mode>.json
#                                 `oelm bench` (mode nocompile | compile | reduce-overhead): gpt2-124m
#                                 (12 x 768, 1,024 tokens, batch 16), minilm-cls (6 x 384, 12 heads, 64 tokens,
#                                 batch 32, random weights), dispatch-proxy, gpt-medium-512, bert-base-cls
#   tinystories/, tinystories-reduce-overhead/
#                                 `oelm run configs/tinystories-tiny.yaml`, 200 steps, bf16, seed 0, eager / CUDA graphs
#   imdb/                         scripts/gpu_lanes.py on scripts/gpu_scale_imdb.yaml (runs side by side, lanes.json)
#   sst2/, sst2-reduce-overhead/  `oelm run configs/quickstart.yaml` (needs the MiniLM weights: `all` only)
#   logs/<step>.log, steps.tsv    each step's output; name, exit status, seconds per step
#   SUMMARY.md                    scripts/gpu_summary.py: every step's status and the numbers
# Steps run in the order below (a part's steps are in priority order). A failing step is recorded
# and the next one runs; the exit status is 1 when any step failed or was skipped, else 0.
#
# Needs a CUDA build of torch. Without a usable CUDA GPU it stops at once with one line
# "gpu-check: no CUDA GPU: ..." and exit status 3, before writing anything.
#
# GPU_CHECK_STEPS names the steps to run (space-separated; default: the part's), GPU_CHECK_DEADLINE
# (Unix time) is when the last step must have ended: the running step is stopped there (`timeout`,
# exit status 124) and the rest recorded as skipped; GPU_CHECK_STEP_TIMEOUT (seconds) bounds every
# step (speed's steps have their own bounds as well, STEP_LIMIT below).
# GPU_CHECK_DRY_RUN=1: the same steps on the CPU with small sizes (no GPU needed; tests/test_gpu_dry_run.py):
# --device cpu, a few steps, 1-layer models, seed 0 only for imdb, and TORCHDYNAMO_DISABLE=1
# (torch.compile calls return the eager model; GPU_CHECK_DRY_COMPILE=1 compiles for real).
#
# Environment: PYTHON (default .venv/bin/python, else python3), OUT, BENCH_ARGS (extra `oelm bench`
# flags), TINYSTORIES_ARGS / SST2_ARGS / IMDB_ARGS (extra `oelm run` overrides), SCALE_LANES (auto or N).
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
if [ -z "${PYTHON:-}" ] && [ ! -x .venv/bin/python ]; then PYTHON=python3; fi  # a GPU image's own Python
PY="${PYTHON:-.venv/bin/python}"
DRY="${GPU_CHECK_DRY_RUN:-0}"

# Every step, in the order it runs (tests/test_gpu_check.py keeps this list and the calls below equal).
ALL_STEPS=(env nvidia-smi pytest-cuda bench-gpt2-124m bench-gpt2-124m-compile bench-gpt2-124m-reduce-overhead
  bench-minilm bench-minilm-reduce-overhead bench-proxy bench-proxy-reduce-overhead tinystories tinystories-reduce-overhead
  imdb bench-compile bench-nocompile bench-bert-base bench-bert-base-compile sst2 sst2-reduce-overhead)
SPEED_STEPS=(env nvidia-smi pytest-cuda bench-gpt2-124m bench-gpt2-124m-compile bench-gpt2-124m-reduce-overhead
  bench-minilm bench-minilm-reduce-overhead bench-proxy bench-proxy-reduce-overhead tinystories tinystories-reduce-overhead)
SCALE_STEPS=(env nvidia-smi imdb)
PART="${1:-all}"
case "$PART" in
  speed) DEFAULT_STEPS=("${SPEED_STEPS[@]}") ;;
  scale) DEFAULT_STEPS=("${SCALE_STEPS[@]}") ;;
  all) DEFAULT_STEPS=("${ALL_STEPS[@]}") ;;
  *) echo "gpu-check: unknown part '$PART'; use speed, scale or all (or none)" >&2; exit 2 ;;
esac
read -r -a SELECTED <<< "${GPU_CHECK_STEPS:-${DEFAULT_STEPS[*]}}"
for name in ${SELECTED[@]+"${SELECTED[@]}"}; do
  case " ${ALL_STEPS[*]} " in
    *" $name "*) ;;
    *) echo "gpu-check: GPU_CHECK_STEPS names an unknown step '$name'; the steps are: ${ALL_STEPS[*]}" >&2; exit 2 ;;
  esac
done
# Whole seconds in a sane range: a deadline is a Unix time between 2020 and 2100, a step bound at
# most a day (a typo such as 1e9 would otherwise mean "never").
for var in GPU_CHECK_DEADLINE GPU_CHECK_STEP_TIMEOUT; do
  value="${!var:-0}"
  case "$value" in
    ''|*[!0-9]*) echo "gpu-check: $var must be a whole number of seconds, got '${!var}'" >&2; exit 2 ;;
  esac
  if [ "${#value}" -gt 10 ]; then echo "gpu-check: $var=$value is out of range (at most 10 digits)" >&2; exit 2; fi
done
if [ "${GPU_CHECK_DEADLINE:-0}" -ne 0 ] && { [ "$GPU_CHECK_DEADLINE" -lt 1577836800 ] || [ "$GPU_CHECK_DEADLINE" -gt 4102444800 ]; }; then
  echo "gpu-check: GPU_CHECK_DEADLINE=$GPU_CHECK_DEADLINE is not a Unix time between 2020 and 2100 (e.g. \$((\$(date +%s) + 330)))" >&2
  exit 2
fi
if [ "${GPU_CHECK_STEP_TIMEOUT:-0}" -gt 86400 ]; then
  echo "gpu-check: GPU_CHECK_STEP_TIMEOUT=$GPU_CHECK_STEP_TIMEOUT is over a day (86400 s); give the seconds one step may take" >&2
  exit 2
fi
case "$DRY" in 0|1) ;; *) echo "gpu-check: GPU_CHECK_DRY_RUN must be 0 or 1, got '$DRY'" >&2; exit 2 ;; esac

# -- 0. a CUDA GPU, seen by this torch (a dry run runs on the CPU) ------------------------------
if [ "$DRY" = 1 ]; then
  GPU_NAME="CPU dry run (no GPU)"
  DEVICE=cpu
  if [ "${GPU_CHECK_DRY_COMPILE:-0}" != 1 ]; then export TORCHDYNAMO_DISABLE=1; fi
elif ! CUDA_LINE="$("$PY" - <<'EOF' 2>&1
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
  echo "gpu-check: no CUDA GPU: ${CUDA_LINE##*$'\n'}. Needs an NVIDIA GPU and a CUDA build of torch in the venv, e.g. .venv/bin/pip install --force-reinstall 'torch==2.13.0' --index-url https://download.pytorch.org/whl/cu128 (pick the cuXXX your driver supports; see docs/scaling.md 'The GPU check'); GPU_CHECK_DRY_RUN=1 runs the steps on the CPU." >&2
  exit 3
else
  GPU_NAME="${CUDA_LINE##*$'\n'}"  # the last line: torch may warn first
  DEVICE=cuda
fi
SLUG="$(printf '%s' "$GPU_NAME" | tr '[:upper:]' '[:lower:]' | sed -E 's/[^a-z0-9]+/-/g; s/^-+//; s/-+$//')"
OUT="${OUT:-docs/results/gpu-$(date +%Y%m%d)-${SLUG:-gpu}}"
mkdir -p "$OUT/logs"
OUT="$(cd "$OUT" && pwd)"
STEPS="$OUT/steps.tsv"
printf 'step\texit_status\tseconds\tlog\n' > "$STEPS"
echo "gpu-check: $PART on $GPU_NAME -> $OUT"

export HF_HUB_OFFLINE="${HF_HUB_OFFLINE:-1}" TOKENIZERS_PARALLELISM="${TOKENIZERS_PARALLELISM:-false}"
export OMP_WAIT_POLICY="${OMP_WAIT_POLICY:-PASSIVE}" PYTHONUNBUFFERED=1
# Real data as the Makefile finds it: ../shared/data when it is there, else $OELM_DATA_DIR.
if [ -z "${OELM_DATA_DIR:-}" ] && [ -f ../shared/data/MANIFEST.md ]; then
  OELM_DATA_DIR="$(cd ../shared/data && pwd)"
  export OELM_DATA_DIR
fi
# Exported, and oelm called through a function, so a step under `timeout` (a child bash) sees them.
export OUT PY GPU_NAME DEVICE DRY
oelm_cli() { "$PY" -m oelm "$@"; }
FAILED=0

# Each speed step's own bound (seconds; the deadline still applies): a stuck compile cannot eat the part.
declare -A STEP_LIMIT=([pytest-cuda]=90 [bench-gpt2-124m]=75 [bench-gpt2-124m-compile]=120
  [bench-gpt2-124m-reduce-overhead]=120 [bench-minilm]=45 [bench-minilm-reduce-overhead]=90 [bench-proxy]=45
  [bench-proxy-reduce-overhead]=75 [tinystories]=75 [tinystories-reduce-overhead]=105)

# step NAME CMD... : run CMD with its output in logs/NAME.log; record the exit status, go on.
# A step not selected is left out; one whose time is up (GPU_CHECK_DEADLINE) is recorded as
# skipped; a running step is stopped at the deadline or after its bound (exit 124).
step() {
  local name="$1"; shift
  case " ${SELECTED[*]-} " in *" $name "*) ;; *) return 0 ;; esac
  local log="$OUT/logs/$name.log" start=$SECONDS rc=0 limit="${GPU_CHECK_STEP_TIMEOUT:-0}"
  local own="${STEP_LIMIT[$name]:-0}"
  if [ "$own" -gt 0 ] && { [ "$limit" -eq 0 ] || [ "$own" -lt "$limit" ]; }; then limit="$own"; fi
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
  echo "gpu-check: $name exit $rc after $((SECONDS - start)) s"
  if [ "$rc" -ne 0 ]; then
    FAILED=1
    echo "gpu-check: $name FAILED (exit $rc), see $log" >&2
  fi
}

env_json() { oelm_cli env > "$OUT/env.json"; }

smi() {
  { nvidia-smi; echo; nvidia-smi -q; } > "$OUT/nvidia-smi.txt"
}

pytest_cuda() {  # the CUDA subset: tests/test_cuda.py (every test there skips without a GPU)
  echo "# OELM_TEST_DEVICE=cuda $PY -m pytest -q tests/test_cuda.py ($GPU_NAME)" > "$OUT/pytest-cuda.log"
  OELM_TEST_DEVICE=cuda "$PY" -m pytest -q -p no:cacheprovider tests/test_cuda.py >> "$OUT/pytest-cuda.log" 2>&1
}

# The dry run's sizes: the same flags and code paths, a few steps of 1-layer models on the CPU.
dry_bench_args() {  # dry_bench_args MODEL
  [ "$DRY" = 1 ] || return 0
  case "$1" in
    gpt2-124m|gpt-medium-512) echo "--steps 3 --warmup-steps 1 --batch-size 1 --seq-len 32 num_layers=1" ;;
    minilm-cls|bert-base-cls) echo "--steps 3 --warmup-steps 1 --batch-size 4 num_hidden_layers=1" ;;
    *) echo "--steps 3 --warmup-steps 1" ;;
  esac
}

bench() {  # bench compile|nocompile  (gpt-medium-512, bf16: the first GPU check's shape)
  bench_shape gpt-medium-512 bf16 "$1"
}

bench_shape() {  # bench_shape MODEL fp32|bf16 nocompile|compile|reduce-overhead|max-autotune [more flags]
  local model="$1" precision="$2" how="$3" extra dry flags=()
  shift 3
  case "$how" in
    nocompile) flags=(--no-compile) ;;
    compile) flags=(--compile) ;;
    *) flags=(--compile-mode "$how") ;;
  esac
  read -r -a extra <<< "${BENCH_ARGS:-}"
  read -r -a dry <<< "$(dry_bench_args "$model")"
  oelm_cli bench --model "$model" --precision "$precision" --device "$DEVICE" "${flags[@]}" --no-progress \
    --json "$OUT/bench-$model-$precision-$how.json" "$@" ${dry[@]+"${dry[@]}"} ${extra[@]+"${extra[@]}"}
}

# GPT-2 124M at a fixed batch of 16 x 1,024 tokens (nanoGPT trains at 12-16 per GPU): finding the
# largest batch that fits would cost the part a minute of trial steps.
bench_gpt2() { bench_shape gpt2-124m bf16 "$1" --batch-size 16; }

run_tinystories() { run_tinystories_to tinystories; }
run_sst2() { run_sst2_to sst2; }  # 12,000 sentences, 1 epoch = 375 steps per method: a minute or two on an H100

# The same single runs with CUDA graphs (torch.compile mode reduce-overhead), beside the eager ones.
run_tinystories_ro() { TINYSTORIES_ARGS="training.compile=reduce-overhead ${TINYSTORIES_ARGS:-}" run_tinystories_to tinystories-reduce-overhead; }
run_sst2_ro() { SST2_ARGS="training.compile=reduce-overhead ${SST2_ARGS:-}" run_sst2_to sst2-reduce-overhead; }

run_tinystories_to() {  # run_tinystories_to SUBDIR
  local extra dry=()
  read -r -a extra <<< "${TINYSTORIES_ARGS:-}"
  if [ "$DRY" = 1 ]; then dry=(training.max_steps=4 training.eval_every=2 task.validation_samples=20); fi
  oelm_cli run configs/tinystories-tiny.yaml --output-dir "$OUT/$1" \
    training.max_steps=200 training.eval_every=50 training.mixed_precision=bf16 'seeds=[0]' \
    training.progress_bar=false ${dry[@]+"${dry[@]}"} ${extra[@]+"${extra[@]}"}
}

run_sst2_to() {  # run_sst2_to SUBDIR
  local extra
  read -r -a extra <<< "${SST2_ARGS:-}"
  oelm_cli run configs/quickstart.yaml --output-dir "$OUT/$1" \
    training.mixed_precision=bf16 'seeds=[0]' training.progress_bar=false ${extra[@]+"${extra[@]}"}
}

# The original's GPT at its scale: 9 runs side by side on the one GPU (scripts/gpu_lanes.py measures
# how many at once), stopped 60 s before the deadline so that the comparison is still written.
run_imdb() {
  local extra dry=()
  read -r -a extra <<< "${IMDB_ARGS:-}"
  if [ "$DRY" = 1 ]; then
    dry=(training.max_steps=3 task.train_samples=48 task.validation_samples=16 task.test_samples=16 task.max_length=64
         model.gpt_overrides.num_layers=1 training.eval_batch_size=16 'seeds=[0]' --phase-s 1 --max-lanes 2)
  fi
  "$PY" scripts/gpu_lanes.py scripts/gpu_scale_imdb.yaml --output-dir "$OUT/imdb" --lanes "${SCALE_LANES:-auto}" \
    ${dry[@]+"${dry[@]}"} ${extra[@]+"${extra[@]}"}
}

step env env_json
step nvidia-smi smi
step pytest-cuda pytest_cuda
step bench-gpt2-124m bench_gpt2 nocompile
step bench-gpt2-124m-compile bench_gpt2 compile
step bench-gpt2-124m-reduce-overhead bench_gpt2 reduce-overhead
step bench-minilm bench_shape minilm-cls bf16 nocompile
step bench-minilm-reduce-overhead bench_shape minilm-cls bf16 reduce-overhead
step bench-proxy bench_shape dispatch-proxy fp32 nocompile
step bench-proxy-reduce-overhead bench_shape dispatch-proxy fp32 reduce-overhead
step tinystories run_tinystories
step tinystories-reduce-overhead run_tinystories_ro
step imdb run_imdb
step bench-compile bench compile
step bench-nocompile bench nocompile
step bench-bert-base bench_shape bert-base-cls bf16 nocompile
step bench-bert-base-compile bench_shape bert-base-cls bf16 compile
step sst2 run_sst2
step sst2-reduce-overhead run_sst2_ro

if ! "$PY" scripts/gpu_summary.py "$OUT" > "$OUT/logs/summary.log" 2>&1; then
  echo "gpu-check: writing SUMMARY.md failed, see $OUT/logs/summary.log" >&2
  FAILED=1
fi
echo "gpu-check: done -> $OUT/SUMMARY.md"
exit "$FAILED"
