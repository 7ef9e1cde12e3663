"""Command line: ``oelm run | plan | stop | monitor | inspect | report | diagnose | configs | init | bench | env``.

Every deliberate error (bad config, missing data, unsupported model) is printed as one line
``oelm: error: ...`` with exit status 2; anything else is a bug and keeps its traceback.

The Hugging Face Hub is off unless asked for (``--online``, or ``HF_HUB_OFFLINE`` set in the
environment): a missing dataset or model then fails at once with one line instead of retrying
the network. ``--data-dir DIR`` sets ``OELM_DATA_DIR`` for the process (and the runs it starts).

Here: :func:`main` (the ``oelm`` entry point) and what it does before any command; the parser is
:mod:`oelm.cli.parser`, the commands :mod:`oelm.cli.run` (run, plan, stop, monitor, report, diagnose,
env, bench), :mod:`oelm.cli.inspect` and :mod:`oelm.cli.starter` (init, configs); the live view of
``oelm monitor`` is :mod:`oelm.cli.monitor`, the table printer :mod:`oelm.cli.console`. Each ``cmd_*``
imports what its command runs inside the function: ``oelm --help`` and the parser load no torch,
transformers or scipy (``tests/test_imports.py`` checks it).
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from oelm.cli.parser import build_parser
from oelm.errors import OELMError  # importing oelm sets OMP_WAIT_POLICY before torch loads

__all__ = ["main", "build_parser"]


def _apply_environment(args: argparse.Namespace) -> None:
    """``--data-dir`` -> ``OELM_DATA_DIR``; the Hub offline (``HF_HUB_OFFLINE=1``) unless
    ``--online`` or the environment already says. Done before anything imports
    huggingface_hub, which reads these once; Ray workers and launched processes inherit them.

    Raises:
        OELMError: ``--data-dir`` is not an existing directory.
    """
    data_dir = getattr(args, "data_dir", None)
    if data_dir is not None:
        path = Path(data_dir).expanduser()
        if not path.is_dir():
            raise OELMError(f"--data-dir {data_dir}: no such directory; give a folder laid out like shared/data "
                            "(see its MANIFEST.md)")
        os.environ["OELM_DATA_DIR"] = str(path.resolve())
    if getattr(args, "online", False):
        os.environ["HF_HUB_OFFLINE"] = os.environ["HF_DATASETS_OFFLINE"] = "0"
    else:
        os.environ.setdefault("HF_HUB_OFFLINE", "1")


def _skip_final_collection() -> None:
    """At interpreter exit, after every exit handler registered later (trackers, writers, threads)
    has run, freeze the heap: the final garbage collection then skips torch's and transformers'
    objects, which cost 1.5-5 s per ``oelm`` command (issue 25, item 5). Registered once."""
    import atexit
    import gc

    atexit.unregister(gc.freeze)
    atexit.register(gc.freeze)


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    # Overrides may come before or after options (`oelm run C --output-dir D a=1 b=2`); argparse
    # stops filling a positional list at the first option, so collect the rest here.
    args, extra = parser.parse_known_args(argv)
    if extra:
        if getattr(args, "command", None) in ("run", "plan", "bench") and all("=" in e and not e.startswith("-") for e in extra):
            args.overrides = list(args.overrides) + extra
        else:
            parser.error(f"unrecognized arguments: {' '.join(extra)}")
    _skip_final_collection()
    try:
        _apply_environment(args)
        return args.func(args)
    except OELMError as exc:
        print(f"oelm: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("oelm: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:  # `oelm configs | head`: the reader left; no traceback, no second error at exit
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 141


if __name__ == "__main__":
    sys.exit(main())
