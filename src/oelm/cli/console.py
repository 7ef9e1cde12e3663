"""What every ``oelm`` command prints with: the table printer (:func:`print_table`, rich) and oelm's
:func:`version`. rich is imported inside the printer, so that ``oelm --help`` stays fast."""

from __future__ import annotations

__all__ = ["print_table", "version"]


def version() -> str:
    """oelm's version from the installed package's metadata (``pip install`` / ``pip install -e``)."""
    from importlib.metadata import PackageNotFoundError
    from importlib.metadata import version as _version

    try:
        return _version("oelm")
    except PackageNotFoundError:
        return "unknown (oelm is not installed: pip install -e .)"


def print_table(title: str, header: list[str], rows: list[list[str]]) -> None:
    """Print ``rows`` under ``header`` as a rich table titled ``title`` (first column left-aligned,
    the numbers right-aligned), at least 120 characters wide."""
    from rich.console import Console
    from rich.table import Table

    table = Table(title=title, show_lines=False)
    for i, h in enumerate(header):
        table.add_column(h, justify="left" if i == 0 else "right")
    for r in rows:
        table.add_row(*r)
    Console(width=max(120, len(" ".join(header)) + 20)).print(table)
