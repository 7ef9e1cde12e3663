"""Shared test set-up: offline Hub, passive OpenMP threads, the real data directory, and the rules
that let the suite run on parallel pytest-xdist workers (`make test`: ``-n auto --dist loadfile``).

Parallel workers:
- each worker gets ``cores // workers`` torch/OpenMP threads (1 each with 2 workers on 2 cores), set
  before torch is imported, so the subprocesses a test starts inherit the same count;
- a test file is the unit a worker takes (``--dist loadfile``): the tests of one file run on one
  worker, one after another, so a module-scoped fixture (a trained matrix, a browser) is built once,
  and tests that must not run beside each other live in one file (tests/test_ray.py: its Ray
  instances share the machine's cores; each test stops only its own, by PID);
- files are handed out most slow tests first (``--no-loadscope-reorder`` keeps this order), so the
  end-to-end runs of minutes start at once and the short files fill in behind them.
Token/tokenizer caches live under each worker's own temp folder: workers never share a cache file.

(pytest-xdist's ``--dist loadgroup`` would group finer, but with pytest 9.2 its ``xdist_group``
markers are ignored: xdist 3.8 tags them onto ``item._nodeid``, which pytest 9.2 no longer reads.)
"""

from __future__ import annotations

import os
from pathlib import Path


def _cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover - not Linux
        return os.cpu_count() or 1


# Before torch is imported anywhere: busy-waiting OpenMP threads make CPU steps ~20x slower on
# 2 cores, and Hub look-ups hang ~50 s when the Hub is unreachable.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
# No matmul speed probes around each run (oelm.runtime.environment.run_probes_wanted): two ~0.2 s
# probes were most of a few-step tiny run's time, ~0.4 s of each of the suite's ~400 runs. The tests
# that read the probes turn them back on (test_experiment's sst2_run, test_timing).
os.environ.setdefault("OELM_SPEED_PROBE", "0")
# No plots in the reports (oelm.report.plots_wanted): drawing them was ~1.7 s of each warm report, and
# the suite writes a report at the end of each of its ~200 matrices. The tests that read the plots turn
# them back on (test_report, test_report_html, test_convergence, test_diagnostics, test_experiment's
# swept_lm, test_inside_folders).
os.environ.setdefault("OELM_REPORT_PLOTS", "0")

# On an xdist worker: the cores shared out among the workers (an explicit OMP_NUM_THREADS is kept).
_WORKERS = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
if "PYTEST_XDIST_WORKER" in os.environ and _WORKERS > 1:
    _threads = str(max(1, _cores() // _WORKERS))
    os.environ.setdefault("OMP_NUM_THREADS", _threads)
    os.environ.setdefault("MKL_NUM_THREADS", os.environ["OMP_NUM_THREADS"])

_DEFAULT_DATA = Path(__file__).resolve().parents[2] / "shared" / "data"
if "OELM_DATA_DIR" not in os.environ and (_DEFAULT_DATA / "MANIFEST.md").exists():
    os.environ["OELM_DATA_DIR"] = str(_DEFAULT_DATA)

import pytest  # noqa: E402

@pytest.fixture
def report_plots(monkeypatch):
    """Reports draw their plots in this test (the suite's default, set above, is no plots)."""
    monkeypatch.setenv("OELM_REPORT_PLOTS", "1")


MAX_AUTO_WORKERS = 4  # beyond this the slowest file, not the worker count, sets the suite's time


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_auto_num_workers(config: pytest.Config) -> int:
    """``-n auto``: one worker per core, at most ``MAX_AUTO_WORKERS`` (each torchrun or Ray test
    starts 2-4 processes of its own, and memory grows with every worker)."""
    return max(1, min(MAX_AUTO_WORKERS, _cores()))


# The files whose tests take longest in `make test` (--durations on 2 workers, 2026-11-25: 250, 209,
# 181, 230 s for the four Ray tests, 113, 150 s for the torchrun ones), handed out first so that no
# worker starts one of them last while the other sits idle. A file not listed keeps the slow-count order.
LONGEST_FILES = (
    "test_end_to_end_slow.py", "test_ray.py", "test_end_to_end_lm_slow.py", "test_results_pipeline_slow.py",
    "test_distributed.py", "test_stress.py",
)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """On an xdist worker: the ``LONGEST_FILES`` first, in that order, then files with more slow tests
    (a stable sort, so files of equal rank and the tests within each file keep their collection
    order). Every worker sorts the same collection the same way, and the controller hands out files
    in this order."""
    if "PYTEST_XDIST_WORKER" not in os.environ:
        return
    slow_per_file: dict[str, int] = {}
    for item in items:
        key = item.nodeid.split("::", 1)[0]
        slow_per_file[key] = slow_per_file.get(key, 0) + (item.get_closest_marker("slow") is not None)

    def order(item: pytest.Item) -> tuple[int, int]:
        key = item.nodeid.split("::", 1)[0]
        name = key.rsplit("/", 1)[-1]
        heavy = LONGEST_FILES.index(name) if name in LONGEST_FILES else len(LONGEST_FILES)
        return heavy, -slow_per_file[key]

    items.sort(key=order)


@pytest.fixture(scope="session")
def data_dir() -> Path:
    """The real data folder (../shared/data or $OELM_DATA_DIR); skips when absent."""
    d = os.environ.get("OELM_DATA_DIR")
    if not d or not Path(d).is_dir():
        pytest.skip("real data not available: set OELM_DATA_DIR to a folder laid out like shared/data")
    return Path(d)


@pytest.fixture(autouse=True)
def _isolated_cache(tmp_path_factory, monkeypatch):
    """Token/tokenizer caches go to a per-session temp folder (per worker under xdist), never the user's home."""
    monkeypatch.setenv("OELM_CACHE_DIR", str(tmp_path_factory.getbasetemp() / "oelm-cache"))


@pytest.fixture
def forget_own_datasets():
    """Every dataset a test's config registers (a task's own files) is gone after it: the registry
    (oelm.data.DATASETS) is per process, and an own dataset must not leak into the next test."""
    from oelm.data import DATASETS

    before = set(DATASETS)
    yield
    for name in set(DATASETS) - before:
        del DATASETS[name]
