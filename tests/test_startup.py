"""Fixed start-up and exit of an ``oelm`` command (issue 25, item 5): what the cuts rely on, as
properties, not timings (``benchmarks/startup.py`` measures the seconds).

- The measured matmul peak (the MFU reference on a CPU) is probed once per machine, not once per
  process: later processes read it from the cache folder.
- ``oelm``'s CLI freezes the heap after the exit handlers, so interpreter shutdown does not run a
  final garbage collection over torch's and transformers' objects.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import oelm
from oelm.runtime import environment
from oelm.runtime.environment import peaks

SRC = str(Path(oelm.__file__).resolve().parents[1])


@pytest.fixture
def cache(tmp_path, monkeypatch):
    """An empty cache folder and an empty per-process peak table (restored afterwards)."""
    monkeypatch.setenv("OELM_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(peaks, "_measured_peaks", {})
    return tmp_path / environment.PEAK_CACHE_FILE


def _no_probe(*args, **kwargs):
    raise AssertionError("matmul_probe ran although the peak was cached")


def test_measured_peak_is_written_to_the_cache_and_reused_by_a_later_process(cache, monkeypatch):
    first = environment.measured_peak_flops("cpu", "fp32", budget_seconds=0.3)
    stored = json.loads(cache.read_text())
    (key, record), = stored.items()
    assert record["gflops"] * 1e9 == first and record["measured_utc"]
    import torch

    assert torch.__version__ in key and f"|{torch.get_num_threads()}|" in key and key.endswith("|fp32")
    # a new process: empty per-process table, the disk cache answers without probing
    monkeypatch.setattr(peaks, "_measured_peaks", {})
    monkeypatch.setattr(peaks, "matmul_probe", _no_probe)
    assert environment.measured_peak_flops("cpu", "fp32") == first
    rec = environment.mfu_record(2.0e7, 10.0, "cpu", "fp32")  # 0.2 GFLOP/s: never beats the cached peak
    assert rec["peak_flops"] == first and rec["peak_source"] == "measured-probe"


def _fixed_probe(device, size, dtype, min_seconds, repeats=5):
    return {"gflops": 7.0, "size": size, "dtype": "float32", "device": "cpu", "seconds": 0.2, "matmuls": 1}


def test_a_deleted_or_damaged_cache_is_measured_again(cache, monkeypatch):
    monkeypatch.setattr(peaks, "matmul_probe", _fixed_probe)
    cache.write_text("{ not json")
    assert environment.measured_peak_flops("cpu", "fp32") == 7.0e9
    assert json.loads(cache.read_text()) != {}  # rewritten whole
    cache.unlink()
    monkeypatch.setattr(peaks, "_measured_peaks", {})
    assert environment.measured_peak_flops("cpu", "fp32") == 7.0e9 and cache.is_file()


def test_another_thread_count_is_another_machine(cache, monkeypatch):
    """A peak measured with other torch threads is not reused (it is a different peak)."""
    import torch

    monkeypatch.setattr(peaks, "matmul_probe", _fixed_probe)
    environment.measured_peak_flops("cpu", "fp32")
    threads = torch.get_num_threads()
    monkeypatch.setattr(peaks, "_measured_peaks", {})
    monkeypatch.setattr(torch, "get_num_threads", lambda: threads + 1)
    environment.measured_peak_flops("cpu", "fp32")
    assert len(json.loads(cache.read_text())) == 2


def test_cache_false_neither_reads_nor_writes(cache, monkeypatch):
    monkeypatch.setattr(peaks, "matmul_probe", _fixed_probe)
    environment.measured_peak_flops("cpu", "fp32", cache=False)
    assert not cache.exists()


def _python(code: str) -> subprocess.CompletedProcess:
    """``code`` in a fresh interpreter with this tree's oelm; asserts it exited 0."""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                         env={**os.environ, "PYTHONPATH": SRC})
    assert out.returncode == 0, out.stderr
    return out


def test_cli_freezes_the_heap_after_the_exit_handlers():
    """An exit handler registered before ``main`` runs after main's (LIFO): by then the heap is
    frozen, so the interpreter's final collection has nothing of it to walk."""
    code = (
        "import atexit, gc, os\n"
        "atexit.register(lambda: os.write(1, f'frozen={gc.get_freeze_count()}'.encode()))\n"
        "from oelm.cli import main\n"
        "main(['configs'])\n"
    )
    out = _python(code)
    frozen = int(out.stdout.rsplit("frozen=", 1)[1])
    assert frozen > 10_000  # the whole heap of the imported modules, not a handful of objects


def test_a_single_seed_report_imports_no_scipy_and_two_seeds_still_get_the_t_interval():
    """scipy (about a second to import) is loaded by the statistics that use it (intervals and
    p-values of two or more seeds), not by the report modules: a one-seed run's report skips it."""
    code = (
        "import json, sys\n"
        "import oelm.report.compare, oelm.report.render, oelm.report.plots\n"
        "from oelm.report.stats import paired_difference, summarize\n"
        "one = summarize([80.0]), paired_difference({0: 80.0}, {0: 81.0})\n"
        "before = 'scipy' in sys.modules\n"
        "two = summarize([80.0, 82.0])\n"
        "print(json.dumps([before, one[0]['ci95'], two['ci95']]))\n"
    )
    out = _python(code)
    before, one_ci, two_ci = json.loads(out.stdout.strip().splitlines()[-1])
    assert before is False and one_ci is None
    # mean 81, std sqrt(2), n 2: half-width t(0.975, 1) * sqrt(2) / sqrt(2) = 12.7062...
    assert two_ci == pytest.approx([81.0 - 12.7062047, 81.0 + 12.7062047])


def test_a_peak_measured_under_load_is_measured_again_when_a_run_beats_it(cache, monkeypatch):
    """A cached peak of 7 GFLOP/s (taken while other work loaded the machine) and a run whose model
    FLOP/s reach 10 GFLOP/s: the MFU record measures again and keeps the higher peak, on disk too,
    so MFU stays below 100%; a run below the cached peak probes nothing."""
    monkeypatch.setattr(peaks, "matmul_probe", _fixed_probe)
    environment.measured_peak_flops("cpu", "fp32")  # 7 GFLOP/s, cached
    monkeypatch.setattr(peaks, "matmul_probe", _no_probe)
    assert environment.mfu_record(5.0e6, 1000.0, "cpu", "fp32")["mfu"] == pytest.approx(5.0 / 7.0)  # 5 GFLOP/s
    quiet = lambda device, size, dtype, min_seconds, repeats: {**_fixed_probe(device, size, dtype, min_seconds), "gflops": 20.0}  # noqa: E731
    monkeypatch.setattr(peaks, "matmul_probe", quiet)
    rec = environment.mfu_record(1.0e7, 1000.0, "cpu", "fp32")  # 10 GFLOP/s > the cached 7
    assert rec["peak_flops"] == 20.0e9 and rec["mfu"] == pytest.approx(0.5)
    assert [r["gflops"] for r in json.loads(cache.read_text()).values()] == [20.0]
    # a refresh that measures lower (the machine loaded again) keeps the higher known peak
    monkeypatch.setattr(peaks, "matmul_probe", _fixed_probe)
    assert environment.measured_peak_flops("cpu", "fp32", refresh=True) == 20.0e9


@pytest.mark.parametrize("args", [
    ["run", "quickstart", "training.epoch=2"],                 # a key typo on the command line
    ["plan", "quickstart", "training.epochs=abc"],             # a wrong type
    ["run", "quickstart", "training.eval_steps=0.5"],          # a refused Trainer name
])
def test_a_config_typo_fails_before_torch_is_imported(args):
    """A config error is found by the keys-and-types pass, which imports nothing heavy: the
    one-line error comes before torch, transformers or the data registry load (issue 35, item 6;
    ``benchmarks/startup.py --typo`` prints the seconds)."""
    code = (
        "import sys\n"
        "from oelm.cli import main\n"
        f"rc = main({args!r})\n"
        "print(rc, sorted(m for m in ('torch', 'transformers', 'oelm.data.registry', 'oelm.method.apply') if m in sys.modules))\n"
    )
    out = _python(code)
    assert out.stdout.strip().splitlines()[-1] == "2 []"
    assert out.stderr.startswith("oelm: error: ") and "override" in out.stderr
