"""Files oelm writes atomically get the permissions a plain ``open(path, "w")`` would give them
(``0o666 & ~umask``), not the ``0o600`` of the temporary file they are renamed from."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from oelm.io import atomic_path, write_bytes_atomic, write_dir_atomic, write_json_atomic, write_text_atomic


@pytest.fixture
def umask():
    """Set the process umask for one test; the old one is restored afterwards."""
    old = os.umask(0o022)
    os.umask(old)
    yield lambda mask: os.umask(mask)
    os.umask(old)


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


@pytest.mark.parametrize("mask, expected", [(0o022, 0o644), (0o077, 0o600), (0o002, 0o664)])
def test_write_json_atomic_follows_the_umask(tmp_path, umask, mask, expected):
    umask(mask)
    write_json_atomic(tmp_path / "result.json", {"a": 1})
    assert _mode(tmp_path / "result.json") == expected


def test_every_atomic_writer_gives_0644_under_umask_022(tmp_path, umask):
    umask(0o022)
    write_text_atomic(tmp_path / "report.md", "# r\n")
    write_bytes_atomic(tmp_path / "b.bin", b"x")
    with atomic_path(tmp_path / "weights.safetensors") as tmp:
        from safetensors.torch import save_file
        import torch

        save_file({"w": torch.zeros(2)}, str(tmp))

    def fill(d: Path) -> None:
        (d / "model.bin").write_bytes(b"w")

    ckpt = write_dir_atomic(tmp_path / "checkpoint", fill)
    for name in ("report.md", "b.bin", "weights.safetensors", "checkpoint/model.bin", "checkpoint/manifest.json"):
        assert _mode(tmp_path / name) == 0o644, name
    assert _mode(ckpt) == 0o755  # as mkdir would make it, not mkdtemp's 0o700


def test_rewriting_a_file_keeps_its_own_permissions(tmp_path, umask):
    umask(0o022)
    path = tmp_path / "status.json"
    write_json_atomic(path, {"state": "running"})
    os.chmod(path, 0o640)
    write_json_atomic(path, {"state": "finished"})
    assert _mode(path) == 0o640
