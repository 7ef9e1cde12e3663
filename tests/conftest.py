"""Shared test set-up: offline Hub, passive OpenMP threads, the real data directory."""

from __future__ import annotations

import os
from pathlib import Path

# Before torch is imported anywhere: busy-waiting OpenMP threads make CPU steps ~20x slower on
# 2 cores, and Hub look-ups hang ~50 s when the Hub is unreachable.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

_DEFAULT_DATA = Path(__file__).resolve().parents[2] / "shared" / "data"
if "OELM_DATA_DIR" not in os.environ and (_DEFAULT_DATA / "MANIFEST.md").exists():
    os.environ["OELM_DATA_DIR"] = str(_DEFAULT_DATA)

import pytest  # noqa: E402


@pytest.fixture(scope="session")
def data_dir() -> Path:
    """The real data folder (../shared/data or $OELM_DATA_DIR); skips when absent."""
    d = os.environ.get("OELM_DATA_DIR")
    if not d or not Path(d).is_dir():
        pytest.skip("real data not available: set OELM_DATA_DIR to a folder laid out like shared/data")
    return Path(d)


@pytest.fixture(autouse=True)
def _isolated_cache(tmp_path_factory, monkeypatch):
    """Token/tokenizer caches go to a per-session temp folder, never the user's home."""
    monkeypatch.setenv("OELM_CACHE_DIR", str(tmp_path_factory.getbasetemp() / "oelm-cache"))
