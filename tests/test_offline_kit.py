"""scripts/offline_kit.py: the GPU check's kit folder, checked on the way in, and the archives that
come back, checked member by member before anything is extracted.

Checked here without a GPU or a download: a kit of small wheels made here and a small data folder
is built with its manifest; every damaged kit (missing, cut or hostile manifest, a changed, missing
or unlisted file) is refused with one line; the wheels that fit this Python are installed by pip
with --no-index --target, a fallback only where a carried wheel needs it; ``run`` checks, installs,
runs two real steps of gpu_check.sh (dry run) and archives; ``collect`` refuses archives with
absolute paths, ``..``, links leaving the folder or device files, on this Python and with
tarfile's data filter taken away, and one line names a non-tar or cut archive."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

import pytest
from _gpu_check_fakes import fake_gpu_python

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts"))
try:
    import offline_kit
finally:
    sys.path.pop(0)


def _wheel(folder: Path, name: str, version: str, requires: tuple[str, ...] = (), tag: str = "py3-none-any") -> Path:
    """A small, real, installable wheel: one module ``<name>`` whose VERSION is ``version``."""
    folder.mkdir(parents=True, exist_ok=True)
    mod = name.replace("-", "_")
    path = folder / f"{mod}-{version}-{tag}.whl"
    info = f"{mod}-{version}.dist-info"
    meta = f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n" + "".join(f"Requires-Dist: {r}\n" for r in requires)
    files = {f"{mod}/__init__.py": f"VERSION = {version!r}\n", f"{info}/METADATA": meta,
             f"{info}/WHEEL": f"Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: {tag}\n"}
    files[f"{info}/RECORD"] = "".join(f"{n},,\n" for n in files) + f"{info}/RECORD,,\n"
    with zipfile.ZipFile(path, "w") as z:
        for n, text in files.items():
            z.writestr(n, text)
    return path


@pytest.fixture
def kit_parts(tmp_path, monkeypatch):
    """A data folder laid out like shared/data, two small wheels, and PACKAGES/FALLBACK naming them."""
    data = tmp_path / "data"
    for rel in ("tinystories/validation_head_sample.txt.gz", "tokenizers/gpt2/vocab.json", "imdb/train.parquet"):
        (data / rel).parent.mkdir(parents=True, exist_ok=True)
        (data / rel).write_bytes(os.urandom(2000))
    (data / "MANIFEST.md").write_text("# data\n")
    wheels = tmp_path / "wheels"
    _wheel(wheels, "kit-alpha", "1.0", requires=("kit-helper>=2.0",))
    _wheel(wheels, "kit-helper", "2.0")
    _wheel(wheels, "kit-alpha", "1.0", tag="cp27-cp27m-manylinux1_x86_64")  # fits no Python here: never chosen
    monkeypatch.setattr(offline_kit, "PACKAGES", ("kit-alpha",))
    monkeypatch.setattr(offline_kit, "FALLBACK", ("kit-helper",))
    return data, wheels


def test_build_writes_the_parts_data_wheels_and_a_manifest(kit_parts, tmp_path):
    data, wheels = kit_parts
    kit = offline_kit.build("speed", tmp_path / "kits", data, wheels_from=wheels)
    manifest = offline_kit.verify(kit)
    assert manifest["part"] == "speed" and manifest["packages"] == ["kit-alpha"] and manifest["fallback"] == ["kit-helper"]
    names = set(manifest["files"])
    assert names == {"data.tar.gz", *(f"wheels/{w.name}" for w in wheels.glob("*.whl"))}
    # the data files the part reads, in one archive, each listed with the size and sha256 of its source
    read = ["MANIFEST.md", "tinystories/validation_head_sample.txt.gz", "tokenizers/gpt2/vocab.json"]  # not IMDB
    assert sorted(manifest["data"]) == read
    assert all(manifest["data"][n]["sha256"] == offline_kit._sha256(data / n) for n in read)
    with tarfile.open(kit / "data.tar.gz") as tar:
        assert sorted(m.name for m in tar.getmembers() if m.isfile()) == read  # real files: links would travel as links
    unpacked = offline_kit.unpack_data(kit, manifest, tmp_path / "unpacked")
    assert all((unpacked / n).read_bytes() == (data / n).read_bytes() for n in read)


def test_a_kit_over_its_limit_or_a_data_folder_without_the_parts_files_is_refused(kit_parts, tmp_path, monkeypatch):
    data, wheels = kit_parts
    with pytest.raises(offline_kit.KitError, match=r"wheels lacks MANIFEST.md, tinystories, tokenizers/gpt2 \(part speed reads them\); pass --data-dir"):
        offline_kit.build("speed", tmp_path / "kits", tmp_path / "wheels", wheels_from=wheels)
    monkeypatch.setattr(offline_kit, "KIT_LIMIT_MIB", 0.001)
    with pytest.raises(offline_kit.KitError, match=r"is 0\.0 MiB, over 0 MiB \(largest: .*\); leave data out of PARTS"):
        offline_kit.build("scale", tmp_path / "kits", data, wheels_from=wheels)


def _checkout(tmp_path: Path) -> Path:
    """A git checkout with a tracked file, an untracked one git does not ignore, an ignored folder
    and an ignored ``shared/`` folder (which the device tool sends all the same)."""
    repo = tmp_path / "checkout"
    for rel, size in (("src/a.py", 3000), ("notes.txt", 1000), ("ignored/big.bin", 50 << 20), ("shared/data.bin", 2000)):
        (repo / rel).parent.mkdir(parents=True, exist_ok=True)
        with (repo / rel).open("wb") as f:
            f.truncate(size)  # sparse: the size counts, no disk is written
    (repo / ".gitignore").write_text("/ignored/\n/shared/\n")
    subprocess.run(["git", "init", "-q"], cwd=repo, check=True)
    subprocess.run(["git", "add", "src/a.py", ".gitignore"], cwd=repo, check=True)
    return repo


def test_build_measures_the_tree_and_kit_that_travel_and_refuses_less_than_20_mib_headroom(kit_parts, tmp_path, monkeypatch,
                                                                                           capsys):
    """The sizes ``build`` computes are what the device tool sends: tracked and untracked-not-ignored
    files and shared/ (not the 50 MiB ignored folder), plus the kit, with the whole tree and with
    the light one (docs/results left out: tests/test_kit_light.py); a 45 MiB file committed outside
    docs/results leaves less than 20 of the 64 MiB free even beside the light tree, and the kit is
    refused in one line that names the sizes and the folder, and removed."""
    data, wheels = kit_parts
    repo = _checkout(tmp_path)
    (repo / "docs" / "results").mkdir(parents=True)
    (repo / "docs" / "results" / "README.md").write_bytes(b"r" * 5000)
    subprocess.run(["git", "add", "docs/results/README.md"], cwd=repo, check=True)
    kit = offline_kit.build("speed", tmp_path / "kits", data, wheels_from=wheels, root=repo)
    sizes = offline_kit.check_travel(kit, repo)
    light = 3000 + 1000 + 2000 + len("/ignored/\n/shared/\n")
    tree = light + 5000
    carried = sum(p.stat().st_size for p in kit.rglob("*") if p.is_file())
    assert sizes["tree"] == pytest.approx(tree / 2**20) and sizes["kit"] == pytest.approx(carried / 2**20)
    assert sizes["total"] == pytest.approx((tree + carried) / 2**20) and sizes["headroom"] == pytest.approx(64 - sizes["total"])
    assert sizes["light_tree"] == pytest.approx(light / 2**20) and sizes["light_total"] == pytest.approx((light + carried) / 2**20)
    assert sizes["light_headroom"] == pytest.approx(64 - sizes["light_total"])

    planted = repo / "assets" / "new-model" / "weights.bin"
    planted.parent.mkdir(parents=True)
    with planted.open("wb") as f:
        f.truncate(45 << 20)
    subprocess.run(["git", "add", str(planted)], cwd=repo, check=True)
    with pytest.raises(offline_kit.KitError, match=r"^speed: even with the light tree \(docs/results left out\) the device command "
                       r"would send 45\.\d MiB \(working tree 45\.0 MiB \+ kit 0\.\d MiB\) of its 64 MiB, leaving 1[89]\.\d MiB, "
                       r"under the 20 MiB kept free \(docs/scaling.md\); the light tree's largest folders: assets/new-model 45\.0 MiB, "
                       r"src 0\.0 MiB, shared 0\.0 MiB; .* \(kit removed\)$"):
        offline_kit.build("speed", tmp_path / "kits", data, wheels_from=wheels, root=repo)
    assert not kit.exists()  # a refused kit cannot be carried by mistake

    # the command line: one line on stderr, exit status 2
    monkeypatch.setattr(offline_kit, "ROOT", repo)
    code = offline_kit.main(["build", "speed", "--out", str(tmp_path / "kits"), "--data-dir", str(data), "--wheels-from", str(wheels)])
    err = capsys.readouterr().err
    assert code == 2 and err.startswith("offline kit: speed: even with the light tree") and err.count("\n") == 1
    subprocess.run(["git", "rm", "-q", "-f", str(planted)], cwd=repo, check=True)  # out of the tree: 20 MiB free again
    assert offline_kit.main(["build", "speed", "--out", str(tmp_path / "kits"), "--data-dir", str(data),
                             "--wheels-from", str(wheels)]) == 0
    assert "MiB free (at least 20 kept); without `light`: the whole tree (0.0 MiB)" in capsys.readouterr().out


@pytest.mark.parametrize("damage, message", [
    (lambda kit: (kit / "manifest.json").unlink(), r"no kit at .* \(no manifest.json\): build it with"),
    (lambda kit: (kit / "manifest.json").write_text((kit / "manifest.json").read_text()[:150]),
     r"manifest.json is damaged or cut short \(JSONDecodeError"),
    (lambda kit: (kit / "manifest.json").write_text('{"files": {"data/x": {"bytes": "many"}}}'), r"damaged or cut short \(ValueError"),
    (lambda kit: _rewrite(kit, "../../etc/passwd"), r"names '../../etc/passwd': a path with '..' leaves the folder"),
    (lambda kit: _rewrite(kit, "/etc/passwd"), r"names '/etc/passwd': an absolute path"),
    (lambda kit: (kit / "data.tar.gz").write_text("changed\n"), r"data.tar.gz is damaged \(size or sha256 differs"),
    (lambda kit: (kit / "data.tar.gz").unlink(), r"data.tar.gz is missing \(listed in .*\); carry the whole kit"),
    (lambda kit: (kit / "wheels" / "extra.bin").write_bytes(b"x"), r"holds wheels/extra.bin, which its manifest does not list"),
])
def test_a_damaged_kit_is_refused_in_one_line(kit_parts, tmp_path, damage, message, capsys):
    data, wheels = kit_parts
    kit = offline_kit.build("speed", tmp_path / "kits", data, wheels_from=wheels)
    damage(kit)
    with pytest.raises(offline_kit.KitError, match=message):
        offline_kit.verify(kit)
    # the command line: one line on stderr, exit status 2, nothing run
    code = offline_kit.main(["run", "speed", "--archive", str(tmp_path / "a.tar.gz"), "--kit", str(tmp_path / "kits")])
    err = capsys.readouterr().err
    assert code == 2 and err.startswith("offline kit: ") and err.count("\n") == 1
    assert not (tmp_path / "a.tar.gz").exists()


def _rewrite(kit: Path, name: str) -> None:
    manifest = json.loads((kit / "manifest.json").read_text())
    manifest["files"][name] = {"bytes": 1, "sha256": "0" * 64}
    (kit / "manifest.json").write_text(json.dumps(manifest))


@pytest.mark.parametrize("change, message", [
    (lambda m: m["data"]["MANIFEST.md"].update(sha256="0" * 64), r"unpacked/MANIFEST.md from .*data.tar.gz differs from its "
                                                                  r"manifest entry; build the kit again"),
    (lambda m: m["data"].pop("MANIFEST.md"), r"data.tar.gz holds other files than .*manifest.json lists \(MANIFEST.md\)"),
    (lambda m: m["data"].update({"imdb/train.parquet": {"bytes": 1, "sha256": "0" * 64}}), r"\(imdb/train.parquet\)"),
    (lambda m: m.pop("data"), r"has no data.tar.gz with its manifest's data list \(an older kit\); build the kit again"),
])
def test_the_unpacked_data_is_checked_file_by_file_against_the_manifest(kit_parts, tmp_path, change, message):
    data, wheels = kit_parts
    kit = offline_kit.build("speed", tmp_path / "kits", data, wheels_from=wheels)
    manifest = offline_kit.verify(kit)
    change(manifest)
    with pytest.raises(offline_kit.KitError, match=message):
        offline_kit.unpack_data(kit, manifest, tmp_path / "unpacked")


def test_the_wheels_that_fit_are_installed_and_the_fallback_only_where_needed(kit_parts, tmp_path, monkeypatch):
    data, wheels = kit_parts
    kit = offline_kit.build("speed", tmp_path / "kits", data, wheels_from=wheels)
    manifest = offline_kit.verify(kit)
    site = tmp_path / "site"
    # kit-helper is not installed here: kit-alpha's requirement is unmet, so the fallback goes in
    assert offline_kit.install(kit, manifest, site) == ["kit_alpha-1.0-py3-none-any.whl", "kit_helper-2.0-py3-none-any.whl"]
    out = subprocess.run([sys.executable, "-c", "import kit_alpha, kit_helper; print(kit_alpha.VERSION, kit_helper.__file__)"],
                         capture_output=True, text=True, env={**os.environ, "PYTHONPATH": str(site)})
    assert out.stdout.split()[0] == "1.0" and out.stdout.split()[1].startswith(str(site))
    # where this Python already has a new enough kit-helper (here: the one just installed), it is left out
    assert [w.name for w in offline_kit.choose_wheels(kit, manifest, site)] == ["kit_alpha-1.0-py3-none-any.whl"]
    # a distribution without a wheel for this Python: one line naming it and the fix
    for wheel in (kit / "wheels").glob("kit_alpha-1.0-py3*"):
        wheel.unlink()
    with pytest.raises(offline_kit.KitError, match=r"has no kit-alpha wheel for this Python \(3\.\d+, linux\); build the kit "
                                                    r"with --python-version 3\.\d+"):
        offline_kit.choose_wheels(kit, manifest, site)


def test_run_checks_installs_runs_the_part_and_archives_without_weights(kit_parts, tmp_path, monkeypatch):
    """``run`` as on the device, with GPU_CHECK_DRY_RUN and two real steps (`oelm env`, a stand-in
    nvidia-smi): the archive holds their output and the record of the run, SUMMARY.md lies beside it."""
    data, wheels = kit_parts
    offline_kit.build("speed", tmp_path / "kits", data, wheels_from=wheels)
    fake_gpu_python(tmp_path / "bin", "exit 0")  # only its nvidia-smi is used
    monkeypatch.setenv("PATH", f"{tmp_path / 'bin'}:{os.environ['PATH']}")
    monkeypatch.setenv("GPU_CHECK_DRY_RUN", "1")
    monkeypatch.setenv("GPU_CHECK_STEPS", "env nvidia-smi")
    archive = tmp_path / "back" / "gpu-speed.tar.gz"
    assert offline_kit.run("speed", archive, 120, tmp_path / "kits", work=tmp_path / "work") == 0
    with tarfile.open(archive) as tar:
        names = set(tar.getnames())
        record = json.loads(tar.extractfile("offline-kit.json").read())
        steps = tar.extractfile("steps.tsv").read().decode().splitlines()
    assert {"env.json", "nvidia-smi.txt", "SUMMARY.md", "logs/env.log"} <= names
    assert [line.split("\t")[:2] for line in steps[1:]] == [["env", "0"], ["nvidia-smi", "0"]]
    assert record["part"] == "speed" and record["exit_status"] == 0 and "kit_alpha-1.0-py3-none-any.whl" in record["wheels"]
    assert (tmp_path / "back" / "SUMMARY-speed.md").is_file()
    env = json.loads((tmp_path / "work" / "gpu-speed" / "env.json").read_text())
    assert env["packages"]["oelm"]  # oelm came from src/ on PYTHONPATH
    assert (tmp_path / "work" / "data" / "tokenizers" / "gpt2" / "vocab.json").read_bytes() == (data / "tokenizers/gpt2/vocab.json").read_bytes()


def _archive(path: Path, *members: tuple[tarfile.TarInfo, bytes | None]) -> Path:
    with tarfile.open(path, "w:gz") as tar:
        for info, data in members:
            tar.addfile(info, io.BytesIO(data) if data is not None else None)
    return path


def _file(name: str, data: bytes = b"ok") -> tuple[tarfile.TarInfo, bytes]:
    info = tarfile.TarInfo(name)
    info.size = len(data)
    return info, data


def _link(name: str, target: str, kind: bytes = tarfile.SYMTYPE) -> tuple[tarfile.TarInfo, None]:
    info = tarfile.TarInfo(name)
    info.type, info.linkname = kind, target
    return info, None


def _special(name: str, kind: bytes) -> tuple[tarfile.TarInfo, None]:
    info = tarfile.TarInfo(name)
    info.type = kind
    return info, None


HOSTILE = [
    ("absolute", [_file("/tmp/oelm-kit-test-escape")], r"names '/tmp/oelm-kit-test-escape': an absolute path"),
    ("dotdot", [_file("logs/../../escape.txt")], r"names 'logs/../../escape.txt': a path with '..' leaves the folder"),
    ("symlink out", [_link("logs/passwd", "/etc/passwd")], r"holds a link 'logs/passwd' -> '/etc/passwd' leaving the folder"),
    ("symlink up", [_link("logs/up", "../../..")], r"holds a link 'logs/up' -> '../../..' leaving the folder"),
    ("link then file", [_link("d", "."), _file("d/../x")], r"a path with '..' leaves the folder"),
    ("hardlink out", [_link("h", "/etc/shadow", tarfile.LNKTYPE)], r"holds a link 'h' -> '/etc/shadow' leaving the folder"),
    ("fifo", [_special("pipe", tarfile.FIFOTYPE)], r"holds 'pipe', a device file or pipe"),
    ("device", [_special("dev", tarfile.CHRTYPE)], r"holds 'dev', a device file or pipe"),
]


@pytest.mark.parametrize("without_data_filter", [False, True], ids=["this-python", "no-data-filter"])
@pytest.mark.parametrize("label, members, message", HOSTILE, ids=[h[0] for h in HOSTILE])
def test_hostile_archive_members_are_refused_before_anything_is_extracted(tmp_path, monkeypatch, label, members, message,
                                                                          without_data_filter):
    """oelm's own member check, also where tarfile has no data filter (Python < 3.10.12 / 3.11.4):
    an innocent first member is not extracted either."""
    if without_data_filter:
        monkeypatch.delattr(tarfile, "data_filter", raising=False)
    archive = _archive(tmp_path / "hostile.tar.gz", _file("env.json", b"{}"), *members)
    dest = tmp_path / "dest"
    with pytest.raises(offline_kit.KitError, match=message):
        offline_kit.safe_extract(archive, dest)
    assert not dest.exists() or not any(dest.rglob("*"))
    assert not Path("/tmp/oelm-kit-test-escape").exists() and not (tmp_path / "escape.txt").exists()


def test_links_inside_the_folder_are_kept(tmp_path):
    archive = _archive(tmp_path / "ok.tar.gz", _file("logs/a.log", b"a"), _link("logs/latest.log", "a.log"))
    assert offline_kit.safe_extract(archive, tmp_path / "dest") == ["logs/a.log", "logs/latest.log"]
    assert (tmp_path / "dest" / "logs" / "latest.log").read_text() == "a"


@pytest.mark.parametrize("make, message", [
    (lambda p: p.write_text("this is no archive\n"), r"is not a \(whole\) tar archive"),
    (lambda p: p.write_bytes(b""), r"is not a \(whole\) tar archive"),
    (lambda p: (_archive(p, _file("env.json", os.urandom(200_000))), p.write_bytes(p.read_bytes()[:60_000])),
     r"(is cut short or damaged|is not a \(whole\) tar archive)"),
    (lambda p: None, r"does not exist"),
])
def test_a_damaged_archive_is_one_line(tmp_path, make, message, capsys):
    archive = tmp_path / "back.tar.gz"
    make(archive)
    with pytest.raises(offline_kit.KitError, match=message):
        offline_kit.safe_extract(archive, tmp_path / "dest")
    assert offline_kit.main(["collect", str(archive), "--into", str(tmp_path / "into")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("offline kit: ") and err.count("\n") == 1 and "Traceback" not in err
    assert not (tmp_path / "into").exists()


def _part_archive(tmp_path: Path, name: str, gpu: str, steps: list[str]) -> Path:
    env = json.dumps({"cuda": {"name": gpu}, "timestamp_utc": "2026-11-25T12:00:00+00:00"}).encode()
    rows = "step\texit_status\tseconds\tlog\n" + "".join(f"{s}\t0\t1\tlogs/{s}.log\n" for s in steps)
    return _archive(tmp_path / f"{name}.tar.gz", _file("env.json", env), _file("steps.tsv", rows.encode()),
                    *[_file(f"logs/{s}.log", b"done\n") for s in steps], _file("offline-kit.json", b"{}"))


def test_collect_merges_the_parts_and_refuses_archives_of_different_gpus(tmp_path, monkeypatch):
    speed = _part_archive(tmp_path, "gpu-speed", "NVIDIA H100 80GB HBM3", ["env", "nvidia-smi", "bench-proxy"])
    scale = _part_archive(tmp_path, "gpu-scale", "NVIDIA H100 80GB HBM3", ["env", "nvidia-smi", "imdb"])
    into = offline_kit.collect([speed, scale], tmp_path / "merged")
    rows = [line.split("\t")[0] for line in (into / "steps.tsv").read_text().splitlines()[1:]]
    assert rows == ["env", "nvidia-smi", "bench-proxy", "imdb"]  # env once, the parts in order
    assert (into / "logs" / "imdb.log").is_file() and not (into / "offline-kit.json").exists()
    assert "| imdb | ok |" in (into / "SUMMARY.md").read_text()
    monkeypatch.setattr(offline_kit, "ROOT", tmp_path)  # the default folder, by name (not written into docs/)
    assert offline_kit.collect([speed], None) == tmp_path / "docs" / "results" / "gpu-20261125-nvidia-h100-80gb-hbm3"
    other = _part_archive(tmp_path, "gpu-scale-h200", "NVIDIA H200", ["env", "imdb"])
    with pytest.raises(offline_kit.KitError, match=r"come from different GPUs .*NVIDIA H200.*collect each into its own folder"):
        offline_kit.collect([speed, other], tmp_path / "mixed")
    assert not (tmp_path / "mixed").exists()


def test_run_refuses_an_out_of_range_budget(capsys):
    assert offline_kit.main(["run", "speed", "--archive", "/tmp/x.tar.gz", "--budget-s", "999999"]) == 2
    assert "--budget-s 999999 is outside 1..3600 seconds" in capsys.readouterr().err
