"""Reading a split's table files: Parquet (shared/data's format), CSV, TSV and JSON lines.

    read_table(path, "csv", where, text_columns=("text",))  → DataFrame, every column as stored

Text columns are read as text, never as numbers (a CSV cell ``123`` stays the string ``"123"``);
only an empty CSV cell is a missing value (``NA`` or ``null`` are words). Labels are parsed as
the file has them; :mod:`oelm.data.classification` checks them. A file that cannot be read is a
:class:`~oelm.errors.DataFormatError` naming the file, the format and the fix.
"""

from __future__ import annotations

import csv
from pathlib import Path
from typing import TYPE_CHECKING, Sequence

from oelm.errors import DataFormatError

if TYPE_CHECKING:  # pandas (~0.4 s to import) is imported where a file is read, not with oelm.data
    import pandas as pd

__all__ = ["TABLE_FORMATS", "read_table"]

#: table formats (``DatasetSpec.local_formats``) and what a file of each is
TABLE_FORMATS = {
    "parquet": "Parquet",
    "csv": "CSV (comma-separated, a header row, RFC 4180 quoting)",
    "tsv": "TSV (tab-separated, a header row, no quoting, as GLUE's files)",
    "jsonl": "JSON lines (one JSON object per line)",
}


def read_table(path: Path, fmt: str, where: str, text_columns: Sequence[str] = (), fix: str | None = None) -> pd.DataFrame:
    """The table at ``path`` in format ``fmt`` (a key of :data:`TABLE_FORMATS`).

    Args:
        where: what the file is, for messages (``"sst2/train"``).
        text_columns: columns read as text (CSV / TSV / JSON lines; Parquet keeps its types).
        fix: the end of the message when the file cannot be read; default: replace it with
            shared/data's copy.

    Raises:
        DataFormatError: the file cannot be read in that format (damaged, empty, another format).
    """
    import pandas as pd  # here, not at module level: ~0.4 s that `import oelm.data` need not pay

    fix = fix or "Fix: replace it with the file from shared/data (see its MANIFEST.md for the sha256)."
    text = {c: str for c in text_columns}
    try:
        if fmt == "parquet":
            return pd.read_parquet(path)
        if fmt == "csv":
            return pd.read_csv(path, dtype=text, keep_default_na=False, na_values=[""])
        if fmt == "tsv":
            return pd.read_csv(path, sep="\t", quoting=csv.QUOTE_NONE, dtype=text, keep_default_na=False, na_values=[""])
        if fmt == "jsonl":
            return pd.read_json(path, lines=True, dtype=False)
    except Exception as exc:  # pyarrow and pandas raise many types for a damaged or foreign file
        message = " ".join(str(exc).split())[:200]
        raise DataFormatError(f"{where}: cannot read {path} as {TABLE_FORMATS[fmt].split(' (')[0]} "
                              f"({type(exc).__name__}: {message}). {fix}") from exc
    raise DataFormatError(f"{where}: {path}: {fmt!r} is not a table format; known: {', '.join(TABLE_FORMATS)}")
