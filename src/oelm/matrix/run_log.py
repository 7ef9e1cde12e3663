"""``runs/<run>/train.log``: what the console showed while this process trained (or promoted)
that run, whichever executor placed it (the local executor's process, a Ray worker, an
``oelm run --only`` job).

Everything written to ``sys.stdout`` and ``sys.stderr`` during the block still reaches the console
and is also appended to the file: the run's log lines (``[run] ...``), Python warnings, a progress
bar. A line rewritten in place with carriage returns (tqdm) is kept as the terminal ends up
showing it, its last state. Each block starts with a header line (UTC time, host, pid) and ends
with one naming the exception that ended it, if any, so a run resumed after an interruption or a
crash keeps its whole history in one file. Output that bypasses ``sys.stdout`` / ``sys.stderr``
(C libraries writing to the file descriptors, logging handlers made before the block) is not
copied.
"""

from __future__ import annotations

import contextlib
import os
import platform
import sys
import threading
from datetime import datetime, timezone
from pathlib import Path
from typing import IO, Any, Iterator

__all__ = ["copy_console"]


class _LineFile:
    """Appends whole lines to a file, each as its last carriage-return segment (what a terminal shows)."""

    def __init__(self, path: Path) -> None:
        self._partial = ""
        self._lock = threading.Lock()
        try:
            self._fh: IO[str] | None = path.open("a", encoding="utf-8", errors="replace")
        except OSError as exc:  # the run's own files will say what is wrong with the folder; no copy
            self._fh = None
            print(f"oelm: warning: cannot write {path} ({exc.strerror or exc}); this run's console output is not copied",
                  file=sys.stderr)

    def feed(self, text: str) -> None:
        with self._lock:
            if self._fh is None:
                return  # a stream kept after the block (a logging handler made during it): console only
            *lines, self._partial = (self._partial + text).split("\n")
            try:
                for line in lines:
                    self._fh.write(line.rsplit("\r", 1)[-1] + "\n")
                if lines:
                    self._fh.flush()
            except OSError:  # a full disk: the copy stops, the console and the run go on (the run's own
                self._drop()  # writes report the fault where it matters)

    def write_line(self, line: str) -> None:
        self.feed(("\n" if self._partial else "") + line + "\n")

    def _drop(self) -> None:
        fh, self._fh = self._fh, None
        with contextlib.suppress(OSError):
            fh.close()

    def close(self) -> None:
        with self._lock:
            if self._fh is None:
                return
            last = self._partial.rsplit("\r", 1)[-1]
            with contextlib.suppress(OSError):
                if last.strip():
                    self._fh.write(last + "\n")
            self._drop()


class _Tee:
    """``stream`` with every write also fed to a :class:`_LineFile`; everything else is the stream's."""

    def __init__(self, stream: Any, sink: _LineFile) -> None:
        self._stream, self._sink = stream, sink

    def write(self, text: str) -> int:
        self._sink.feed(text)
        return self._stream.write(text)

    def __getattr__(self, name: str) -> Any:  # flush, fileno, isatty, encoding, ...
        return getattr(self._stream, name)


def _utc() -> str:
    return datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


@contextlib.contextmanager
def copy_console(path: str | os.PathLike, what: str, enabled: bool = True) -> Iterator[None]:
    """Copy this process's console output to ``path`` (appended) during the block.

    Args:
        what: the header's subject, e.g. ``"training baseline-seed0"``.
        enabled: False does nothing (the other ranks of a multi-process launch).
    """
    if not enabled:
        yield
        return
    sink = _LineFile(Path(path))
    sink.write_line(f"=== {_utc()} {what} on {platform.node()} (pid {os.getpid()})")
    out, err = sys.stdout, sys.stderr
    sys.stdout, sys.stderr = (_Tee(s, sink) if s is not None else s for s in (out, err))
    try:
        yield
    except BaseException as exc:
        sink.write_line(f"=== {_utc()} ended by {type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}")
        raise
    finally:
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(Exception):
                stream.flush()
        sys.stdout, sys.stderr = out, err
        sink.close()
