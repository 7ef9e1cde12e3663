"""The GPU check's dry run (scripts/gpu_dry_run.py): both parts of scripts/gpu_check.sh end to end on
this CPU, with the same command the device runs (``offline_kit.py run PART``), the same kind of kit
folder (wheels downloaded as for the device, the part's real data) and a Python that lacks pydantic,
datasets and Ray like the GPU image, so the first GPU command cannot fail on a missing file,
package or path. Also: the Python stand-in really lacks pydantic; the lane choice of
scripts/gpu_lanes.py follows its measured table."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts"))
try:
    import gpu_dry_run
    import gpu_lanes
    import offline_kit
finally:
    sys.path.pop(0)

DATA = Path(os.environ.get("OELM_DATA_DIR") or ROOT.parent / "shared" / "data")


def test_choose_lanes_predicts_the_matrix_time_from_the_measured_rates():
    table = [{"lanes": 1, "steps_per_s": 10.0}, {"lanes": 2, "steps_per_s": 19.0}, {"lanes": 3, "steps_per_s": 27.0},
             {"lanes": 4, "steps_per_s": 30.0}, {"lanes": 1, "steps_per_s": 9.0}]
    lanes, predictions = gpu_lanes.choose_lanes(table, runs=9)
    # 9 runs: 1 lane 9 x 1/9 = 1.0; 2 lanes 5 rounds x 2/19 = 0.526; 3 lanes 3 x 3/27 = 0.333; 4 lanes 3 x 4/30 = 0.4
    assert lanes == 3 and [round(p["relative_time"], 3) for p in predictions] == [1.0, 0.526, 0.333, 0.4]
    assert predictions[0]["steps_per_s"] == 9.0  # 1 lane measured first and last: the lower rate counts
    # no gain from a second lane: one lane (timing-grade) wins the tie
    assert gpu_lanes.choose_lanes([{"lanes": 1, "steps_per_s": 10.0}, {"lanes": 2, "steps_per_s": 10.0}], runs=2)[0] == 1
    assert gpu_lanes.choose_lanes([], runs=9)[0] == 1  # a failed measurement: one lane
    assert gpu_lanes.choose_lanes(table, runs=2)[0] == 2  # never more lanes than runs


def test_the_stand_in_python_lacks_what_the_gpu_image_lacks(tmp_path):
    python = gpu_dry_run.shadow_python(tmp_path / "venv", ("pydantic", "datasets"))
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}

    def imports(code: str, **extra: str) -> subprocess.CompletedProcess:
        return subprocess.run([str(python), "-c", code], capture_output=True, text=True, env={**env, **extra})

    assert imports("import torch, transformers, tokenizers").returncode == 0
    assert "No module named 'pydantic'" in imports("import pydantic").stderr
    assert "No module named 'datasets'" in imports("import datasets").stderr
    assert "No module named 'oelm'" in imports("import oelm").stderr  # not this venv's editable install either
    # oelm from src/ starts (its import is light) and fails only where it needs pydantic
    assert imports("import oelm", PYTHONPATH=str(ROOT / "src")).returncode == 0
    assert "No module named 'pydantic'" in imports("import oelm.config", PYTHONPATH=str(ROOT / "src")).stderr


@pytest.fixture(scope="module")
def kits(tmp_path_factory):
    """Both parts' kits, built as `offline_kit.py build` builds them (wheels downloaded for CPython
    3.12 and this Python); skipped where the package index is out of reach."""
    if not (DATA / "MANIFEST.md").is_file():
        pytest.skip(f"no data folder at {DATA}")
    out = tmp_path_factory.mktemp("kits")
    try:
        for part in offline_kit.PARTS:
            offline_kit.build(part, out, DATA)
    except offline_kit.KitError as exc:
        if "pip download" in str(exc):
            pytest.skip(f"the wheels cannot be downloaded here: {exc}")
        raise
    return out


def _dry_run(part: str, kits: Path, tmp_path: Path, **env: str) -> tuple[subprocess.CompletedProcess, dict]:
    archive = tmp_path / "back" / f"gpu-{part}.tar.gz"
    # the steps' deadline: the part's GPU budget is for an H100; a CI machine's two loaded cores get 15 minutes
    res = subprocess.run([sys.executable, str(ROOT / "scripts" / "gpu_dry_run.py"), part, "--archive", str(archive),
                          "--kit", str(kits), "--budget-s", "900"], capture_output=True, text=True, timeout=1500,
                         env={**os.environ, "OELM_DATA_DIR": "/nonexistent", **env}, cwd=ROOT)  # the kit's data only
    files = {}
    if archive.is_file():
        with tarfile.open(archive) as tar:
            files = {m.name: tar.extractfile(m).read() for m in tar.getmembers() if m.isfile()}
    return res, files


def _steps(files: dict) -> dict[str, str]:
    return {line.split("\t")[0]: line.split("\t")[1] for line in files["steps.tsv"].decode().splitlines()[1:]}


def test_the_kits_leave_20_mib_of_the_device_tools_upload_beside_this_tree(kits):
    """Beside this checkout's light tree (``offline_kit.py light``: docs/results left out, whatever is
    committed there), each real kit leaves at least 20 MiB of the 64 MiB free (``build`` refuses
    otherwise: issue 47), and carries only the device's wheels."""
    for part in offline_kit.PARTS:
        sizes = offline_kit.check_travel(kits / part)
        assert sizes["kit"] < offline_kit.KIT_LIMIT_MIB and sizes["light_headroom"] >= offline_kit.HEADROOM_MIB == 20, (part, sizes)
        assert sizes["light_tree"] < sizes["tree"] or offline_kit.kit_light.notice(ROOT)  # equal only while light
        wheels = sorted(p.name for p in (kits / part / "wheels").glob("*.whl"))
        assert any("cp312-cp312-manylinux" in w and w.startswith("pydantic_core-") for w in wheels), wheels
        assert all("-cp312-" in w or "-py3-none-any" in w for w in wheels), wheels  # this Python's own: host-wheels/


def test_the_kit_installs_into_a_python_without_pydantic_and_oelm_starts(kits, tmp_path):
    """The first minute of the device command: check the kit, install its wheels, run `oelm env`."""
    res, files = _dry_run("speed", kits, tmp_path, GPU_CHECK_STEPS="env nvidia-smi")
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    assert "a Python without pydantic, pydantic-core, annotated-types, typing-inspection, datasets, ray" in res.stdout
    assert "installed pydantic-2" in res.stdout and _steps(files) == {"env": "0", "nvidia-smi": "0"}
    assert json.loads(files["env.json"])["packages"]["pydantic"]  # pydantic came from the kit


@pytest.mark.slow
def test_part_speed_dry_runs_end_to_end(kits, tmp_path):
    res, files = _dry_run("speed", kits, tmp_path)
    assert res.returncode == 0, res.stdout[-5000:] + res.stderr[-3000:]
    steps = _steps(files)
    assert list(steps) == ["env", "nvidia-smi", "pytest-cuda", "bench-gpt2-124m", "bench-gpt2-124m-compile",
                           "bench-gpt2-124m-reduce-overhead", "bench-minilm", "bench-minilm-reduce-overhead", "bench-proxy",
                           "bench-proxy-reduce-overhead", "tinystories", "tinystories-reduce-overhead"]
    assert set(steps.values()) == {"0"}, steps
    bench = json.loads(files["bench-gpt2-124m-bf16-nocompile.json"])
    assert bench["data"].startswith("tinystories train, gpt2 tokenizer")  # the kit's TinyStories and GPT-2 files
    assert json.loads(files["bench-minilm-cls-bf16-reduce-overhead.json"])["config"]["compile_mode"] == "reduce-overhead"
    assert "tinystories-reduce-overhead/runs/baseline-seed0/result.json" in files
    assert not [n for n in files if n.endswith((".safetensors", ".pt"))]


@pytest.mark.slow
def test_part_scale_dry_runs_end_to_end(kits, tmp_path):
    res, files = _dry_run("scale", kits, tmp_path)
    assert res.returncode == 0, res.stdout[-5000:] + res.stderr[-3000:]
    assert _steps(files) == {"env": "0", "nvidia-smi": "0", "imdb": "0"}
    lanes = json.loads(files["imdb/lanes.json"])
    assert lanes["measurement"]["predictions"] and lanes["lanes"] in (1, 2)
    assert [r["exit_status"] for r in lanes["runs"]] == [0, 0, 0]
    comparison = json.loads(files["imdb/comparison.json"])
    assert set(comparison["methods"]) == {"baseline", "oelm_freeze", "oelm_random"}
    assert comparison["reference"] == {"baseline": 78.56, "oelm_freeze": 85.7}
    result = json.loads(files["imdb/runs/oelm_freeze-seed0/result.json"])
    assert result["status"] == "finished" and result["performance"]["test"] is not None  # the test split, once
    assert result["learning_rate"] == 1e-3  # the original's OELM rate
