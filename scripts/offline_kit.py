"""The GPU check's kit: what a GPU machine with no network needs beside the source tree, one folder per part.

A lent GPU machine (docs/scaling.md, "The GPU check in two commands") receives the working tree and
a few git-ignored folders (``carry``), at most 64 MiB per command, runs one command of at most 10
minutes and reaches no package index. Its Python (3.12) already has torch, transformers, accelerate,
tokenizers, pandas, pyarrow, ... but not pydantic. So each part of ``scripts/gpu_check.sh`` gets a
kit folder of its own, under 30 MiB, that leaves at least 20 MiB of the 64 free beside the light
tree (scripts/kit_sizes.py: ``build`` prints both trees' figures and refuses a kit that leaves less,
in one line naming the tree's largest folders):

    here:   python scripts/offline_kit.py build speed        # -> .gpu-kit/speed/ (git-ignored)
            python scripts/offline_kit.py build scale        # -> .gpu-kit/scale/
            python scripts/offline_kit.py light speed scale  # docs/results out of the tree that travels
    there:  python3 scripts/offline_kit.py run speed --archive "$OUT/gpu-speed.tar.gz"
    here:   python scripts/offline_kit.py restore            # docs/results back in git's index
            python scripts/offline_kit.py collect gpu-speed.tar.gz gpu-scale.tar.gz   # -> docs/results/gpu-<date>-<gpu>/

and before the device commands, the same ``run`` on this machine's CPU under a Python without
pydantic (``python scripts/gpu_dry_run.py speed``; scripts/gpu_dry_run.py). ``light`` and
``restore`` are scripts/kit_light.py's: while the tree is light every command here prints so, and
``collect`` refuses (its folder would be ignored, and a commit would delete the evidence).

A kit holds ``wheels/`` (pydantic and its three dependencies at the versions CI tests, for CPython
3.12 manylinux x86-64; ``typing-extensions`` as a fallback, installed only where the Python's own
copy is older than pydantic needs), ``data.tar.gz`` (only the files the part reads, from
``$OELM_DATA_DIR``) and ``manifest.json`` (every file's size and sha256, the kit's and the data
files'). Where this machine's Python is not 3.12, its own wheels of the same versions go to
``.gpu-kit/host-wheels/`` for the CPU dry run (``run --host-wheels``), outside the carried folder:
they would be 2.2 MiB of every upload. ``run`` checks the manifest, installs the wheels that fit
the running Python with ``pip install --no-index --no-deps --target``, unpacks the data into its
work folder and checks each file, runs the part with oelm from ``src/`` on ``PYTHONPATH`` and a
deadline, and writes the output folder as one tar.gz (no weights or checkpoints) plus its
SUMMARY.md beside it. ``collect`` checks every archive member itself before extracting anything
(scripts/kit_archive.py: a relative path, no ``..``, no link leaving the folder, no device file),
on every Python, not only where tarfile's ``data`` filter exists.

Every refusal is one line ``offline kit: ...`` naming the file and the fix, exit status 2. Standard
library only (``packaging`` where present): it runs on the GPU machine's own Python.
"""

from __future__ import annotations

import argparse
import hashlib
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

import kit_light
from kit_archive import KitError, _safe_relative, safe_extract, write_archive
from kit_sizes import HEADROOM_MIB, LIGHT_OUT, UPLOAD_LIMIT_MIB, MiB, folder_bytes, largest_folders, travel

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_KIT = ROOT / ".gpu-kit"
DATA_ARCHIVE = "data.tar.gz"  # the part's data files, unpacked by run into its work folder
HOST_WHEELS = "host-wheels"  # beside the parts' kits: this machine's wheels when its Python is not the device's
KIT_LIMIT_MIB = 30.0  # one part's kit
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


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(MiB), b""):
            h.update(block)
    return h.hexdigest()


def _norm(name: str) -> str:
    return name.lower().replace("_", "-")


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


def build(part: str, out: Path, data_dir: Path, python_version: str = "3.12", wheels_from: Path | None = None,
          root: Path | None = None) -> Path:
    """Write ``out/<part>/`` (wheels, data, manifest.json) and return it; where this Python is not
    ``python_version``, its own wheels go to ``out/host-wheels/`` (the dry run's, never carried).

    Raises:
        KitError: an unknown part, a data folder without the part's files, a download that fails,
            a kit over :data:`KIT_LIMIT_MIB`, or one that leaves less than :data:`HEADROOM_MIB`
            free beside the working tree of ``root`` (default: this checkout; :func:`check_travel`); a
            refused kit is removed.
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
        download_wheels(dest / "wheels", PACKAGES + FALLBACK, [python_version])
        here = f"{sys.version_info.major}.{sys.version_info.minor}"
        if here != python_version:
            shutil.rmtree(out / HOST_WHEELS, ignore_errors=True)
            download_wheels(out / HOST_WHEELS, PACKAGES + FALLBACK, [here])
    # One tar.gz (real files, not links: a link would travel as a link and point nowhere there): the
    # tokenizer files and MANIFEST.md shrink to a third (1.0 MiB less per upload), the parquet files stay.
    with tarfile.open(dest / DATA_ARCHIVE, "w:gz", dereference=True) as tar:
        for rel in PARTS[part]:
            tar.add(data_dir / rel, arcname=rel)
    sources = [p for rel in PARTS[part] for p in (sorted((data_dir / rel).rglob("*")) if (data_dir / rel).is_dir() else [data_dir / rel])]
    data = {p.relative_to(data_dir).as_posix(): {"bytes": p.stat().st_size, "sha256": _sha256(p)} for p in sources if p.is_file()}
    files = {p.relative_to(dest).as_posix(): {"bytes": p.stat().st_size, "sha256": _sha256(p)}
             for p in sorted(dest.rglob("*")) if p.is_file()}
    manifest = {"part": part, "built_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "python_version": python_version,
                "packages": list(PACKAGES), "fallback": list(FALLBACK), "files": files, "data": data}
    (dest / "manifest.json").write_text(json.dumps(manifest, indent=1))
    try:
        size = folder_bytes(dest) / MiB
        if size > KIT_LIMIT_MIB:
            biggest = sorted(files.items(), key=lambda kv: -kv[1]["bytes"])[:3]
            raise KitError(f"kit {dest} is {size:.1f} MiB, over {KIT_LIMIT_MIB:.0f} MiB (largest: "
                           + ", ".join(f"{k} {v['bytes'] / MiB:.1f} MiB" for k, v in biggest) + "); leave data out of PARTS")
        check_travel(dest, root)
    except KitError as exc:
        shutil.rmtree(dest, ignore_errors=True)
        raise KitError(f"{exc} (kit removed)") from None
    return dest


def check_travel(kit: Path, root: Path | None = None) -> dict[str, float]:
    """The MiB one device command sends from checkout ``root`` (default: this one) with ``kit``
    carried (:func:`kit_sizes.travel`: the tree as it is and the light tree, the kit, the totals and
    the headroom of each), after checking that at least :data:`HEADROOM_MIB` of the
    :data:`UPLOAD_LIMIT_MIB` stay free beside the light tree (the tree the device commands send:
    ``light``), whatever results are committed.

    Raises:
        KitError: less headroom; one line with the sizes and the light tree's largest folders.
    """
    root = root or ROOT
    sizes = travel(kit, root)
    if sizes["light_headroom"] < HEADROOM_MIB:
        largest = ", ".join(f"{name} {size / MiB:.1f} MiB" for name, size in largest_folders(root, light=True))
        raise KitError(f"{kit.name}: even with the light tree ({LIGHT_OUT} left out) the device command would send "
                       f"{sizes['light_total']:.1f} MiB (working tree {sizes['light_tree']:.1f} MiB + kit {sizes['kit']:.1f} MiB) "
                       f"of its {UPLOAD_LIMIT_MIB:.0f} MiB, leaving {sizes['light_headroom']:.1f} MiB, under the "
                       f"{HEADROOM_MIB:.0f} MiB kept free (docs/scaling.md); the light tree's largest folders: {largest}; "
                       "make them smaller, or remove or ignore untracked files (git status)")
    return sizes


def light(parts: list[str], kit_root: Path = DEFAULT_KIT, root: Path | None = None) -> list[str]:
    """Make checkout ``root``'s tree light (:func:`kit_light.make_light`) after checking each part's
    kit (:func:`verify`) and that it leaves :data:`HEADROOM_MIB` free beside the light tree; then
    measures what a device command sends now. Returns one line per part with those figures.

    Raises:
        KitError: a kit missing or damaged, too little headroom (nothing changed then), or a refusal
            of :func:`kit_light.make_light`; a light tree that sends more than measured before is undone.
    """
    root = root or ROOT
    for part in parts:
        verify(kit_root / part)
        check_travel(kit_root / part, root)
    state = kit_light.make_light(root)
    lines = []
    for part in parts:
        sizes = travel(kit_root / part, root)
        if sizes["tree"] > sizes["light_tree"] or sizes["headroom"] < HEADROOM_MIB:
            kit_light.restore(root)
            raise KitError(f"the light tree sends {sizes['tree']:.1f} MiB, not the {sizes['light_tree']:.1f} MiB measured "
                           "before; the tree was restored")
        lines.append(f"{part}: one device command now sends {sizes['total']:.1f} MiB (light tree {sizes['tree']:.1f} MiB + "
                     f"kit {sizes['kit']:.1f} MiB) of its {UPLOAD_LIMIT_MIB:.0f} MiB, {sizes['headroom']:.1f} MiB free")
    return [f"light tree: {LIGHT_OUT} out of git's index ({len(state['entries'])} entries) and ignored, every file still on "
            f"disk; until `{kit_light.RESTORE}`, do not commit (the index holds as many staged deletions)", *lines]


# -- check and install (there) ------------------------------------------------------------------


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


def choose_wheels(kit: Path, manifest: dict, site: Path, host_wheels: Path | None = None) -> list[Path]:
    """The kit's wheels this Python installs: one per distribution whose tags fit it (the kit's
    first, then ``host_wheels``'), and a fallback distribution only where a carried wheel needs a
    newer one than this Python has.

    Raises:
        KitError: a distribution with no wheel for this Python (another version: build the kit for it).
    """
    by_name: dict[str, Path] = {}
    extra = sorted(host_wheels.glob("*.whl")) if host_wheels is not None else []
    for wheel in [*sorted((kit / "wheels").glob("*.whl")), *extra]:
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


def install(kit: Path, manifest: dict, site: Path, python: str = sys.executable, host_wheels: Path | None = None) -> list[str]:
    """``pip install --no-index --no-deps --target site`` of :func:`choose_wheels`; returns their file names."""
    wheels = choose_wheels(kit, manifest, site, host_wheels)
    site.mkdir(parents=True, exist_ok=True)
    res = subprocess.run([python, "-m", "pip", "install", "--quiet", "--no-index", "--no-deps", "--no-compile", "--no-cache-dir",
                          "--disable-pip-version-check", "--upgrade", "--target", str(site), *map(str, wheels)],
                         capture_output=True, text=True, env={**os.environ, "PIP_ROOT_USER_ACTION": "ignore", "PIP_CONSTRAINT": ""})
    if res.returncode != 0:
        last = (res.stderr.strip().splitlines() or ["no output"])[-1]
        raise KitError(f"pip could not install the kit's wheels into {site} ({last})")
    return [w.name for w in wheels]


# -- run (there) --------------------------------------------------------------------------------


def unpack_data(kit: Path, manifest: dict, dest: Path) -> Path:
    """The kit's :data:`DATA_ARCHIVE` extracted into ``dest`` (:func:`kit_archive.safe_extract`),
    each file checked against the manifest's ``data`` list (size and sha256 of the data folder's
    file the kit was built from), so the part reads the same bytes; returns ``dest``.

    Raises:
        KitError: a kit without the archive or list (built before they existed), a hostile or
            damaged archive, or a file missing, extra or different.
    """
    expected = manifest.get("data")
    if not isinstance(expected, dict) or not (kit / DATA_ARCHIVE).is_file():
        raise KitError(f"{kit} has no {DATA_ARCHIVE} with its manifest's data list (an older kit); build the kit again")
    shutil.rmtree(dest, ignore_errors=True)
    safe_extract(kit / DATA_ARCHIVE, dest)
    found = sorted(p.relative_to(dest).as_posix() for p in dest.rglob("*") if p.is_file())
    if found != sorted(expected):
        odd = sorted(set(found) ^ set(expected))
        raise KitError(f"{kit / DATA_ARCHIVE} holds other files than {kit / 'manifest.json'} lists ({odd[0]}); build the kit again")
    for name, entry in expected.items():
        if (dest / name).stat().st_size != entry.get("bytes") or _sha256(dest / name) != entry.get("sha256"):
            raise KitError(f"{dest / name} from {kit / DATA_ARCHIVE} differs from its manifest entry; build the kit again")
    return dest



def run(part: str, archive: Path, budget_s: int, kit_root: Path = DEFAULT_KIT, work: Path | None = None,
        host_wheels: Path | None = None) -> int:
    """Check and install the part's kit (with ``host_wheels`` too: the CPU dry run's own), run
    ``scripts/gpu_check.sh PART`` with ``budget_s`` seconds for its steps, write the output folder
    to ``archive`` and its SUMMARY.md beside it (also printed). Returns the check's exit status."""
    if part not in PARTS:
        raise KitError(f"unknown part {part!r}; the parts are {', '.join(PARTS)}")
    started = time.time()
    kit = kit_root / part
    manifest = verify(kit)
    work = work or Path(tempfile.gettempdir()) / f"oelm-gpu-{part}"
    shutil.rmtree(work, ignore_errors=True)
    installed = install(kit, manifest, work / "site", host_wheels=host_wheels)
    data = unpack_data(kit, manifest, work / "data")
    out = work / f"gpu-{part}"
    env = {**os.environ, "PYTHON": sys.executable, "OUT": str(out), "OELM_DATA_DIR": str(data),
           "OELM_CACHE_DIR": str(work / "cache"), "GPU_CHECK_DEADLINE": str(int(started) + budget_s),
           "PYTHONPATH": os.pathsep.join([str(work / "site"), str(ROOT / "src"), os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep)}
    print(f"offline kit: {part}: kit checked ({len(manifest['files'])} files), installed {', '.join(installed)} "
          f"into {work / 'site'}, {len(manifest['data'])} data files into {data} in {time.time() - started:.0f} s; "
          f"steps until {budget_s} s from the start", flush=True)
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


def _build_line(kit: Path, sizes: dict[str, float]) -> str:
    """What ``build`` prints: the kit, and what one device command sends beside the light tree and the whole one."""
    whole = (f"{sizes['headroom']:.1f} MiB free" if sizes["total"] <= UPLOAD_LIMIT_MIB
             else f"over the limit: the device tool refuses it")
    return (f"offline kit: {kit} {sizes['kit']:.1f} MiB (limit {KIT_LIMIT_MIB:.0f}); one device command sends, after "
            f"`light`: the light tree ({sizes['light_tree']:.1f} MiB, {LIGHT_OUT} left out) + the kit = {sizes['light_total']:.1f} "
            f"MiB of the device tool's {UPLOAD_LIMIT_MIB:.0f} MiB, {sizes['light_headroom']:.1f} MiB free (at least "
            f"{HEADROOM_MIB:.0f} kept); without `light`: the whole tree ({sizes['tree']:.1f} MiB) + the kit = "
            f"{sizes['total']:.1f} MiB, {whole}")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="command", required=True)
    b = sub.add_parser("build", help="here: .gpu-kit/PART (wheels, the part's data, manifest.json)")
    b.add_argument("part", choices=sorted(PARTS))
    b.add_argument("--out", type=Path, default=DEFAULT_KIT)
    b.add_argument("--data-dir", type=Path, default=Path(os.environ.get("OELM_DATA_DIR") or ROOT.parent / "shared" / "data"))
    b.add_argument("--python-version", default="3.12", help="the GPU machine's Python (its wheels' tags; default 3.12)")
    b.add_argument("--wheels-from", type=Path, help="copy the wheels from this folder instead of downloading them")
    li = sub.add_parser("light", help=f"here, before the device commands: {LIGHT_OUT} out of the tree that travels")
    li.add_argument("parts", nargs="+", choices=sorted(PARTS), metavar="PART", help="the parts whose kits will be carried")
    li.add_argument("--kit", type=Path, default=DEFAULT_KIT, help="the folder holding PART/ (default .gpu-kit)")
    sub.add_parser("restore", help=f"here, after the device commands: {LIGHT_OUT} back in git's index (idempotent)")
    r = sub.add_parser("run", help="there: check and install the kit, run the part, archive its output")
    r.add_argument("part", choices=sorted(PARTS))
    r.add_argument("--archive", type=Path, required=True, help="the .tar.gz to write (under the device's $OUT)")
    r.add_argument("--budget-s", type=int, help="seconds for the part's steps (default: speed 340, scale 360)")
    r.add_argument("--kit", type=Path, default=DEFAULT_KIT, help="the folder holding PART/ (default .gpu-kit)")
    r.add_argument("--host-wheels", type=Path, help="more wheels for this Python (the CPU dry run: .gpu-kit/host-wheels)")
    c = sub.add_parser("collect", help="here: merge the archives into docs/results/gpu-<date>-<gpu>/ with SUMMARY.md")
    c.add_argument("archives", nargs="+", type=Path)
    c.add_argument("--into", type=Path, help="default docs/results/gpu-<date>-<gpu> from env.json")
    args = p.parse_args(argv)
    try:
        is_light = kit_light.notice(ROOT)  # None on the device (no git folder there) and in a whole tree
        if is_light and args.command not in ("light", "restore"):
            if args.command == "collect":
                raise KitError(f"{is_light}; collect writes into {LIGHT_OUT}, which is ignored while light: restore first")
            print(f"offline kit: {is_light}", file=sys.stderr)
        if args.command == "build":
            kit = build(args.part, args.out, args.data_dir.resolve(), args.python_version, args.wheels_from)
            print(_build_line(kit, check_travel(kit)))
            return 0
        if args.command in ("light", "restore"):
            lines = light(args.parts, args.kit.resolve()) if args.command == "light" else [kit_light.restore(ROOT)]
            print("\n".join(f"offline kit: {line}" for line in lines))
            return 0
        if args.command == "run":
            budget = args.budget_s if args.budget_s is not None else BUDGET_S[args.part]
            if not 1 <= budget <= 3600:
                raise KitError(f"--budget-s {budget} is outside 1..3600 seconds")
            host = args.host_wheels.resolve() if args.host_wheels else None
            return run(args.part, args.archive.resolve(), budget, args.kit.resolve(), host_wheels=host)
        print(f"offline kit: collected into {collect(args.archives, args.into)}")
        return 0
    except (KitError, subprocess.CalledProcessError, OSError) as exc:
        print("offline kit: " + " ".join(str(exc).split()), file=sys.stderr)  # one line, whatever the cause says
        return 2


if __name__ == "__main__":
    sys.exit(main())
