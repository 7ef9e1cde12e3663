"""Error types raised by oelm.

Every error oelm raises on bad input derives from :class:`OELMError`, so callers (and the CLI)
can tell a user mistake, reported with a clear message, from a bug, which keeps its traceback.
"""

from __future__ import annotations


class OELMError(Exception):
    """Base class for every error oelm raises deliberately (bad config, missing data, ...)."""


class ConfigError(OELMError, ValueError):
    """A configuration file or value is invalid; the message names the key and the fix."""


def env_switch(name: str, on: str, off: str) -> bool:
    """The environment variable ``name`` as an on/off switch: unset or ``1`` on (the default), ``0``
    off. ``on`` / ``off`` say what each value does (they end the error message).

    Raises:
        ConfigError: any other value: ``NAME='value': use 1 (on) or 0 (off)``, one line.
    """
    import os

    value = os.environ.get(name, "1").strip()
    if value not in ("0", "1"):
        raise ConfigError(f"{name}={value!r}: use 1 ({on}) or 0 ({off})")
    return value == "1"


class DataNotFoundError(OELMError, FileNotFoundError):
    """A dataset split is neither under the data directory nor reachable on the Hugging Face Hub."""


class DataFormatError(OELMError, ValueError):
    """A dataset file exists but has the wrong columns, labels or content."""


class UnsupportedModelError(OELMError, TypeError):
    """``apply_oelm`` cannot find attention query/key projections in the given model."""


class RunFaultError(OELMError):
    """A training run stopped on a fault inside the run (not bad input).

    Attributes:
        kind: ``"nan"`` (NaN/Inf loss or gradients), ``"oom"`` (out of memory), ``"disk_full"``
            (no space left while writing a checkpoint or result), or another short tag.
        step: the optimizer step at which the fault was detected (None if before training).

    The experiment runner records ``kind``, ``step`` and the message in the run's result with
    ``status: "failed"`` and goes on with the next run of the matrix.
    """

    def __init__(self, message: str, *, kind: str, step: int | None = None) -> None:
        super().__init__(message)
        self.kind = kind
        self.step = step


class RunInterruptedError(OELMError):
    """A run was stopped by SIGTERM/SIGINT after saving a checkpoint; rerunning resumes it."""

    def __init__(self, message: str, *, step: int | None = None, signal_name: str = "SIGTERM") -> None:
        super().__init__(message)
        self.step = step
        self.signal_name = signal_name


class RunLostError(OELMError):
    """The process or node training a run was lost beyond the executor's retries (Ray: a worker
    that crashed ``max_retries + 1`` times, a dead raylet, a node marked dead). The runs that
    finished are kept; rerunning the same command continues the lost run from its checkpoint."""


class OutputLockedError(OELMError):
    """Another ``oelm run`` holds the output directory's lock (``.oelm.lock``); the message names
    it (pid, host, start time) and says what to do."""


class ChecksumError(OELMError, ValueError):
    """A file does not match the sha256 (or size) recorded for it; the message names the file,
    where the record is, and how to recreate it."""


class RecordedFileMissingError(ChecksumError):
    """A file whose sha256 is recorded is not there at all (weights left out of committed
    results, say), as opposed to there but different."""


class DamagedFileError(OELMError, ValueError):
    """A JSON file oelm wrote (``result.json``, ``comparison.json``, ``sweep.json``, ...) does not
    parse, or holds a value of the wrong type (a hand edit, a copy cut short); the message names
    the file (and the field) and what to do."""


class FileFormatError(OELMError, ValueError):
    """A file oelm wrote has a layout version (``format``) this oelm does not read: newer (an
    upgrade reads it), older, or none; the message names the file, both versions and the fix. Not
    damage: a rerun never moves such a file aside."""


class OutsideFolderError(OELMError, ValueError):
    """A path oelm was to read or write leads outside the folder that owns it (an output, cache or
    data folder): an absolute or ``..`` path in a record, or a symbolic link planted inside the
    folder. The message names the path, where it leads and the fix."""


class CheckpointError(OELMError, ValueError):
    """A checkpoint directory is missing, incomplete, of another format, or does not fit the model."""


class CheckpointMismatchError(CheckpointError):
    """A frozen tensor (regenerated from its recipe, or about to be loaded into a model) differs
    from the one the checkpoint was trained with.

    Attributes:
        tensor: the first parameter name whose sha256 (or dtype/shape, or value) differs.
        mismatched: every parameter name that differs.
    """

    def __init__(self, message: str, *, tensor: str, mismatched: list[str]) -> None:
        super().__init__(message)
        self.tensor = tensor
        self.mismatched = mismatched
