"""What one device command sends, in bytes: the working tree and the carried kit, against the 64 MiB.

The device tool (docs/scaling.md, "The GPU check in two commands"; its README's Limits) copies the
checkout's working tree — every tracked file and every untracked file git does not ignore, plus a
``shared/`` folder inside the checkout, ignored or not — and the ``carry`` folders, at most 64 MiB
per command. It leaves no tracked file behind: committed evidence under ``docs/results`` travels
with every GPU command as much as ``src/`` does, unless the tree is made light first
(scripts/kit_light.py: ``offline_kit.py light`` takes :data:`LIGHT_OUT` out of git's index and
ignores it, every file staying on disk). So ``offline_kit.py build`` measures the kit with both
trees (:func:`travel`: the whole one as it is, and the light one) and refuses a kit that leaves
less than :data:`HEADROOM_MIB` free even beside the light tree, whatever results are committed.

Standard library only, like scripts/offline_kit.py, which imports it (also on the GPU machine).
"""

from __future__ import annotations

import subprocess
from collections import Counter
from pathlib import Path

MiB = 1 << 20
UPLOAD_LIMIT_MIB = 64.0  # what one command of the device tool may take: the tree and every carried folder
HEADROOM_MIB = 20.0  # kept free under UPLOAD_LIMIT_MIB for each part (issue 47): the results still to come
LIGHT_OUT = "docs/results"  # what the light tree leaves out: committed evidence, read by no step of the GPU check


def tree_files(root: Path, light: bool = False) -> list[str]:
    """The paths (relative, posix) the device tool sends as ``root``'s working tree: tracked files
    present in the tree, untracked files git does not ignore, and every file under ``shared/``;
    with ``light``, those the light tree sends (the same without :data:`LIGHT_OUT`, which
    ``offline_kit.py light`` takes out of the index and ignores).

    Raises:
        subprocess.CalledProcessError: ``root`` is not a git checkout (git's own message).
    """
    out = subprocess.run(["git", "ls-files", "-z", "-co", "--exclude-standard"], cwd=root, capture_output=True, check=True)
    names = {n for n in out.stdout.decode().split("\0") if n and (root / n).is_file()}
    shared = root / "shared"
    if shared.is_dir() and not shared.is_symlink():
        names |= {p.relative_to(root).as_posix() for p in shared.rglob("*") if p.is_file() or p.is_symlink()}
    if light:
        names = {n for n in names if not n.startswith(f"{LIGHT_OUT}/")}
    return sorted(names)


def _size(path: Path) -> int:
    return path.lstat().st_size  # a link travels as a link: its own size, not its target's


def tree_bytes(root: Path, light: bool = False) -> int:
    """Bytes of what the device tool sends as the working tree (:func:`tree_files`)."""
    return sum(_size(root / n) for n in tree_files(root, light))


def folder_bytes(folder: Path) -> int:
    """Bytes of every file under ``folder`` (a carried kit)."""
    return sum(_size(p) for p in folder.rglob("*") if p.is_file() or p.is_symlink())


def largest_folders(root: Path, count: int = 3, light: bool = False) -> list[tuple[str, int]]:
    """The ``count`` folders of the (light) tree holding the most bytes, two or three levels down
    (``docs/results/<matrix>``, ``src/oelm``), largest first."""
    by_folder: Counter[str] = Counter()
    for name in tree_files(root, light):
        parts = name.split("/")
        by_folder["/".join(parts[: min(3, len(parts) - 1)]) or name] += _size(root / name)
    return by_folder.most_common(count)


def travel(kit: Path, root: Path) -> dict[str, float]:
    """MiB one device command sends with ``kit`` carried: ``tree``, ``kit``, ``total`` and the
    ``headroom`` left under :data:`UPLOAD_LIMIT_MIB` (negative when over) with the tree as it is now,
    and ``light_tree``, ``light_total``, ``light_headroom`` with the light tree (the same figures
    when the tree is light already)."""
    tree, light, carried = tree_bytes(root) / MiB, tree_bytes(root, light=True) / MiB, folder_bytes(kit) / MiB
    return {"tree": tree, "kit": carried, "total": tree + carried, "headroom": UPLOAD_LIMIT_MIB - tree - carried,
            "light_tree": light, "light_total": light + carried, "light_headroom": UPLOAD_LIMIT_MIB - light - carried}
