"""The light tree: ``docs/results`` out of what one device command sends, and back (``offline_kit.py
light PART`` / ``offline_kit.py restore``).

The device tool sends every tracked file and every untracked file git does not ignore (its README's
Limits), so the committed evidence under ``docs/results`` — most of the tree, and growing with each
round — travels with every GPU command although no step of the GPU check reads it (the steps read
``src/``, ``scripts/``, ``configs/``, ``tests/test_cuda.py`` and the kit's data; docs/scaling.md).
:func:`make_light` takes it out of what git calls the tree without touching a file on disk:

1. it records ``git ls-files --stage -- docs/results`` (every entry's mode, blob id and path),
   HEAD and ``git status --porcelain`` in a state file inside this worktree's own git folder
   (``git rev-parse --absolute-git-dir``: never sent, never shown by git status, one per worktree);
2. ``git rm -r -q --cached -- docs/results``: the entries leave git's index, the files stay;
3. it writes ``docs/results/.gitignore`` holding ``*``, which ignores everything beneath, itself too.

Step 3 is a file of this worktree, not a line of ``.git/info/exclude``: that file is shared by every
worktree of the repository (``git rev-parse --git-path info/exclude``), so a line there would hide
the new results that helpers write in their own worktrees meanwhile (``git add -A`` would skip them).

:func:`restore` feeds the recorded entries back with ``git update-index --index-info`` (the same
modes and blob ids, whatever HEAD is by then), removes the ignore file and checks that ``git ls-files
--stage`` lists exactly what was recorded. It is idempotent. While the tree is light git's index holds
one staged deletion per result file, so a commit would delete the evidence: :func:`notice` is printed
by every ``offline_kit.py`` command, ``collect`` refuses, and ``git status`` shows the deletions.

Standard library only, like scripts/offline_kit.py, which imports it.
"""

from __future__ import annotations

import json
import os
import subprocess
import time
from pathlib import Path

from kit_archive import KitError
from kit_sizes import LIGHT_OUT

STATE_NAME = "oelm-light-tree.json"  # in the worktree's own git folder
IGNORE_MARK = "# scripts/offline_kit.py light: the GPU check's light tree; `python scripts/offline_kit.py restore` removes this file"
RESTORE = "python scripts/offline_kit.py restore"


def _git(root: Path, *args: str, stdin: bytes | None = None) -> bytes:
    res = subprocess.run(["git", *args], cwd=root, input=stdin, capture_output=True)
    if res.returncode != 0:
        raise KitError(f"git {' '.join(args[:3])} failed in {root}: {res.stderr.decode(errors='replace').strip() or res.returncode}")
    return res.stdout


def state_path(root: Path) -> Path:
    """The light tree's state file of checkout ``root``: in its own git folder (a worktree's own)."""
    return Path(_git(root, "rev-parse", "--absolute-git-dir").decode().strip()) / STATE_NAME


def light_state(root: Path) -> dict | None:
    """The recorded state while ``root``'s tree is light, else None."""
    path = state_path(root)
    return json.loads(path.read_text()) if path.is_file() else None


def notice(root: Path) -> str | None:
    """One line while ``root``'s tree is light (what a commit would do, and the command that undoes it), else None."""
    try:
        state = light_state(root)
    except (KitError, OSError, ValueError):
        return None
    if state is None:
        return None
    return (f"the tree is LIGHT since {state['since_utc']}: {LIGHT_OUT} is out of git's index ({len(state['entries'])} staged "
            f"deletions; the files are on disk); run `{RESTORE}` before any commit")


def _entries(root: Path) -> list[str]:
    """``git ls-files --stage`` of :data:`LIGHT_OUT`: one ``mode blob stage<TAB>path`` per entry."""
    raw = _git(root, "ls-files", "--stage", "-z", "--", LIGHT_OUT)
    return [e for e in raw.decode("utf-8", "surrogateescape").split("\0") if e]


def _status(root: Path, *paths: str) -> list[str]:
    raw = _git(root, "status", "--porcelain=v1", "-z", "--untracked-files=all", "--", *paths)
    return [e for e in raw.decode("utf-8", "surrogateescape").split("\0") if e]


def make_light(root: Path) -> dict:
    """Take :data:`LIGHT_OUT` out of what the device tool sends from checkout ``root`` (module
    docstring: out of git's index, ignored; every file stays on disk with its bytes); returns the
    recorded state (``entries``, ``head``, ``status``, ``since_utc``).

    Raises:
        KitError: the tree is light already, the folder holds no tracked file, has uncommitted
            changes (modified, staged, deleted or untracked files: nothing may ride on the index
            change) or its own ``.gitignore``; nothing is changed then. A git step that fails
            midway is undone (:func:`restore`) before the error is raised.
    """
    state = light_state(root)
    if state is not None:
        raise KitError(f"the tree is light already (since {state['since_utc']}); `{RESTORE}` first")
    folder = root / LIGHT_OUT
    if (folder / ".gitignore").exists():
        raise KitError(f"{folder / '.gitignore'} exists; the light tree writes its own there: move it out of {LIGHT_OUT}")
    entries = _entries(root)
    if not entries:
        raise KitError(f"{LIGHT_OUT} holds no tracked file in {root}: nothing to leave out")
    changed = _status(root, LIGHT_OUT)
    if changed:
        raise KitError(f"{LIGHT_OUT} has {len(changed)} uncommitted change(s) (first: {changed[0]!r}); commit or move them "
                       "first: the light tree takes the folder out of git's index, and nothing uncommitted may ride on that")
    state = {"since_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "root": str(root),
             "head": _git(root, "rev-parse", "HEAD").decode().strip(), "entries": entries, "status": _status(root)}
    path = state_path(root)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(state, indent=0))
    os.replace(tmp, path)  # recorded before the index changes: restore can always find it
    try:
        _git(root, "rm", "-r", "-q", "--cached", "--", LIGHT_OUT)
        (folder / ".gitignore").write_text(f"{IGNORE_MARK}\n*\n")
    except (KitError, OSError) as exc:
        restore(root)
        raise KitError(f"{exc} (the tree was restored)") from None
    return state


def restore(root: Path) -> str:
    """Undo :func:`make_light` in checkout ``root``: the recorded index entries back (``git
    update-index --index-info``: same modes and blob ids, whatever HEAD is now), the ignore file
    removed, the state file last; returns one line saying what it did (also when the tree was not
    light: idempotent).

    Raises:
        KitError: the index afterwards does not list exactly the recorded entries (named; the state
            file is kept, so the command can run again), or an ignore file that is not the light
            tree's (kept: someone else's).
    """
    state = light_state(root)
    ignore = root / LIGHT_OUT / ".gitignore"
    ours = ignore.is_file() and ignore.read_text().startswith(IGNORE_MARK)
    if state is None:
        if ours:
            ignore.unlink()
        return "the tree is not light: nothing to restore"
    listing = "".join(f"{e}\0" for e in state["entries"]).encode("utf-8", "surrogateescape")
    _git(root, "update-index", "-z", "--index-info", stdin=listing)
    if ours:
        ignore.unlink()
    elif ignore.exists():
        raise KitError(f"{ignore} is not the light tree's (it lacks the first line {IGNORE_MARK!r}); the index is back, "
                       f"the file is kept: remove or commit it, then `{RESTORE}` again")
    subprocess.run(["git", "update-index", "-q", "--refresh"], cwd=root, capture_output=True)  # stat data; rc 1 = changed files
    now = _entries(root)
    if now != state["entries"]:
        odd = sorted(set(now) ^ set(state["entries"]))
        raise KitError(f"git's index lists {len(now)} entries under {LIGHT_OUT}, not the {len(state['entries'])} recorded "
                       f"(first difference: {odd[0].split(chr(9))[-1]!r}); the state file {state_path(root)} is kept")
    state_path(root).unlink()
    head = _git(root, "rev-parse", "HEAD").decode().strip()
    moved = "" if head == state["head"] else (
        f"; HEAD moved since light ({state['head'][:10]} -> {head[:10]}): a commit made while light deleted {LIGHT_OUT} "
        "(git show --stat), and the entries now staged undo that: commit them")
    same = "as before light" if _status(root) == state["status"] else "changed since light (work done meanwhile)"
    return f"restored: {len(now)} entries of {LIGHT_OUT} back in git's index, the ignore file removed; git status {same}{moved}"
