"""Stand-ins for scripts/gpu_check.sh's tests without a GPU: a ``python`` that reports a GPU to the
script's CUDA probe and an ``nvidia-smi`` (tests/test_gpu_check.py, tests/test_offline_kit.py)."""

from __future__ import annotations

import stat
import sys
from pathlib import Path


def executable(path: Path, text: str) -> Path:
    path.write_text(text)
    path.chmod(path.stat().st_mode | stat.S_IEXEC)
    return path


def fake_gpu_python(bin_dir: Path, body: str) -> Path:
    """A stand-in python that reports a GPU to the script's CUDA probe, hands the summary to the real
    python, and runs ``body`` (bash) for every other call."""
    bin_dir.mkdir(exist_ok=True)
    executable(bin_dir / "nvidia-smi", "#!/bin/sh\necho 'fake nvidia-smi'\n")
    return executable(bin_dir / "python", f"""#!/bin/bash
if [ "$1" = "-" ]; then cat > /dev/null; echo "Fake GPU 80GB HBM3"; exit 0; fi
if [ "$1" = "scripts/gpu_summary.py" ]; then exec {sys.executable} "$@"; fi
{body}
""")

