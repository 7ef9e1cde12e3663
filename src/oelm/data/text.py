"""Text helpers shared by every data module (classification, language modelling, tokenizers):
the check that texts are strings a tokenizer can take, and the digest of a document list that
keys the token and encoding caches."""

from __future__ import annotations

import hashlib
from typing import Any, Sequence

from oelm.errors import DataFormatError

__all__ = ["check_texts", "documents_digest"]


def check_texts(texts: Sequence[Any], where: str, unit: str = "item") -> None:
    """Check that every item of ``texts`` is a ``str`` that UTF-8 can encode (what tokenizers need).

    ``where`` starts the message (e.g. ``"sst2/train (path): column 'text'"``); ``unit`` names one
    item in it ("row", "document").

    Raises:
        DataFormatError: the first bad item, with its position and type: a non-string value
            (bytes, a number, ...) or a string with a lone UTF-16 surrogate (``"\\ud800"``).
    """
    for i, text in enumerate(texts):
        if not isinstance(text, str):
            shown = repr(text)[:60]
            raise DataFormatError(
                f"{where}: {unit} {i} is {type(text).__name__} {shown}, not text (str). "
                "Fix: store text as UTF-8 strings (decode bytes first)."
            )
        try:
            text.encode("utf-8")
        except UnicodeEncodeError as exc:
            raise DataFormatError(
                f"{where}: {unit} {i} is not valid Unicode text ({exc.reason} at character {exc.start}: "
                f"{text[max(0, exc.start - 10):exc.end + 10]!r}). Fix: repair or drop that text "
                "(e.g. text.encode('utf-8', 'replace').decode())."
            ) from None


def documents_digest(documents: Sequence[str]) -> str:
    """sha256 (hex) of a document list; boundaries count ("ab" ≠ "a", "b")."""
    h = hashlib.sha256()
    for doc in documents:
        data = doc.encode("utf-8")
        h.update(len(data).to_bytes(8, "little"))
        h.update(data)
    return h.hexdigest()
