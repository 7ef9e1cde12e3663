# oelm — set-up, main job and tests on a fresh machine.
#   make demo   trains Baseline vs OELM-Freeze vs OELM-Random on real SST-2 and prints the comparison
#   make test   runs the test suite
#   make results-cpu  the CPU-scale SST-2 and TinyStories comparisons (3 seeds, LR sweep)
#   make gpu-check    on a machine with an NVIDIA GPU: env, tests, benchmarks, two short bf16 runs
# Both create .venv and install everything first (torch 2.13.0 CPU build before anything else).

PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.oelm-installed
TRACKERS := $(VENV)/.oelm-trackers

# Real data: ../shared/data when it exists; override with `make demo OELM_DATA_DIR=/path`.
OELM_DATA_DIR ?= $(if $(wildcard ../shared/data/MANIFEST.md),$(abspath ../shared/data),)
export OELM_DATA_DIR
# The Hub is unreachable here; without this, every Hub look-up hangs ~50 s before failing.
export HF_HUB_OFFLINE ?= 1
# Busy-waiting OpenMP threads made a training step ~20x slower on a 2-core machine.
export OMP_WAIT_POLICY ?= PASSIVE
export TOKENIZERS_PARALLELISM ?= false

.PHONY: install browser demo test test-fast tinystories results-cpu bench gpu-check clean

install: $(STAMP)

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	# torch first: the CPU wheel on disk. Installing it later lets pip pull a multi-GB CUDA build.
	$(BIN)/python -m pip install --quiet "torch==2.13.0"
	$(BIN)/python -m pip install --quiet -e ".[test,ray]"
	touch $(STAMP)

# The experiment trackers' extras (wandb, mlflow-skinny; ~+160 MB installed, ~15 s from the mirror) for
# tests/test_trackers*.py, which would otherwise be skipped: the tests install them, the demo does not.
$(TRACKERS): $(STAMP)
	$(BIN)/python -m pip install --quiet -e ".[wandb,mlflow]"
	touch $(TRACKERS)

# The main job on the local executor (the default): one run after another in this process, every
# core's threads each. Ray was 1.11x slower for it here (docs/scaling.md, "The demo in lanes").
demo: $(STAMP)
	$(BIN)/oelm run configs/quickstart.yaml

tinystories: $(STAMP)
	$(BIN)/oelm run configs/tinystories-tiny.yaml

# Headless Chromium for tests/test_report_html.py (Debian packages; needs root and the Debian
# mirror). Quiet and idempotent: nothing happens when chromium and chromedriver are there.
browser:
	@command -v chromium >/dev/null && command -v chromedriver >/dev/null || \
	  (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium chromium-driver >/dev/null) || \
	  echo "note: could not install chromium/chromium-driver; the headless-browser report test will be skipped"

# The committed CPU-scale results (3 seeds, learning-rate sweep, test once): ~15-20 min each on 2 cores.
# Watch with `.venv/bin/oelm monitor outputs/cpu-sst2`; rerunning continues where it stopped.
results-cpu: $(STAMP)
	$(BIN)/oelm run configs/cpu/phase1_bert/sst2.yaml --output-dir outputs/cpu-sst2
	$(BIN)/oelm run configs/cpu/phase2_gpt_lm/tinystories.yaml --output-dir outputs/cpu-tinystories

# The GPU check (scripts/gpu_check.sh): everything under docs/results/gpu-<date>-<gpu>/ (or OUT=DIR),
# ending with SUMMARY.md; PART=speed or PART=scale runs one part (docs/scaling.md, "The GPU check in
# two commands"). It installs nothing (a GPU machine may have no network): it runs with .venv's
# python when there is one, else python3 with oelm from src/. Without a CUDA GPU it stops with
# "gpu-check: no CUDA GPU: ..." and says how to get a CUDA build of torch.
gpu-check:
	PYTHON="$(if $(wildcard $(BIN)/python),$(BIN)/python,python3)" PYTHONPATH="$(CURDIR)/src$(if $(PYTHONPATH),:$(PYTHONPATH))" \
	  OUT="$(OUT)" bash scripts/gpu_check.sh $(PART)

# Issue 12's CPU benchmark: OELM-Freeze vs baseline vs a plain PyTorch loop, interleaved (~2 min on 2 cores).
# See benchmarks/README.md; on a GPU: `$(BIN)/oelm bench --model gpt-medium-512 --precision bf16 --compile`.
bench: $(STAMP)
	$(BIN)/oelm bench --model cpu-bench --steps 50 --json outputs/bench/cpu-bench.json

# Parallel workers (pytest-xdist), one per core up to 4, a whole test file each (shared fixtures built
# once; the Ray tests never beside each other); tests/conftest.py hands out the files with the slow
# tests first. --durations: the 30 slowest, so CI logs show where the time goes.
PYTEST_PARALLEL := -n auto --dist loadfile --no-loadscope-reorder

test: $(STAMP) $(TRACKERS) browser
	$(BIN)/python -m pytest -q $(PYTEST_PARALLEL) --durations=30

test-fast: $(STAMP) $(TRACKERS)
	$(BIN)/python -m pytest -q $(PYTEST_PARALLEL) -m "not slow"

clean:
	rm -rf $(VENV) outputs .pytest_cache
