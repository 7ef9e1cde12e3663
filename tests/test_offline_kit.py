"""scripts/offline_kit.py: the GPU check carried to a machine with no network in parts, and back.

Checked here without a GPU or a download: a kit of a small data folder (no wheels) is split into
parts, received one job at a time, refused when a part is damaged or from another kit, and unpacked
byte-identical; ``check`` runs gpu_check.sh groups with a stand-in python and archives the output
without weights; ``collect`` merges two archives into one folder with one steps.tsv and SUMMARY.md."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import sys
import tarfile
from pathlib import Path

import pytest
from _gpu_check_fakes import fake_gpu_python

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts"))
try:
    import offline_kit
finally:
    sys.path.pop(0)

pytestmark = pytest.mark.skipif(shutil.which("bash") is None, reason="needs bash")


def _data_dir(tmp_path: Path) -> Path:
    data = tmp_path / "data"
    (data / "sst2").mkdir(parents=True)
    (data / "MANIFEST.md").write_text("# a data folder\n")
    (data / "sst2" / "train.parquet").write_bytes(os.urandom(300_000))  # random: no compression shrinks it
    (data / "sst2" / "validation.parquet").write_bytes(os.urandom(50_000))
    return data


def _digests(folder: Path) -> dict[str, str]:
    return {p.relative_to(folder).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest() for p in folder.rglob("*") if p.is_file()}


def _upload(kit: Path, part: int, job: Path) -> Path:
    """What one job uploads: the source tree's .offline-kit holding one part folder."""
    shutil.rmtree(job, ignore_errors=True)
    shutil.copytree(kit / f"part-{part}", job / f"part-{part}")
    return job


def test_parts_received_one_job_at_a_time_unpack_byte_identical(tmp_path):
    data = _data_dir(tmp_path)
    folders = offline_kit.build(tmp_path / "kit", data, [], part_mib=0.12, python_version="3.12")
    assert [f.name for f in folders] == ["part-1", "part-2", "part-3"]
    sizes = [next(f.glob("kit.tar.*")).stat().st_size for f in folders]
    assert max(sizes) <= 0.12 * (1 << 20)
    manifests = [json.loads((f / "manifest.json").read_text()) for f in folders]
    assert all(m == manifests[0] for m in manifests) and manifests[0]["parts"] == 3
    home = tmp_path / "home"
    assert offline_kit.receive(_upload(tmp_path / "kit", 3, tmp_path / "job"), home) is False
    assert offline_kit.receive(_upload(tmp_path / "kit", 1, tmp_path / "job"), home) is False
    assert not (home / "data").exists()
    assert offline_kit.receive(_upload(tmp_path / "kit", 2, tmp_path / "job"), home) is True
    assert _digests(home / "data") == _digests(data)
    assert not (home / "parts").exists() and (home / "ready.json").is_file()
    assert offline_kit.receive(tmp_path / "nothing-uploaded", home) is True  # a later job: already ready


def test_a_damaged_part_is_refused_and_nothing_unpacked(tmp_path):
    data = _data_dir(tmp_path)
    offline_kit.build(tmp_path / "kit", data, [], part_mib=0.2, python_version="3.12")
    chunk = next((tmp_path / "kit" / "part-2").glob("kit.tar.*"))
    raw = bytearray(chunk.read_bytes())
    raw[1000] ^= 0xFF
    chunk.write_bytes(bytes(raw))
    home = tmp_path / "home"
    offline_kit.receive(_upload(tmp_path / "kit", 1, tmp_path / "job"), home)
    with pytest.raises(offline_kit.KitError, match=r"kit\.tar\.002 is damaged \(sha256 differs from its manifest\); upload that part again"):
        offline_kit.receive(_upload(tmp_path / "kit", 2, tmp_path / "job"), home)
    assert not (home / "data").exists() and not (home / "ready.json").exists()


def test_a_part_of_another_kit_is_refused(tmp_path):
    data = _data_dir(tmp_path)
    offline_kit.build(tmp_path / "kit-a", data, [], part_mib=0.2, python_version="3.12")
    (data / "sst2" / "train.parquet").write_bytes(os.urandom(300_000))
    offline_kit.build(tmp_path / "kit-b", data, [], part_mib=0.2, python_version="3.12")
    home = tmp_path / "home"
    offline_kit.receive(_upload(tmp_path / "kit-a", 1, tmp_path / "job"), home)
    with pytest.raises(offline_kit.KitError, match="belongs to another kit"):
        offline_kit.receive(_upload(tmp_path / "kit-b", 2, tmp_path / "job"), home)


def test_bad_build_inputs_are_named(tmp_path):
    with pytest.raises(offline_kit.KitError, match="has no MANIFEST.md"):
        offline_kit.build(tmp_path / "kit", tmp_path, [], part_mib=10, python_version="3.12")
    with pytest.raises(offline_kit.KitError, match="the source tree leaves no room in the upload budget; pass --part-mib"):
        offline_kit.build(tmp_path / "kit", _data_dir(tmp_path), [], part_mib=-3.2, python_version="3.12")
    with pytest.raises(offline_kit.KitError, match="no-such-distribution is not installed here"):
        offline_kit.download_wheels(tmp_path / "w", ["no-such-distribution"], "3.12")


def _fake_gpu_python(tmp_path: Path) -> Path:
    """Claims a GPU; an ``oelm run ... --output-dir X`` call writes a run with a result and weights."""
    bin_dir = tmp_path / "bin"
    fake_gpu_python(bin_dir, """\
if [ "$3" = "env" ]; then echo '{"cuda": {"name": "Fake GPU 80GB HBM3"}, "timestamp_utc": "2026-11-25T12:00:00+00:00"}'; exit 0; fi
for ((i = 1; i <= $#; i++)); do
  if [ "${!i}" = "--output-dir" ]; then
    j=$((i + 1)); run="${!j}/runs/baseline-seed0"
    mkdir -p "$run/checkpoints" "${!j}/tensorboard"
    echo '{"status": "finished", "timing": {"per_step_ms": {"median": 7.5}}}' > "$run/result.json"
    echo weights > "$run/model.safetensors"; echo state > "$run/checkpoints/optimizer.pt"
    echo events > "${!j}/tensorboard/events.out.tfevents.1"; echo '{}' > "${!j}/tokenizer.json"
  fi
done
exit 0""")
    return bin_dir


def test_check_groups_archive_without_weights_and_collect_merges_them(tmp_path, monkeypatch):
    bin_dir = _fake_gpu_python(tmp_path)
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")
    home = tmp_path / "home"
    with pytest.raises(offline_kit.KitError, match="no ready kit"):
        offline_kit.check("env", "runs", tmp_path / "a.tar.gz", 60, home=home, python=str(bin_dir / "python"))
    offline_kit.build(tmp_path / "kit", _data_dir(tmp_path), [], part_mib=1, python_version="3.12")
    assert offline_kit.receive(_upload(tmp_path / "kit", 1, tmp_path / "job"), home)
    python = str(bin_dir / "python")
    assert offline_kit.check("env nvidia-smi bench-proxy", "bench", tmp_path / "back" / "bench.tar.gz", 60, home=home, python=python) == 0
    assert offline_kit.check("env sst2", "runs", tmp_path / "back" / "runs.tar.gz", 60, home=home, python=python) == 0
    with tarfile.open(tmp_path / "back" / "runs.tar.gz") as tar:
        names = set(tar.getnames())
    assert "sst2/runs/baseline-seed0/result.json" in names and "offline-kit.json" in names
    assert not [n for n in names if n.endswith((".safetensors", ".pt")) or "tfevents" in n or n == "sst2/tokenizer.json"]
    into = offline_kit.collect([tmp_path / "back" / "bench.tar.gz", tmp_path / "back" / "runs.tar.gz"], tmp_path / "merged")
    rows = [line.split("\t") for line in (into / "steps.tsv").read_text().splitlines()]
    assert rows[0] == ["step", "exit_status", "seconds", "log"]
    assert [r[0] for r in rows[1:]] == ["env", "nvidia-smi", "bench-proxy", "sst2"]  # env once, the groups in order
    summary = (into / "SUMMARY.md").read_text()
    assert "| bench-proxy | ok |" in summary and "| sst2 | ok |" in summary
    assert "| sst2 | baseline-seed0 | finished |" in summary and "7.50" in summary
    assert (into / "logs" / "bench-proxy.log").is_file() and not (into / "offline-kit.json").exists()
    # without --into: docs/results/gpu-<day>-<gpu slug> from env.json (checked by name, not written there)
    monkeypatch.setattr(offline_kit, "ROOT", tmp_path)
    default = offline_kit.collect([tmp_path / "back" / "bench.tar.gz"], None)
    assert default == tmp_path / "docs" / "results" / "gpu-20261125-fake-gpu-80gb-hbm3"
