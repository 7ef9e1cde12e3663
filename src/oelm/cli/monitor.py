"""``oelm monitor DIR``: a live terminal view of a running or finished ``oelm run`` matrix.

It only reads files the runner writes, so it can watch a run started elsewhere (another
terminal, ``nohup``) and never disturbs it:

* ``plan.json``: every planned run (name, method, stage, learning rate, seed); final runs of a
  method whose learning-rate sweep is not finished yet have no name (shown as "after sweep",
  unless a final run of that method and seed is already in ``runs/``, or the seed is a sweep
  seed, whose sweep run at the selected rate becomes its final run);
* ``runs/<name>/status.json``: state (running / finished / failed / interrupted), total steps,
  start and end times (UTC, ISO 8601), the runner's pid and host;
* ``runs/<name>/metrics.jsonl``: the latest train record (step, loss) and validation record;
* ``runs/<name>/result.json``: present once a run finished or failed.

A run whose status says ``running`` but whose process (same host) no longer exists is shown as
``interrupted``: rerunning ``oelm run`` continues it. A run whose ``result.json`` (or, without one,
``status.json``) is damaged (a hand edit, a copy cut short) is shown as ``damaged``, with the
reason below the table: rerunning ``oelm run`` moves its folder to ``runs/.damaged/`` and trains it
again.

On a terminal the view is a live table; when standard output is not a terminal (a pipe, a log
file) it prints plain lines instead: the table once, then one line per run whose state, step or
validation changed, and a summary line when it changed, until no run is left to do.
"""

from __future__ import annotations

import math
import platform
import sys
import time
from datetime import datetime
from pathlib import Path
from typing import Any

from oelm.errors import DamagedFileError, OELMError, OutsideFolderError
from oelm.io import read_json, read_json_object, read_jsonl
from oelm.metrics import get_metric
from oelm.records import MatrixFolder, RunRecord, read_record
from oelm.runtime.lock import pid_alive

__all__ = ["collect_runs", "snapshot_text", "build_table", "watch_lines", "monitor"]

STATES = ("pending", "running", "finished", "failed", "interrupted", "damaged")
HEADER = ["run", "stage", "state", "lr", "step", "train loss", "validation: best (latest)", "elapsed", "ETA", "where"]


def _read(path: Path) -> dict | None:
    """A JSON object file the runner writes, None when absent or not an object (damaged)."""
    try:
        value = read_json(path)
    except (OSError, ValueError):
        return None  # absent (files are replaced atomically, never seen half-written)
    return value if isinstance(value, dict) else None


def _damage(path: Path) -> str | None:
    """Why the JSON object file at ``path`` is damaged (one line), None when absent or sound."""
    try:
        read_json_object(path)
    except DamagedFileError as exc:
        return str(exc).split(" is damaged: ", 1)[-1].split("; ", 1)[0]
    except OSError:
        pass
    return None


def _result(path: Path) -> tuple[RunRecord | None, str | None]:
    """A run's record (None when it has no ``result.json``) and why its ``result.json`` is damaged
    (checked field by field: :func:`oelm.records.read_record`), else None."""
    try:
        return read_record(path), None
    except DamagedFileError as exc:
        return None, str(exc).split(" is damaged: ", 1)[-1].split("; ", 1)[0]
    except OSError:
        return None, None


def _last_records(path: Path) -> tuple[dict | None, dict | None, list[dict]]:
    """Latest ``train`` and ``eval`` records of a ``metrics.jsonl`` (a torn last line is skipped),
    and every ``eval`` record in order."""
    train = None
    evals = []
    for record in read_jsonl(path):
        if record.get("type") == "train":
            train = record
        elif record.get("type") == "eval":
            evals.append(record)
    return train, (evals[-1] if evals else None), evals


def _best(metric: str, values: list[Any]) -> float | None:
    """The best of ``values`` for ``metric`` (highest accuracy, lowest perplexity); None if none."""
    finite = [float(v) for v in values if isinstance(v, (int, float)) and math.isfinite(v)]
    if not finite:
        return None
    try:
        higher = get_metric(metric).higher_is_better
    except ValueError:  # an unknown metric name: no direction to pick the best by
        return None
    return max(finite) if higher else min(finite)


def _number(value: Any) -> float | None:
    """``value`` when it is a finite number (not a bool), else None: hand-edited files hold anything."""
    ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
    return value if ok else None


def _parse_time(value: str | None) -> float | None:
    if not isinstance(value, str) or not value:
        return None
    try:
        return datetime.fromisoformat(value).timestamp()
    except ValueError:
        return None


def collect_runs(out: Path, now: float | None = None) -> list[dict[str, Any]]:
    """One dict per planned or existing run of the matrix in ``out``, in plan order.

    Keys: ``name``, ``method``, ``seed``, ``stage``, ``learning_rate``, ``state`` (one of
    :data:`STATES`), ``step``, ``total_steps``, ``train_loss``, ``validation`` (latest value, the
    metric named in ``metric``), ``best_validation`` (the best so far; a finished run's from its
    result, the number learning-rate selection uses), ``elapsed_seconds`` and ``eta_seconds`` (None when unknown),
    ``early_stopped`` (a finished run that stopped before ``total_steps``: early stopping), ``node``
    and ``pid`` (the process that trains or trained it, from ``status.json``: whichever executor or
    machine), ``executor`` (a finished run's executor name), ``damage`` (why its ``result.json`` or
    ``status.json`` cannot be read: state ``damaged``; else None), ``outside`` (only on a row whose file
    is a symbolic link, or whose name leads outside ``runs/``: nothing is read through it, and a rerun
    refuses it rather than setting it aside).

    Raises:
        OELMError: ``out`` is not an ``oelm run`` output directory.
    """
    out = Path(out)
    folder = MatrixFolder(out)
    plan = _read(folder.plan)
    if plan is None and not folder.runs.is_dir():
        raise OELMError(f"{out} is not an oelm run output directory (no plan.json or runs/); pass the --output-dir of `oelm run`")
    now = time.time() if now is None else now
    rows = [_checked_row(folder, e, now) for e in _entries(folder, plan)]
    # A restarted matrix rewrites plan.json before it has selected any rate again, so a method's
    # finals are "after sweep" placeholders there even where its final runs exist: not pending.
    # Nor is a sweep seed's placeholder: the sweep run at the selected rate becomes that seed's
    # final run, so no run is left to do for it.
    done = {(r["method"], r["seed"]) for r in rows if r["name"] and r["stage"] in ("final", "sweep")}
    return [r for r in rows if r["name"] or (r["method"], r["seed"]) not in done]


def _entries(folder: MatrixFolder, plan: dict | None) -> list[dict[str, Any]]:
    """The runs to show: ``plan.json``'s, in plan order (each run once), then every other run
    folder under ``runs/`` (its identity from its ``status.json``)."""
    entries, planned = [], set()
    listed = (plan or {}).get("runs")
    for e in listed if isinstance(listed, list) else []:
        if not isinstance(e, dict) or not isinstance(e.get("name"), (str, type(None))):
            continue  # a hand-damaged plan.json: its runs are still found under runs/
        if e.get("name") in planned:
            continue  # the selected sweep run is also that seed's final run: one row
        planned.add(e.get("name")) if e.get("name") else None
        entries.append(e)
    for d in folder.run_folders():
        if d.name not in planned:
            try:
                status = _read(d.status) or {}
            except OutsideFolderError:  # a linked status.json: its row says why
                status = {}
            entries.append({"name": d.name, "method": status.get("method"), "seed": status.get("seed"),
                            "learning_rate": status.get("learning_rate"), "stage": status.get("stage")})
    return entries


def _checked_row(folder: MatrixFolder, e: dict[str, Any], now: float) -> dict[str, Any]:
    """:func:`_row`, or, when a file of the run is a symbolic link or its name leads outside
    ``runs/`` (:func:`oelm.io.inside`: nothing is read through it), the run's row as ``damaged``
    with that reason."""
    try:
        return _row(folder, e, now)
    except OutsideFolderError as exc:
        return _row(folder, {**e, "name": None}, now) | {"name": e.get("name"), "state": "damaged", "damage": str(exc),
                                                         "outside": True}


def _row(folder: MatrixFolder, e: dict[str, Any], now: float) -> dict[str, Any]:
    """One run's row (:func:`collect_runs`): from its status, its record and its metrics log."""
    row = {"name": e.get("name"), "method": e.get("method"), "seed": e.get("seed"), "stage": e.get("stage"),
           "learning_rate": e.get("learning_rate"), "state": "pending", "step": None, "total_steps": None,
           "train_loss": None, "validation": None, "best_validation": None, "metric": None,
           "elapsed_seconds": None, "eta_seconds": None,
           "early_stopped": False, "node": None, "pid": None, "executor": None, "damage": None}
    if not e.get("name"):
        return row
    d = folder.run(e["name"])
    status = _read(d.status) or {}
    record, damage = _result(d.result)
    damaged_file = d.result
    if damage is None and record is None and d.status.exists():
        damage, damaged_file = _damage(d.status), d.status
    train, evaluation, evals = _last_records(d.metrics)
    row["total_steps"] = _number(status.get("total_steps"))
    row["node"], row["pid"] = status.get("host"), status.get("pid")
    if train:
        row["step"], row["train_loss"] = _number(train.get("step")), _number(train.get("loss"))
    if evaluation:
        metric = next((k for k in evaluation if k not in ("type", "step", "loss", "elapsed_seconds")), None)
        row["metric"], row["validation"] = metric, _number(evaluation.get(metric))
        row["best_validation"] = _best(metric, [e.get(metric) for e in evals]) if metric else None
    # a folder with no status and no record yet (made, not started, or emptied by hand) is not running
    state = status.get("state") or ("running" if d.metrics.exists() else "pending")
    if damage is not None:
        state = "damaged"
        row["damage"] = f"{damaged_file}: {damage}"
    elif record is not None:
        state = "failed" if record.failed else "finished"
        if state == "finished":
            row["step"] = record.steps if record.steps is not None else row["step"]
            row["best_validation"] = record.best_validation if record.best_validation is not None else row["best_validation"]
            row["early_stopped"] = record.early_stopped
            row["stage"] = record.stage or row["stage"]
            row["executor"] = record.executor_name if record.executor else None
    elif state == "running" and status.get("host") == platform.node() and status.get("pid") and not pid_alive(status["pid"]):
        state = "interrupted"
    row["state"] = state
    row["elapsed_seconds"] = _elapsed(status, record, train, state, now)
    if state == "running" and row["step"] and row["total_steps"] and train and _number(train.get("elapsed_seconds")):
        per_step = train["elapsed_seconds"] / row["step"]
        row["eta_seconds"] = max(0.0, per_step * (row["total_steps"] - row["step"]))
    return row


def _elapsed(status: dict, record: RunRecord | None, train: dict | None, state: str, now: float) -> float | None:
    """A run's own time in seconds, across resumes: a finished run's ``timing.total_seconds``;
    otherwise the larger of its last train record's ``elapsed_seconds`` (which counts earlier
    processes of a resumed run) and the time since ``status.json``'s ``started_at`` (which a
    resume resets, so alone it shows only the last process)."""
    total = record.total_seconds if record is not None else None
    if state == "finished" and total is not None:
        return float(total)
    started = _parse_time(status.get("started_at"))
    ended = _parse_time(status.get("finished_at")) if state != "running" else None
    since_start = None if started is None else max(0.0, (ended or now) - started)
    logged = _number((train or {}).get("elapsed_seconds"))
    values = [v for v in (since_start, logged) if v is not None]
    return max(values) if values else None


def _duration(seconds: float | None) -> str:
    if seconds is None:
        return "–"
    seconds = int(round(seconds))
    h, rest = divmod(seconds, 3600)
    m, s = divmod(rest, 60)
    return f"{h}:{m:02d}:{s:02d}" if h else f"{m}:{s:02d}"


def _cells(row: dict[str, Any]) -> list[str]:
    step = "–" if row["step"] is None else str(row["step"])
    if row["total_steps"]:
        step += f"/{row['total_steps']}"
    name = row["name"] or f"{row['method']}-seed{row['seed']} (after sweep)"
    validation = "–" if row["validation"] is None else f"{row['metric']} {row['validation']:.3f}"
    if row["validation"] is not None and row["best_validation"] is not None:
        validation = f"{row['metric']} {row['best_validation']:.3f} ({row['validation']:.3f})"
    return [
        name,
        row["stage"] or "–",
        row["state"] + (" (early stop)" if row.get("early_stopped") else ""),
        "–" if _number(row["learning_rate"]) is None else f"{row['learning_rate']:g}",
        step,
        "–" if row["train_loss"] is None else f"{row['train_loss']:.4f}",
        validation,
        _duration(row["elapsed_seconds"]),
        _duration(row["eta_seconds"]),
        f"{row['node']}:{row['pid']}" if row["state"] == "running" and row["node"] else (row["executor"] or ""),
    ]


def matrix_eta_seconds(running_eta: list[float], left: int, mean_run: float) -> float:
    """Seconds until a matrix is done: the runs running now finish after ``running_eta`` seconds
    each, and the ``left`` runs not started, ``mean_run`` seconds each, go one by one to whichever
    of those ``max(1, len(running_eta))`` lanes (runs training side by side) is free first."""
    lanes = sorted(running_eta) or [0.0]
    for _ in range(left):
        lanes[0] += mean_run
        lanes.sort()
    return max(lanes)


def _summary(rows: list[dict[str, Any]]) -> str:
    counts = {s: sum(r["state"] == s for r in rows) for s in STATES}
    done = [r["elapsed_seconds"] for r in rows if r["state"] == "finished" and r["elapsed_seconds"]]
    left = counts["pending"] + counts["interrupted"]
    eta = ""
    if done and (left or counts["running"]):
        mean = sum(done) / len(done)
        running = [r["eta_seconds"] or 0.0 for r in rows if r["state"] == "running"]
        lanes = f", {len(running)} at a time" if len(running) > 1 else ""
        eta = f"; matrix ETA ~{_duration(matrix_eta_seconds(running, left, mean))} (mean finished run {_duration(mean)}{lanes})"
    return f"{len(rows)} runs: " + ", ".join(f"{counts[s]} {s}" for s in STATES) + eta


def _notes(out: Path, rows: list[dict[str, Any]]) -> list[str]:
    """Lines below the table: each damaged run's file and reason (and what to do), a damaged plan.json."""
    notes = [f"damaged: {r['damage']}" + ("" if r.get("outside") else " (rerun `oelm run` with this --output-dir: it moves "
             "the run's folder to runs/.damaged/ and trains the run again)") for r in rows if r.get("damage")]
    plan = MatrixFolder(out).plan
    reason = _damage(plan)
    if reason:
        notes.append(f"damaged: {plan}: {reason} (runs shown from runs/; `oelm run` writes it again)")
    return notes


def _plain_table(rows: list[dict[str, Any]]) -> list[str]:
    table = [HEADER] + [_cells(r) for r in rows]
    widths = [max(len(line[i]) for line in table) for i in range(len(HEADER))]
    return ["  ".join(c.ljust(w) for c, w in zip(line, widths)).rstrip() for line in table]


def snapshot_text(out: Path) -> str:
    """A plain-text table of :func:`collect_runs` plus a summary line (``--once``)."""
    rows = collect_runs(out)
    lines = [f"oelm monitor: {out}", *_plain_table(rows), _summary(rows), *_notes(out, rows)]
    return "\n".join(lines) + "\n"


def _line(row: dict[str, Any]) -> str:
    """One run as one plain line: ``name: state, step 3/4, train loss ..., validation ...``."""
    c = dict(zip(HEADER, _cells(row)))
    parts = [f"{c['state']}", f"step {c['step']}", f"train loss {c['train loss']}",
             f"validation {c['validation: best (latest)']}", f"elapsed {c['elapsed']}"]
    if row["state"] == "running":
        parts.append(f"ETA {c['ETA']}")
    return f"{c['run']}: " + ", ".join(parts) + (f" ({row['damage']})" if row.get("damage") else "")


def _left(rows: list[dict[str, Any]]) -> bool:
    """Whether any run is still to do (pending, running or interrupted)."""
    return any(r["state"] in ("pending", "running", "interrupted") for r in rows)


def watch_lines(out: Path, *, interval: float = 2.0, write=print, sleep=time.sleep,
                max_refreshes: int | None = None) -> int:
    """The plain-line view (standard output not a terminal): the table once, then every
    ``interval`` seconds one line per run whose state, step or validation changed (stamped with
    the local time) and the summary when it changed; returns 0 once no run is left to do (every
    run finished, failed or damaged), or after ``max_refreshes`` refreshes. No ANSI codes."""
    rows = collect_runs(out)
    for line in [f"oelm monitor: {out}", *_plain_table(rows), _summary(rows), *_notes(out, rows)]:
        write(line)
    seen = {r["name"] or (r["method"], r["seed"]): _line(r) for r in rows}
    summary, refreshes = _summary(rows), 0
    while _left(rows) and (max_refreshes is None or refreshes < max_refreshes):
        sleep(interval)
        refreshes += 1
        rows = collect_runs(out)
        stamp = time.strftime("%H:%M:%S")
        for r in rows:
            key, text = r["name"] or (r["method"], r["seed"]), _line(r)
            # the clock columns change every refresh; a line is printed when anything else does
            if _strip_clock(seen.get(key)) != _strip_clock(text):
                write(f"{stamp} {text}")
            seen[key] = text
        if _summary(rows).split("; matrix ETA")[0] != summary.split("; matrix ETA")[0]:
            summary = _summary(rows)
            write(f"{stamp} {summary}")
    return 0


def _strip_clock(text: str | None) -> str | None:
    return None if text is None else text.split(", elapsed ")[0]


_STYLE = {"running": "bold cyan", "finished": "green", "failed": "bold red", "interrupted": "yellow", "pending": "dim",
          "damaged": "bold magenta"}


def build_table(out: Path):
    """A ``rich.table.Table`` of the matrix in ``out`` (one row per run)."""
    from rich.table import Table

    rows = collect_runs(out)
    table = Table(title=f"oelm monitor: {out}", caption="\n".join([_summary(rows), *_notes(out, rows)]))
    for i, h in enumerate(HEADER):
        table.add_column(h, justify="left" if i < 3 else "right", no_wrap=i == 0)
    for r in rows:
        table.add_row(*_cells(r), style=_STYLE.get(r["state"]))
    return table


def monitor(out: Path, *, once: bool = False, interval: float = 2.0) -> int:
    """Show the matrix in ``out``: one plain snapshot (``once``), a live table refreshed every
    ``interval`` seconds until Ctrl-C on a terminal, or plain lines (:func:`watch_lines`) when
    standard output is not a terminal. Returns the exit status (0).

    Raises:
        OELMError: ``out`` is not an ``oelm run`` output directory; ``interval`` is not a positive
            number of seconds.
    """
    if once:
        print(snapshot_text(out), end="")
        return 0
    if not (isinstance(interval, (int, float)) and math.isfinite(interval) and interval > 0):
        raise OELMError(f"--interval must be a positive number of seconds, got {interval!r}")
    if not sys.stdout.isatty():  # a pipe or a log file: plain lines, no terminal control codes
        try:
            return watch_lines(out, interval=interval, write=lambda line: print(line, flush=True))
        except KeyboardInterrupt:
            return 0
    from rich.live import Live

    table = build_table(out)
    try:
        with Live(table, refresh_per_second=max(0.1, 1.0 / max(interval, 0.1)), screen=False) as live:
            while True:
                time.sleep(interval)
                live.update(build_table(out))
    except KeyboardInterrupt:
        return 0
