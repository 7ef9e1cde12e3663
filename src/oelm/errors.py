"""Error types raised by oelm.

Every error oelm raises on bad input derives from :class:`OELMError`, so callers (and the CLI)
can tell a user mistake, reported with a clear message, from a bug, which keeps its traceback.
"""

from __future__ import annotations


class OELMError(Exception):
    """Base class for every error oelm raises deliberately (bad config, missing data, ...)."""


class ConfigError(OELMError, ValueError):
    """A configuration file or value is invalid; the message names the key and the fix."""


class DataNotFoundError(OELMError, FileNotFoundError):
    """A dataset split is neither under the data directory nor reachable on the Hugging Face Hub."""


class DataFormatError(OELMError, ValueError):
    """A dataset file exists but has the wrong columns, labels or content."""


class UnsupportedModelError(OELMError, TypeError):
    """``apply_oelm`` cannot find attention query/key projections in the given model."""
