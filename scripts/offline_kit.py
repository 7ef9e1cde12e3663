"""The GPU check's kit: what a GPU machine with no network needs beside the source tree, one folder per part.

A lent GPU machine (docs/scaling.md, "The GPU check in two commands") receives the working tree and
a few git-ignored folders (``carry``), at most 64 MiB per command, runs one command of at most 10
minutes and reaches no package index. Its Python (3.12) already has torch, transformers, accelerate,
tokenizers, pandas, pyarrow, ... but not pydantic. So each part of ``scripts/gpu_check.sh`` gets a
kit folder of its own, under 30 MiB:

    here:   python scripts/offline_kit.py build speed        # -> .gpu-kit/speed/ (git-ignored)
            python scripts/offline_kit.py build scale        # -> .gpu-kit/scale/
    there:  python3 scripts/offline_kit.py run speed --archive "$OUT/gpu-speed.tar.gz"
    here:   python scripts/offline_kit.py collect gpu-speed.tar.gz gpu-scale.tar.gz   # -> docs/results/gpu-<date>-<gpu>/

and before the device commands, the same ``run`` on this machine's CPU under a Python without
pydantic (``python scripts/gpu_dry_run.py speed``; scripts/gpu_dry_run.py).

A kit holds ``wheels/`` (pydantic and its three dependencies at the versions CI tests, for CPython
3.12 manylinux x86-64 and for this machine's Python, so the CPU dry run uses the same folder;
``typing-extensions`` as a fallback, installed only where the Python's own copy is older than
pydantic needs), ``data/`` (only the files the part reads, from ``$OELM_DATA_DIR``) and
``manifest.json`` (every file's size and sha256). ``run`` checks the manifest, installs the wheels
that fit the running Python with ``pip install --no-index --no-deps --target``, runs the part with
oelm from ``src/`` on ``PYTHONPATH`` and a deadline, and writes the output folder as one tar.gz
(no weights or checkpoints) plus its SUMMARY.md beside it. ``collect`` checks every archive member
itself before extracting anything (a relative path, no ``..``, no link leaving the folder, no
device file), on every Python, not only where tarfile's ``data`` filter exists.

Every refusal is one line ``offline kit: ...`` naming the file and the fix, exit status 2. Standard
library only (``packaging`` where present): it runs on the GPU machine's own Python.
"""

from __future__ import annotations

import argparse
import gzip
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
import zlib
from importlib import metadata
from pathlib import Path, PurePosixPath

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_KIT = ROOT / ".gpu-kit"
MiB = 1 << 20
KIT_LIMIT_MIB = 30.0  # one part's kit
UPLOAD_LIMIT_MIB = 64.0  # what one command of the device tool may take: the tree and every carried folder
# The data each part reads, relative to the data folder (shared/data's layout).
PARTS = {
    "speed": ("MANIFEST.md", "tinystories", "tokenizers/gpt2"),
    "scale": ("MANIFEST.md", "imdb", "tokenizers/gpt2"),
}
# Seconds the part's steps may take (GPU_CHECK_DEADLINE), chosen so the device command ends inside
# its timeout (docs/scaling.md gives both): install, start and archive take ~15 s more.
BUDGET_S = {"speed": 340, "scale": 360}
# What the GPU image lacks: pydantic and its dependencies (KINDS.md's package list). typing-extensions
# is there, but perhaps older than pydantic needs: carried, installed only then.
PACKAGES = ("pydantic", "pydantic-core", "annotated-types", "typing-inspection")
FALLBACK = ("typing-extensions",)
# Left out of an archive, as scripts/collect_results.sh leaves them out of docs/results.
_SKIP_SUFFIXES = (".safetensors", ".pt", ".lock")
_SKIP_PARTS = ("checkpoints", "tensorboard")


class KitError(Exception):
    """A kit or archive that cannot be built, checked or used; the message names the file and the fix."""


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(MiB), b""):
            h.update(block)
    return h.hexdigest()


def _norm(name: str) -> str:
    return name.lower().replace("_", "-")


def tree_bytes(root: Path = ROOT) -> int:
    """Bytes of what the device tool sends as the working tree: tracked and untracked-not-ignored files."""
    out = subprocess.run(["git", "ls-files", "-z", "-co", "--exclude-standard"], cwd=root, capture_output=True, check=True)
    return sum((root / n).stat().st_size for n in out.stdout.decode().split("\0") if n and (root / n).is_file())


def folder_bytes(folder: Path) -> int:
    return sum(p.stat().st_size for p in folder.rglob("*") if p.is_file())


# -- build (here) -------------------------------------------------------------------------------


def download_wheels(dest: Path, names: tuple[str, ...], python_versions: list[str]) -> list[Path]:
    """``pip download`` each distribution at the version installed here (the one CI tests), as wheels
    for CPython ``python_versions`` on manylinux x86-64, without dependencies."""
    dest.mkdir(parents=True, exist_ok=True)
    try:
        pins = [f"{n}=={metadata.version(n)}" for n in names]
    except metadata.PackageNotFoundError as exc:
        raise KitError(f"{exc.name} is not installed here, so its version is unknown; install oelm's dependencies first") from None
    platforms = [f"--platform=manylinux_2_{n}_x86_64" for n in (17, 24, 28)] + ["--platform=manylinux2014_x86_64"]
    for version in python_versions:
        res = subprocess.run([sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--only-binary=:all:",
                              f"--python-version={version}", "--implementation=cp", *platforms, "--dest", str(dest), *pins],
                             capture_output=True, text=True)
        if res.returncode != 0:
            last = (res.stderr.strip().splitlines() or ["no output"])[-1]
            raise KitError(f"pip download of {' '.join(pins)} for Python {version} failed ({last}); "
                           "the kit is built where pip reaches the package index")
    return sorted(dest.glob("*.whl"))


def build(part: str, out: Path, data_dir: Path, python_version: str = "3.12", wheels_from: Path | None = None) -> Path:
    """Write ``out/<part>/`` (wheels, data, manifest.json) and return it.

    Raises:
        KitError: an unknown part, a data folder without the part's files, a download that fails,
            or a kit over :data:`KIT_LIMIT_MIB`.
    """
    if part not in PARTS:
        raise KitError(f"unknown part {part!r}; the parts are {', '.join(PARTS)}")
    missing = [rel for rel in PARTS[part] if not (data_dir / rel).exists()]
    if missing:
        raise KitError(f"{data_dir} lacks {', '.join(missing)} (part {part} reads them); pass --data-dir or set OELM_DATA_DIR")
    dest = out / part
    shutil.rmtree(dest, ignore_errors=True)
    (dest / "wheels").mkdir(parents=True)
    if wheels_from is not None:  # tests, or a machine with the wheels at hand
        for wheel in sorted(wheels_from.glob("*.whl")):
            shutil.copyfile(wheel, dest / "wheels" / wheel.name)
    else:
        here = f"{sys.version_info.major}.{sys.version_info.minor}"
        download_wheels(dest / "wheels", PACKAGES + FALLBACK, sorted({python_version, here}))
    for rel in PARTS[part]:
        src = data_dir / rel
        target = dest / "data" / rel
        if src.is_dir():  # real files, not links: a link travels as a link and points nowhere there
            shutil.copytree(src, target, symlinks=False)
        else:
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(src, target)
    files = {p.relative_to(dest).as_posix(): {"bytes": p.stat().st_size, "sha256": _sha256(p)}
             for p in sorted(dest.rglob("*")) if p.is_file()}
    manifest = {"part": part, "built_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                "python_version": python_version, "packages": list(PACKAGES), "fallback": list(FALLBACK), "files": files}
    (dest / "manifest.json").write_text(json.dumps(manifest, indent=1))
    size = folder_bytes(dest) / MiB
    if size > KIT_LIMIT_MIB:
        biggest = sorted(files.items(), key=lambda kv: -kv[1]["bytes"])[:3]
        raise KitError(f"kit {dest} is {size:.1f} MiB, over {KIT_LIMIT_MIB:.0f} MiB (largest: "
                       + ", ".join(f"{k} {v['bytes'] / MiB:.1f} MiB" for k, v in biggest) + "); leave data out of PARTS")
    return dest


# -- check and install (there) ------------------------------------------------------------------


def _safe_relative(name: str, what: str) -> PurePosixPath:
    """``name`` as a relative path inside its folder; KitError for an absolute path or ``..``."""
    path = PurePosixPath(name.replace("\\", "/"))
    if not name or "\0" in name or path.is_absolute() or (path.parts and ":" in path.parts[0]):
        raise KitError(f"{what} names {name!r}: an absolute path; refused (nothing extracted or used)")
    if ".." in path.parts:
        raise KitError(f"{what} names {name!r}: a path with '..' leaves the folder; refused (nothing extracted or used)")
    return path


def verify(kit: Path) -> dict:
    """The kit's manifest after checking that every file it lists is there, whole (size, sha256),
    inside the kit, and that the kit holds nothing else.

    Raises:
        KitError: no kit, a damaged or cut manifest, a file missing, changed or unlisted.
    """
    path = kit / "manifest.json"
    if not path.is_file():
        raise KitError(f"no kit at {kit} (no manifest.json): build it with `python scripts/offline_kit.py build PART` "
                       "and name its folder in the device command's carry list")
    try:
        manifest = json.loads(path.read_text())
        files = manifest["files"]
        entries = [(name, int(files[name]["bytes"]), str(files[name]["sha256"])) for name in files]
    except (ValueError, KeyError, TypeError) as exc:
        raise KitError(f"{path} is damaged or cut short ({type(exc).__name__}: {exc}); build the kit again") from None
    for name, size, digest in entries:
        _safe_relative(name, str(path))
        file = kit / name
        if not file.is_file():
            raise KitError(f"{file} is missing (listed in {path}); carry the whole kit folder or build it again")
        if file.stat().st_size != size or _sha256(file) != digest:
            raise KitError(f"{file} is damaged (size or sha256 differs from {path}); build the kit again")
    extra = sorted(p.relative_to(kit).as_posix() for p in kit.rglob("*") if p.is_file() and p.name != "manifest.json"
                   and p.relative_to(kit).as_posix() not in files)
    if extra:
        raise KitError(f"{kit} holds {extra[0]}, which its manifest does not list; build the kit again")
    return manifest


def _wheel_fits(filename: str) -> bool:
    """Whether this Python can install the wheel (its tags against ``packaging.tags.sys_tags()``)."""
    try:
        from packaging.tags import sys_tags  # packaging: on the GPU image and in every venv with pip's vendored copy
        from packaging.utils import parse_wheel_filename
    except ImportError:
        from pip._vendor.packaging.tags import sys_tags
        from pip._vendor.packaging.utils import parse_wheel_filename
    return bool(set(parse_wheel_filename(filename)[3]) & set(sys_tags()))


def _requirements(wheel: Path) -> list[str]:
    """A wheel's ``Requires-Dist`` lines without extras or markers that exclude this Python."""
    import zipfile

    with zipfile.ZipFile(wheel) as z:
        meta = next(n for n in z.namelist() if n.endswith(".dist-info/METADATA"))
        lines = z.read(meta).decode().splitlines()
    return [line.split(":", 1)[1].strip() for line in lines if line.startswith("Requires-Dist:") and "extra ==" not in line]


def _satisfied(requirement: str, site: Path) -> bool:
    """Whether ``requirement`` (``name>=x``) is met by this Python's packages (``site`` first)."""
    try:
        from packaging.requirements import Requirement
    except ImportError:
        from pip._vendor.packaging.requirements import Requirement
    req = Requirement(requirement)
    found = list(metadata.distributions(path=[str(site)], name=req.name)) or list(metadata.distributions(name=req.name))
    return bool(found) and req.specifier.contains(found[0].version, prereleases=True)


def choose_wheels(kit: Path, manifest: dict, site: Path) -> list[Path]:
    """The kit's wheels this Python installs: one per distribution whose tags fit it, and a fallback
    distribution only where a carried wheel needs a newer one than this Python has.

    Raises:
        KitError: a distribution with no wheel for this Python (another version: build the kit for it).
    """
    by_name: dict[str, Path] = {}
    for wheel in sorted((kit / "wheels").glob("*.whl")):
        name = _norm(wheel.name.split("-")[0])
        if _wheel_fits(wheel.name):
            by_name.setdefault(name, wheel)
    here = f"{sys.version_info.major}.{sys.version_info.minor}"
    chosen = []
    for name in manifest.get("packages", []):
        if _norm(name) not in by_name:
            raise KitError(f"{kit / 'wheels'} has no {name} wheel for this Python ({here}, {sys.platform}); "
                           f"build the kit with --python-version {here}")
        chosen.append(by_name[_norm(name)])
    needs = [r for w in chosen for r in _requirements(w)]
    for name in manifest.get("fallback", []):
        unmet = [r for r in needs if _norm(r.split(";")[0]).startswith(_norm(name)) and not _satisfied(r.split(";")[0], site)]
        if unmet and _norm(name) in by_name:
            chosen.append(by_name[_norm(name)])
    return chosen


def install(kit: Path, manifest: dict, site: Path, python: str = sys.executable) -> list[str]:
    """``pip install --no-index --no-deps --target site`` of :func:`choose_wheels`; returns their file names."""
    wheels = choose_wheels(kit, manifest, site)
    site.mkdir(parents=True, exist_ok=True)
    res = subprocess.run([python, "-m", "pip", "install", "--quiet", "--no-index", "--no-deps", "--no-compile", "--no-cache-dir",
                          "--disable-pip-version-check", "--upgrade", "--target", str(site), *map(str, wheels)],
                         capture_output=True, text=True, env={**os.environ, "PIP_ROOT_USER_ACTION": "ignore", "PIP_CONSTRAINT": ""})
    if res.returncode != 0:
        last = (res.stderr.strip().splitlines() or ["no output"])[-1]
        raise KitError(f"pip could not install the kit's wheels into {site} ({last})")
    return [w.name for w in wheels]


# -- run (there) --------------------------------------------------------------------------------


def _keep(name: str) -> bool:
    parts = PurePosixPath(name).parts
    base = parts[-1]
    return not (name.endswith(_SKIP_SUFFIXES) or any(p in _SKIP_PARTS for p in parts) or base.startswith("events.out.tfevents")
                or (base == "tokenizer.json" and len(parts) == 2))  # a comparison's saved tokenizer (its sha256 is recorded)


def write_archive(out: Path, archive: Path, extra: dict) -> None:
    """``out`` as a tar.gz of regular files only (no weights, checkpoints, TensorBoard files), plus ``offline-kit.json``."""
    import io

    archive.parent.mkdir(parents=True, exist_ok=True)
    with tarfile.open(archive, "w:gz") as tar:
        for path in sorted(out.rglob("*")) if out.is_dir() else []:
            rel = path.relative_to(out).as_posix()
            if path.is_file() and not path.is_symlink() and _keep(rel):
                tar.add(path, arcname=rel, recursive=False)
        raw = json.dumps(extra, indent=1).encode()
        info = tarfile.TarInfo("offline-kit.json")
        info.size, info.mtime = len(raw), int(time.time())
        tar.addfile(info, io.BytesIO(raw))


def run(part: str, archive: Path, budget_s: int, kit_root: Path = DEFAULT_KIT, work: Path | None = None) -> int:
    """Check and install the part's kit, run ``scripts/gpu_check.sh PART`` with ``budget_s`` seconds
    for its steps, write the output folder to ``archive`` and its SUMMARY.md beside it (also printed).
    Returns the check's exit status."""
    if part not in PARTS:
        raise KitError(f"unknown part {part!r}; the parts are {', '.join(PARTS)}")
    started = time.time()
    kit = kit_root / part
    manifest = verify(kit)
    work = work or Path(tempfile.gettempdir()) / f"oelm-gpu-{part}"
    shutil.rmtree(work, ignore_errors=True)
    installed = install(kit, manifest, work / "site")
    out = work / f"gpu-{part}"
    env = {**os.environ, "PYTHON": sys.executable, "OUT": str(out), "OELM_DATA_DIR": str(kit / "data"),
           "OELM_CACHE_DIR": str(work / "cache"), "GPU_CHECK_DEADLINE": str(int(started) + budget_s),
           "PYTHONPATH": os.pathsep.join([str(work / "site"), str(ROOT / "src"), os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep)}
    print(f"offline kit: {part}: kit checked ({len(manifest['files'])} files), installed {', '.join(installed)} "
          f"into {work / 'site'} in {time.time() - started:.0f} s; steps until {budget_s} s from the start", flush=True)
    code = subprocess.run(["bash", str(ROOT / "scripts" / "gpu_check.sh"), part], env=env, cwd=ROOT).returncode
    write_archive(out, archive, {"part": part, "exit_status": code, "budget_s": budget_s, "wheels": installed,
                                 "seconds": round(time.time() - started, 1), "kit_built_utc": manifest.get("built_utc")})
    summary = out / "SUMMARY.md"
    if summary.is_file():
        shutil.copyfile(summary, archive.parent / f"SUMMARY-{part}.md")
        print(summary.read_text())
    print(f"offline kit: {part} exited {code} after {time.time() - started:.0f} s; "
          f"archive {archive} ({archive.stat().st_size / MiB:.2f} MiB)")
    return code


# -- collect (here) -----------------------------------------------------------------------------


def check_members(tar: tarfile.TarFile, where: str) -> list[tarfile.TarInfo]:
    """Every member of ``tar``, after checking each one: a relative path without ``..``, a regular
    file or folder, or a link whose target stays inside (relative, no ``..``). The whole archive is
    refused (KitError, one line) before anything is extracted."""
    members = tar.getmembers()
    for m in members:
        _safe_relative(m.name, where)
        if m.issym() or m.islnk():
            target = PurePosixPath(m.linkname.replace("\\", "/"))
            if target.is_absolute() or ".." in target.parts or not m.linkname:
                raise KitError(f"{where} holds a link {m.name!r} -> {m.linkname!r} leaving the folder; refused (nothing extracted)")
        elif not (m.isfile() or m.isdir()):
            raise KitError(f"{where} holds {m.name!r}, a device file or pipe; refused (nothing extracted)")
    return members


def safe_extract(archive: Path, dest: Path) -> list[str]:
    """Extract ``archive`` into ``dest`` after :func:`check_members`; returns the member names.

    Raises:
        KitError: no such file, not a tar archive, cut short or damaged, or a member refused.
    """
    if not archive.is_file():
        raise KitError(f"{archive} does not exist")
    try:
        with tarfile.open(archive) as tar:
            members = check_members(tar, str(archive))
            for m in members:  # tarfile's own filter too, where this Python has it (3.12, 3.11.4+, 3.10.12+)
                tar.extract(m, dest, **({"filter": "data"} if hasattr(tarfile, "data_filter") else {}))
    except tarfile.ReadError as exc:
        reason = (str(exc).splitlines() or ["?"])[0].rstrip(":")
        raise KitError(f"{archive} is not a (whole) tar archive ({reason}); bring it back again from the device's output") from None
    except (EOFError, zlib.error, gzip.BadGzipFile) as exc:
        raise KitError(f"{archive} is cut short or damaged ({type(exc).__name__}: {exc}); bring it back again") from None
    except tarfile.TarError as exc:
        raise KitError(f"{archive} could not be extracted safely ({exc}); nothing of it was used") from None
    except OSError as exc:
        raise KitError(f"{archive} could not be extracted into {dest} ({exc})") from None
    return [m.name for m in members]


def _default_folder(staging: Path) -> Path:
    env = json.loads((staging / "env.json").read_text()) if (staging / "env.json").is_file() else {}
    name = ((env.get("cuda") or {}).get("name") or "gpu").lower()
    slug = "-".join("".join(c if c.isalnum() else " " for c in name).split())
    day = (env.get("timestamp_utc") or time.strftime("%Y-%m-%d"))[:10].replace("-", "")
    return ROOT / "docs" / "results" / f"gpu-{day}-{slug}"


def collect(archives: list[Path], into: Path | None) -> Path:
    """Merge the archives into one folder (default ``docs/results/gpu-<date>-<gpu>/`` from env.json)
    with one steps.tsv (the archives' rows in order; a step run twice keeps its last row) and its
    SUMMARY.md. Archives from different GPUs are refused: collect each into its own ``--into``."""
    rows: dict[str, str] = {}
    gpus: dict[str, str] = {}
    with tempfile.TemporaryDirectory() as tmp:
        staging = Path(tmp) / "merged"
        staging.mkdir()
        for archive in archives:
            one = Path(tmp) / f"a{len(gpus)}-{archive.name}"
            names = safe_extract(archive, one)
            env = json.loads((one / "env.json").read_text()) if (one / "env.json").is_file() else {}
            gpus[str(archive)] = (env.get("cuda") or {}).get("name") or "?"
            if "steps.tsv" in names:
                for line in (one / "steps.tsv").read_text().splitlines()[1:]:
                    rows[line.split("\t")[0]] = line
                (one / "steps.tsv").unlink()
            (one / "offline-kit.json").unlink(missing_ok=True)
            shutil.copytree(one, staging, dirs_exist_ok=True)
        if len(set(gpus.values()) - {"?"}) > 1:
            raise KitError("the archives come from different GPUs (" + ", ".join(f"{a}: {g}" for a, g in gpus.items())
                           + "); collect each into its own folder with --into")
        into = into or _default_folder(staging)
        into.mkdir(parents=True, exist_ok=True)
        shutil.copytree(staging, into, dirs_exist_ok=True)
    (into / "steps.tsv").write_text("step\texit_status\tseconds\tlog\n" + "".join(f"{r}\n" for r in rows.values()))
    subprocess.run([sys.executable, str(Path(__file__).with_name("gpu_summary.py")), str(into)], check=True,
                   stdout=subprocess.DEVNULL)
    return into


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="command", required=True)
    b = sub.add_parser("build", help="here: .gpu-kit/PART (wheels, the part's data, manifest.json)")
    b.add_argument("part", choices=sorted(PARTS))
    b.add_argument("--out", type=Path, default=DEFAULT_KIT)
    b.add_argument("--data-dir", type=Path, default=Path(os.environ.get("OELM_DATA_DIR") or ROOT.parent / "shared" / "data"))
    b.add_argument("--python-version", default="3.12", help="the GPU machine's Python (its wheels' tags; default 3.12)")
    b.add_argument("--wheels-from", type=Path, help="copy the wheels from this folder instead of downloading them")
    r = sub.add_parser("run", help="there: check and install the kit, run the part, archive its output")
    r.add_argument("part", choices=sorted(PARTS))
    r.add_argument("--archive", type=Path, required=True, help="the .tar.gz to write (under the device's $OUT)")
    r.add_argument("--budget-s", type=int, help="seconds for the part's steps (default: speed 340, scale 360)")
    r.add_argument("--kit", type=Path, default=DEFAULT_KIT, help="the folder holding PART/ (default .gpu-kit)")
    c = sub.add_parser("collect", help="here: merge the archives into docs/results/gpu-<date>-<gpu>/ with SUMMARY.md")
    c.add_argument("archives", nargs="+", type=Path)
    c.add_argument("--into", type=Path, help="default docs/results/gpu-<date>-<gpu> from env.json")
    args = p.parse_args(argv)
    try:
        if args.command == "build":
            kit = build(args.part, args.out, args.data_dir.resolve(), args.python_version, args.wheels_from)
            size, tree = folder_bytes(kit) / MiB, tree_bytes() / MiB
            print(f"offline kit: {kit} {size:.1f} MiB (limit {KIT_LIMIT_MIB:.0f}); with the working tree ({tree:.1f} MiB) "
                  f"{size + tree:.1f} MiB of the device tool's {UPLOAD_LIMIT_MIB:.0f} MiB")
            if size + tree > UPLOAD_LIMIT_MIB:
                raise KitError(f"the working tree and {kit} together exceed {UPLOAD_LIMIT_MIB:.0f} MiB; ignore or remove "
                               "untracked files (git status) before the device command")
            return 0
        if args.command == "run":
            budget = args.budget_s if args.budget_s is not None else BUDGET_S[args.part]
            if not 1 <= budget <= 3600:
                raise KitError(f"--budget-s {budget} is outside 1..3600 seconds")
            return run(args.part, args.archive.resolve(), budget, args.kit.resolve())
        print(f"offline kit: collected into {collect(args.archives, args.into)}")
        return 0
    except (KitError, subprocess.CalledProcessError, OSError) as exc:
        print("offline kit: " + " ".join(str(exc).split()), file=sys.stderr)  # one line, whatever the cause says
        return 2


if __name__ == "__main__":
    sys.exit(main())
