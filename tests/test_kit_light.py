"""The light tree (scripts/kit_light.py, ``offline_kit.py light PART`` / ``restore``): docs/results out
of what one device command sends, and back, in throwaway git checkouts.

Checked: ``light`` removes exactly docs/results from ``git ls-files`` and from what the device tool
sends (tracked plus untracked-not-ignored files), leaves every file on disk with its bytes, and
measures what it said ``build`` would; ``restore`` gives back a byte-identical ``git ls-files
--stage`` and ``git status --porcelain`` (modes, links, odd names and local changes elsewhere
included) and is idempotent; while light, every kit command says so and ``collect`` refuses; ``light``
refuses uncommitted changes under docs/results, a second ``light``, and a kit that leaves under 20
MiB beside the light tree, changing nothing; a light worktree hides nothing from the repository's
other worktrees; a commit made while light is undone by ``restore``."""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts"))
try:
    import kit_light
    import kit_sizes
    import offline_kit
finally:
    sys.path.pop(0)


def _git(repo: Path, *args: str) -> bytes:
    return subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@example.org", *args], cwd=repo,
                          capture_output=True, check=True).stdout


def _write(repo: Path, rel: str, data: bytes) -> None:
    (repo / rel).parent.mkdir(parents=True, exist_ok=True)
    (repo / rel).write_bytes(data)


def _repo(tmp_path: Path) -> Path:
    """A committed checkout laid out like this one (src/, docs/results/ with a report's plot, an
    executable, a link and an odd name; .gpu-kit/ ignored), then local changes outside docs/results:
    a modified file, a staged new one and an untracked one."""
    repo = tmp_path / "checkout"
    for rel, data in (("src/a.py", b"a = 1\n"), (".gitignore", b"/.gpu-kit/\n"), ("docs/results/README.md", b"# results\n"),
                      ("docs/results/m1/result.json", b'{"test": 0.5}\n'), ("docs/results/m1/report_files/p.png", os.urandom(3000)),
                      ("docs/results/m1/run.sh", b"#!/bin/sh\n"), ("docs/results/m2/w\u00e9ird name.json", b"{}\n")):
        _write(repo, rel, data)
    (repo / "docs/results/m1/run.sh").chmod(0o755)
    (repo / "docs/results/latest").symlink_to("m1")
    _git(repo, "init", "-q")
    _git(repo, "add", "-A")
    _git(repo, "commit", "-q", "-m", "results")
    _write(repo, "src/a.py", b"a = 2\n")
    _write(repo, "src/b.py", b"b = 1\n")
    _git(repo, "add", "src/b.py")
    _write(repo, "notes.txt", b"notes\n")
    return repo


def _disk(repo: Path) -> dict[str, str]:
    """Every path under ``repo`` but .git: a file's sha256, a link's target."""
    out = {}
    for p in sorted(repo.rglob("*")):
        rel = p.relative_to(repo).as_posix()
        if rel == ".git" or rel.startswith(".git/"):
            continue
        if p.is_symlink():
            out[rel] = "-> " + os.readlink(p)
        elif p.is_file():
            out[rel] = hashlib.sha256(p.read_bytes()).hexdigest()
    return out


def _index(repo: Path) -> tuple[bytes, bytes]:
    return _git(repo, "ls-files", "--stage", "-z"), _git(repo, "status", "--porcelain", "-z")


def _sent(repo: Path) -> set[str]:
    """What the device tool sends: tracked files and untracked files git does not ignore."""
    return {n for n in _git(repo, "ls-files", "-z", "-co", "--exclude-standard").decode().split("\0") if n}


@pytest.fixture
def repo(tmp_path, monkeypatch):
    """:func:`_repo`, as offline_kit's checkout (``ROOT``)."""
    checkout = _repo(tmp_path)
    monkeypatch.setattr(offline_kit, "ROOT", checkout)
    return checkout


@pytest.fixture
def kit(tmp_path, repo):
    """A small, valid kit of part speed (no wheels; the data files it reads), built beside ``repo``."""
    data = tmp_path / "data"
    for rel in ("MANIFEST.md", "tinystories/v.txt", "tokenizers/gpt2/vocab.json"):
        _write(data, rel, b"x" * 500)
    (tmp_path / "no-wheels").mkdir()
    offline_kit.build("speed", tmp_path / "kits", data, wheels_from=tmp_path / "no-wheels", root=repo)
    return tmp_path / "kits"


def test_light_leaves_out_exactly_docs_results_and_restore_gives_the_index_back(tmp_path, repo, kit, capsys):
    before, disk, sent = _index(repo), _disk(repo), _sent(repo)
    tracked = set(_git(repo, "ls-files", "-z").decode().split("\0")) - {""}
    results = {n for n in tracked if n.startswith("docs/results/")}
    assert len(results) == 6 and "docs/results/latest" in results
    expected = offline_kit.check_travel(kit / "speed", repo)  # what build prints for the light tree

    assert offline_kit.main(["light", "speed", "--kit", str(kit)]) == 0
    out = capsys.readouterr().out
    assert "docs/results out of git's index (6 entries)" in out and "speed: one device command now sends" in out
    assert set(_git(repo, "ls-files", "-z").decode().split("\0")) - {""} == tracked - results  # exactly docs/results
    assert set(kit_sizes.tree_files(repo)) == _sent(repo) == sent - results and "notes.txt" in sent  # what travels
    now = offline_kit.check_travel(kit / "speed", repo)
    assert now["tree"] == pytest.approx(expected["light_tree"]) and now["total"] == pytest.approx(expected["light_total"])
    assert {k: v for k, v in _disk(repo).items() if k != "docs/results/.gitignore"} == disk  # every file, every byte
    status = [e for e in _git(repo, "status", "--porcelain", "-z").decode().split("\0") if e]
    assert sorted(status) == sorted([*before[1].decode().split("\0")[:-1], *(f"D  {n}" for n in results)])  # no "??"

    # while light: every kit command says so, collect refuses, a second light refuses
    offline_kit.main(["run", "speed", "--archive", str(tmp_path / "a.tar.gz"), "--budget-s", "0"])
    assert "the tree is LIGHT since" in capsys.readouterr().err
    assert offline_kit.main(["collect", str(tmp_path / "a.tar.gz")]) == 2
    err = capsys.readouterr().err
    assert "collect writes into docs/results, which is ignored while light: restore first" in err and err.count("\n") == 1
    assert offline_kit.main(["light", "speed", "--kit", str(kit)]) == 2
    assert "the tree is light already" in capsys.readouterr().err

    assert offline_kit.main(["restore"]) == 0
    assert "restored: 6 entries of docs/results back in git's index, the ignore file removed; git status as before light" \
        in capsys.readouterr().out
    assert _index(repo) == before and _disk(repo) == disk  # byte-identical listing and status; nothing left behind
    assert offline_kit.main(["restore"]) == 0 and "not light: nothing to restore" in capsys.readouterr().out
    assert _index(repo) == before and kit_light.notice(repo) is None


@pytest.mark.parametrize("change, first", [
    (lambda r: _write(r, "docs/results/m1/result.json", b'{"test": 0.9}\n'), "docs/results/m1/result.json"),
    (lambda r: _write(r, "docs/results/new/comparison.json", b"{}\n"), "docs/results/new/comparison.json"),
    (lambda r: (_write(r, "docs/results/new.md", b"n\n"), _git(r, "add", "docs/results/new.md")), "docs/results/new.md"),
    (lambda r: (r / "docs/results/README.md").unlink(), "docs/results/README.md"),
    (lambda r: _write(r, "docs/results/.gitignore", b"*.tmp\n"), "docs/results/.gitignore exists"),
], ids=["modified", "untracked", "staged", "deleted", "own-gitignore"])
def test_light_refuses_uncommitted_changes_under_docs_results_and_changes_nothing(repo, kit, capsys, change, first):
    change(repo)
    before, disk = _index(repo), _disk(repo)
    assert offline_kit.main(["light", "speed", "--kit", str(kit)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("offline kit: ") and first in err and err.count("\n") == 1
    assert _index(repo) == before and _disk(repo) == disk and kit_light.light_state(repo) is None


def test_a_kit_that_leaves_under_20_mib_beside_the_light_tree_is_refused(tmp_path, repo, kit, capsys):
    """45 MiB committed under docs/results: build accepts (the light tree leaves it out) and prints
    both trees' figures; 45 MiB anywhere else: build and light refuse, and light changes nothing."""
    data = tmp_path / "data"
    build = ["build", "speed", "--out", str(kit), "--data-dir", str(data), "--wheels-from", str(tmp_path / "no-wheels")]
    for rel in ("docs/results/big/predictions.npz", "data/big.bin"):
        (repo / rel).parent.mkdir(parents=True, exist_ok=True)
        with (repo / rel).open("wb") as f:
            f.truncate(45 << 20)  # sparse: the size counts, no disk is written
        _git(repo, "add", rel)
        _git(repo, "commit", "-q", "-m", rel)
        if rel.startswith("docs/results/"):
            assert offline_kit.main(build) == 0
            out = capsys.readouterr().out
            assert "after `light`: the light tree (0.0 MiB, docs/results left out) + the kit = 0.0 MiB of the device tool's " \
                   "64 MiB, 64.0 MiB free (at least 20 kept); without `light`: the whole tree (45.0 MiB) + the kit = 45.0 " \
                   "MiB, 19.0 MiB free" in out
    before, disk = _index(repo), _disk(repo)
    assert offline_kit.main(["light", "speed", "--kit", str(kit)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("offline kit: speed: even with the light tree (docs/results left out) the device command would "
                          "send 45.0 MiB") and "the light tree's largest folders: data 45.0 MiB" in err
    assert _index(repo) == before and _disk(repo) == disk and kit_light.light_state(repo) is None
    assert offline_kit.main(build) == 2 and "leaving 19.0 MiB, under the 20 MiB kept free" in capsys.readouterr().err
    assert not (kit / "speed").exists()


def test_a_light_worktree_hides_nothing_from_the_other_worktrees(tmp_path):
    """The ignore is a file of the light worktree (docs/results/.gitignore), not a line of the
    repository's shared .git/info/exclude: another worktree still sees new results as untracked."""
    repo = _repo(tmp_path)
    other = tmp_path / "other"
    _git(repo, "worktree", "add", "-q", str(other))
    kit_light.make_light(other)
    assert not any(n.startswith("docs/results/") for n in _sent(other))
    _write(repo, "docs/results/m3/comparison.json", b"{}\n")
    assert "docs/results/m3/comparison.json" in _sent(repo)  # the main worktree: untracked, not ignored
    assert kit_light.notice(repo) is None and kit_light.notice(other) is not None  # the state is per worktree
    kit_light.restore(other)
    assert "docs/results/m1/result.json" in _sent(other)


def test_restore_undoes_a_commit_made_while_light(tmp_path, capsys):
    repo = _repo(tmp_path)
    (repo / "src/a.py").write_bytes(b"a = 1\n")  # back to HEAD: only the staged b.py and notes.txt remain
    listing = _git(repo, "ls-files", "--stage", "-z")
    kit_light.make_light(repo)
    _git(repo, "commit", "-q", "-m", "a commit made while light")  # deletes docs/results
    assert not _git(repo, "ls-tree", "-r", "--name-only", "HEAD", "docs/results")
    message = kit_light.restore(repo)
    assert "HEAD moved since light" in message and "commit them" in message
    assert _git(repo, "ls-files", "--stage", "-z") == listing
    _git(repo, "commit", "-q", "-m", "results back")
    assert _git(repo, "diff", "--stat", "HEAD~2", "HEAD", "--", "docs/results") == b""
