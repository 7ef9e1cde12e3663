"""The files at the repository root that describe the project (issue 35): LICENSE is the full
Apache-2.0 text pyproject declares, CITATION.cff carries the package's version and licence and
well-formed references, and the README says what to do when the PyTorch index is unreachable."""

from __future__ import annotations

import tomllib
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]


def test_license_is_the_full_apache_text_pyproject_declares():
    text = (ROOT / "LICENSE").read_text()
    assert PYPROJECT["license"] == "Apache-2.0"
    assert text.lstrip().startswith("Apache License\n") and "Version 2.0, January 2004" in text
    for section in ("TERMS AND CONDITIONS FOR USE, REPRODUCTION, AND DISTRIBUTION", "1. Definitions.",
                    "9. Accepting Warranty or Additional Liability.", "END OF TERMS AND CONDITIONS",
                    "APPENDIX: How to apply the Apache License to your work."):
        assert section in text, section


def test_citation_file_matches_the_package():
    cff = yaml.safe_load((ROOT / "CITATION.cff").read_text())
    assert cff["cff-version"] == "1.2.0" and cff["type"] == "software"
    assert cff["version"] == PYPROJECT["version"] and cff["license"] == PYPROJECT["license"]
    assert cff["title"] and cff["message"] and cff["authors"]
    for ref in cff["references"]:
        assert {"type", "title", "authors"} <= set(ref), ref
        assert "doi" not in ref or ref["doi"].startswith("10."), ref


def test_readme_says_what_to_do_behind_a_pypi_mirror():
    readme = (ROOT / "README.md").read_text()
    install = readme[readme.index("## Install"):readme.index("## The method in three lines")]
    assert "--index-url https://download.pytorch.org/whl/cpu" in install
    assert "pip install torch==2.13.0\n" in install  # the same pin from the default index
    assert 'python -c "import torch; print(torch.__version__, torch.version.cuda)"' in install
    assert "2.13.0+cpu None" in install
    assert len(readme.splitlines()) <= 210  # the front door stays about 200 lines
