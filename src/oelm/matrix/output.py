"""The driver's side of the output folder: checking it before any work (writable, same config),
recording the config and its fingerprint, preparing the shared data, and writing the plan and
the learning-rate selection (``plan.json``, ``sweep.json``). Runs never write these files."""

from __future__ import annotations

import contextlib
import math
import os
import shutil
import signal
import tempfile
import threading
from pathlib import Path
from typing import Any, Callable

import yaml

from oelm.config import ExperimentConfig, TrainingConfig
from oelm.data.identity import source_change
from oelm.data.lm import save_tokenizer as write_tokenizer  # the name save_tokenizer is a flag here
from oelm.errors import ConfigError, DamagedFileError, OELMError, RunInterruptedError
from oelm.io import read_json_object, write_json_atomic, write_text_atomic
from oelm.matrix.data import PreparedData, prepare_data
from oelm.models.pretrained import load_tokenizer
from oelm.records import (
    MatrixFolder, format_rates, grid_edge_note, read_status, read_sweep, run_name, sweep_file, utc_now,
)
from oelm.runtime.distributed import is_main_process, main_process_only

from oelm.matrix.assemble import check_init_tokenizer, resolve_init_from
from oelm.matrix.plan import Selection, plan_runs

__all__ = ["open_output_dir", "start_output", "config_fingerprint", "bind_data", "prepare_matrix_data", "interruptible", "write_plan",
           "write_selection", "COSMETIC_TRAINING_KEYS"]

_write_json = main_process_only(write_json_atomic)
_write_text = main_process_only(write_text_atomic)

# Settings that change how a run is displayed, fed or saved, never its numbers.
COSMETIC_TRAINING_KEYS = (
    "progress_bar", "tensorboard", "report_to", "num_workers", "log_every", "checkpoint_every", "keep_checkpoints",
    "timing_warmup_passes",
)

_OUTPUT_FIX = "pass another --output-dir (or output_dir in the config)"
_CAP = "max_grid_growth"  # the fingerprint's key that may rise but not fall
# experiment.json is the only record of the config the runs were trained with: never rewritten blindly
_EXPERIMENT_FIX = ("restore it from a copy; without it oelm cannot check that the runs here belong to this config "
                   "(delete it only if you are sure they do: the next `oelm run` writes it again)")


def _experiment(out: Path) -> dict[str, Any]:
    """``out/experiment.json`` ({} when absent).

    Raises:
        DamagedFileError: it does not parse, or its ``fingerprint`` / ``grid_growth`` / ``data`` is
            not an object (names the file, the field and the fix)."""
    path = MatrixFolder(out).experiment
    if not path.exists():
        return {}
    record = read_json_object(path, _EXPERIMENT_FIX)
    for key in ("fingerprint", "grid_growth", "data"):
        if not isinstance(record.get(key, {}), dict):
            raise DamagedFileError(f"{path} is damaged: field {key} = {record[key]!r:.60} is not an object; {_EXPERIMENT_FIX}")
    return record


def _selected_before(out: Path, log: Callable[[str], None]) -> dict[str, float]:
    """``sweep.json``'s ``selected_learning_rates`` ({} when absent). A damaged sweep.json is
    derived data: it is logged and rewritten from the runs' results."""
    path = MatrixFolder(out).sweep
    if not path.exists():
        return {}
    try:
        return read_sweep(path).get("selected_learning_rates") or {}
    except DamagedFileError as exc:
        log(f"{exc.args[0].split('; ')[0]}: written again from the runs' results")
        return {}


def _quiet(message: str) -> None:
    """The log of every process but rank 0."""


def config_fingerprint(config: ExperimentConfig) -> dict[str, Any]:
    """The parts of a config that make results comparable: task, model, training (display-only
    knobs excluded), init_from, the sweep seeds, ``max_grid_growth`` (when not 0), and per method
    its OELM settings, learning-rate candidates and training overrides. Not: the experiment's seeds
    nor a method's own ``seeds`` (they decide which runs exist, not what a run computes: more may
    be added, or a method's trimmed to the seeds it has), the output dir,
    the executor, names, descriptions and references. A key at its default is left out, so the
    fingerprints of matrices started before the key existed still match."""
    d = config.model_dump(mode="json")
    if d["task"].get("source") is None:  # a registered dataset: the fingerprint keeps its form from before task.source
        d["task"].pop("source", None)
    training = {k: v for k, v in d["training"].items() if k not in COSMETIC_TRAINING_KEYS}
    methods = {
        m.name: {
            "oelm": m.oelm_config().to_dict(),
            "learning_rates": config.learning_rate_candidates(m),
            "training": {k: v for k, v in sorted(m.training.items()) if k not in COSMETIC_TRAINING_KEYS},
            **({"lora": m.lora} if m.lora is not None else {}),  # absent otherwise: earlier fingerprints still match
        }
        for m in config.methods
    }
    return {
        "task": d["task"], "model": d["model"], "training": training, "init_from": config.init_from,
        "sweep_seeds": config.sweep_seed_list(), "methods": methods,
    } | ({"max_grid_growth": config.max_grid_growth} if config.max_grid_growth else {})


def _methods_with_runs(out: Path) -> set[str]:
    """Methods that have a run folder holding results under ``out/runs`` (a ``result.json`` or a
    resumable checkpoint: :meth:`~oelm.records.RunFolder.holds_results`); the method is read from
    the result, else from ``status.json``."""
    found = set()
    for d in MatrixFolder(out).run_folders():
        if not d.holds_results():
            continue
        for read in (lambda: d.read_result().method, lambda: read_status(d)["method"]):
            try:
                found.add(read())
                break
            except (OSError, ValueError, KeyError, TypeError, AttributeError):  # absent or damaged: no method to count
                continue
    found.discard(None)
    return found


def _grid_grew(previous: dict[str, Any], current: dict[str, Any]) -> bool:
    """True when a method's fingerprint ``current`` differs from ``previous`` only by a learning-rate
    grid that keeps every earlier rate and adds some, and the earlier grid was already a sweep
    (two or more rates: the runs of a single-rate method are named without a rate, so a later
    sweep could not reuse them)."""
    rest = {k: v for k, v in current.items() if k != "learning_rates"}
    if {k: v for k, v in previous.items() if k != "learning_rates"} != rest:
        return False
    old, new = set(previous.get("learning_rates") or []), set(current.get("learning_rates") or [])
    return len(old) > 1 and old < new


def _fingerprint_changes(out: Path, fingerprint: dict[str, Any]) -> tuple[dict[str, Any], dict[str, tuple[list, list]], list[str]]:
    """:func:`_check_fingerprint`'s comparison: the fingerprint to store, the methods whose grid
    grows, and what changed (empty when ``out`` may hold this config's runs)."""
    if not MatrixFolder(out).experiment.exists():
        return fingerprint, {}, []
    previous = _experiment(out).get("fingerprint") or {}
    if isinstance(previous.get("training"), dict):  # keys added to TrainingConfig since: their defaults held
        defaults = {k: v for k, v in TrainingConfig().model_dump(mode="json").items() if k not in COSMETIC_TRAINING_KEYS}
        previous = previous | {"training": {k: v for k, v in defaults.items() if k not in previous["training"]}
                               | previous["training"]}
    changed = [k for k in fingerprint if k not in ("methods", _CAP) and k in previous and previous[k] != fingerprint[k]]
    if fingerprint.get(_CAP, 0) < previous.get(_CAP, 0):  # raising it is fine: more rates, on validation only
        changed.append(f"{_CAP} (lowered from {previous[_CAP]} to {fingerprint.get(_CAP, 0)}: the rates it added "
                       "would leave their grids; it may only rise)")
    prev_methods = previous.get("methods", {})
    with_runs = _methods_with_runs(out) if prev_methods else set()
    grown: dict[str, tuple[list, list]] = {}
    for name, settings in fingerprint["methods"].items():
        if name in prev_methods and prev_methods[name] != settings and name in with_runs:
            if _grid_grew(prev_methods[name], settings):
                grown[name] = (prev_methods[name]["learning_rates"], settings["learning_rates"])
                continue
            what = [k for k in {**prev_methods[name], **settings} if prev_methods[name].get(k) != settings.get(k)]
            hint = ""
            if what == ["learning_rates"]:
                hint = (" (a learning-rate grid may only grow: keep every earlier rate)"
                        if len(prev_methods[name]["learning_rates"]) > 1 else
                        " (its runs were trained without a sweep; a sweep needs another --output-dir)")
            changed.append(f"methods.{name} ({', '.join(what)}){hint}")
    return fingerprint | {"methods": prev_methods | fingerprint["methods"]}, grown, sorted(changed)


def _check_fingerprint(out: Path, fingerprint: dict[str, Any]) -> tuple[dict[str, Any], dict[str, tuple[list, list]]]:
    """Refuse to mix results of incompatible configs in ``out``; returns the fingerprint to store
    and the methods whose learning-rate grid grows (name -> (earlier grid, new grid)).

    A grid may grow: a method that already has runs may add learning rates to a sweep as long as
    it keeps every earlier rate and nothing else of it changes (its runs stay valid; the sweep
    runs the new rates and selects again). Use it when a selection sits on the edge of its grid.

    Raises:
        ConfigError: task/model/training/init_from/sweep seeds changed, or the settings of a
            method that already has results changed otherwise (naming what changed; a folder
            without any result is named as such, with the command that takes it over: :func:`_claim`).
    """
    stored, grown, changed = _fingerprint_changes(out, fingerprint)
    if changed and not MatrixFolder(out).runs_with_results():
        raise ConfigError(f"output directory {out} was started by a different config (changed: {', '.join(changed)}) "
                          f"and holds no result yet; run `oelm plan CONFIG --output-dir {out}` (or `oelm run`) with "
                          "this config first: it takes the folder over")
    if changed:
        raise _different_config(out, changed)
    return stored, grown


def _different_config(out: Path, changed: list[str]) -> ConfigError:
    return ConfigError(f"output directory {out} holds results of a different config (changed: {', '.join(changed)}); "
                       "use another --output-dir, or restore the original config to resume")


def _claim(out: Path, fingerprint: dict[str, Any],
           log: Callable[[str], None]) -> tuple[dict[str, Any], dict[str, tuple[list, list]], bool]:
    """:func:`_check_fingerprint`, except that a folder started by a different config whose runs
    hold no results (:meth:`~oelm.records.MatrixFolder.runs_with_results`: no ``result.json``, no
    resumable checkpoint; say the earlier config failed a check after the folder was written) is
    taken over: its run folders and the files derived from the earlier config (tokenizer.json,
    sweep.json, plan.json) are removed, and ``log`` says so in one line; the caller writes
    experiment.json afresh (the third value: taken over) and the rest again. Call it only while
    holding the output folder's exclusive lock.

    Raises:
        ConfigError: ``out`` holds results of a different config (:func:`_check_fingerprint`).
    """
    folder = MatrixFolder(out)
    stored, grown, changed = _fingerprint_changes(out, fingerprint)
    if not changed:
        return stored, grown, False
    if folder.runs_with_results():
        raise _different_config(out, changed)
    log(f"output directory {out} was started by a different config (changed: {', '.join(changed)}) but no run there "
        "has a result or a checkpoint: this config takes it over")
    if is_main_process():  # experiment.json stays until it is replaced: a crash before only repeats the takeover
        for run in folder.run_folders():
            shutil.rmtree(run.path, ignore_errors=True)
        for stale in (folder.tokenizer, folder.sweep, folder.plan):
            stale.unlink(missing_ok=True)
    return fingerprint, {}, True


def _tested_final_runs(out: Path, method: str) -> list[str]:
    """Run names of ``method``'s final runs under ``out`` that have evaluated the test split."""
    return [d.name for d, r in MatrixFolder(out).iter_results()
            if r.method == method and r.is_final and r.test is not None]


def open_output_dir(out: Path) -> None:
    """Create ``out`` and check that files can be written in it, before any data or training work.

    Raises:
        ConfigError: ``out`` is a file, lies under a file, cannot be created (its parent is
            read-only, ...) or is not writable; one line naming the path and the fix.
    """
    if out.exists() and not out.is_dir():
        raise ConfigError(f"output directory {out} is a file, not a directory; {_OUTPUT_FIX}, or move the file away")
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        # The deepest path that exists is the one in the way: a file, or a directory we may not write in.
        blocker = next((p for p in [out, *out.parents] if p.exists() or p.is_symlink()), out)
        if blocker != out and not blocker.is_dir():
            raise ConfigError(
                f"output directory {out} lies under {blocker}, which is a file, not a directory; {_OUTPUT_FIX}"
            ) from None
        raise ConfigError(
            f"cannot create output directory {out}: {exc.strerror or exc} in {blocker}; "
            f"make {blocker} writable or {_OUTPUT_FIX}"
        ) from None
    try:  # a read-only directory (or file system) is only found out by writing in it
        fd, probe = tempfile.mkstemp(prefix=".oelm-write-test-", dir=out)
        os.close(fd)
        os.unlink(probe)
    except OSError as exc:
        raise ConfigError(
            f"output directory {out} is not writable ({exc.strerror or exc}); make it writable or {_OUTPUT_FIX}"
        ) from None


def start_output(config: ExperimentConfig, out: Path, log: Callable[[str], None] | None = None) -> None:
    """Check run names and the fingerprint, then write experiment.json, config.yaml, plan.json.
    A folder started by a different config in which no run holds a result is taken over
    (:func:`_claim`); call it while holding the folder's exclusive lock.

    experiment.json keeps ``grid_growth``: per method every time its learning-rate grid grew
    (``from``, ``to``, ``at`` (UTC), and ``tested_final_runs``: its final runs that had already
    evaluated the test split then, so a reader sees whether the grid grew after the test was seen).

    Raises:
        ConfigError: two methods map to one run directory, or ``out`` holds another config's results.
    """
    safe = {}
    for m in config.methods:
        key = run_name(m.name, 0)
        if key in safe:
            raise ConfigError(f"methods {safe[key]!r} and {m.name!r} map to the same run directory name; rename one")
        safe[key] = m.name
    fingerprint, grown, taken_over = _claim(out, config_fingerprint(config), log or _quiet)
    previous = {} if taken_over else _experiment(out)
    growth = previous.get("grid_growth") or {}
    for name, (old, new) in grown.items():
        tested = _tested_final_runs(out, name)
        growth = growth | {name: [*growth.get(name, []), {"from": old, "to": new, "at": utc_now(), "tested_final_runs": tested}]}
        (log or _quiet)(f"[{name}] learning-rate grid grows from {format_rates(old)} to {format_rates(new)}; its runs are kept, the new rates "
            "are swept and the rate is selected again"
            + (f" (already tested at the earlier selection: {', '.join(tested)})" if tested else ""))
    folder = MatrixFolder(out)
    _write_json(folder.experiment, {"name": config.name, "fingerprint": fingerprint}
                | ({"grid_growth": growth} if growth else {}) | ({"data": previous["data"]} if "data" in previous else {}))
    _write_text(folder.config, yaml.safe_dump(config.model_dump(mode="json"), sort_keys=False))
    write_plan(out, config)


def bind_data(out: Path, data: PreparedData) -> None:
    """Bind the matrix in ``out`` to its data: compare the data this process prepared
    (``data.source``, :func:`oelm.data.identity.data_source`: the content hash of every split's
    files and the tokenizer's sha256) with ``experiment.json``'s ``data``, the data its runs were
    trained on, before any run trains. Recorded there when absent (a new matrix, or one started by
    an oelm that did not record it yet: accepted as it is). Nothing to do without experiment.json.

    Raises:
        ConfigError: the data differ: one line naming the split (or the tokenizer), both hashes,
            where each was read, and the fix.
        DamagedFileError: experiment.json is damaged.
    """
    experiment = MatrixFolder(out).experiment
    if data.source is None or not experiment.is_file():
        return
    record = _experiment(out)
    recorded = record.get("data")
    if recorded:
        change = source_change(recorded, data.source)
        if change:
            raise ConfigError(f"output directory {out} holds runs trained on other data: {change}. Restore the data they "
                              "were trained on (OELM_DATA_DIR, --data-dir or the files), or use another --output-dir")
        return
    _write_json(experiment, record | {"data": data.source})


@contextlib.contextmanager
def interruptible(what: str):
    """SIGTERM / SIGINT during the block raise :class:`~oelm.errors.RunInterruptedError` ("... while
    ``what``; ... rerun the same command to continue"), which ``oelm run`` reports in one line
    with exit status 130, as it does for a run interrupted while training (the default SIGTERM
    would end the process with 143 and no word). The earlier handlers are restored after. Only
    the main thread can install handlers; elsewhere the block runs unchanged."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def _raise(signum: int, frame: Any) -> None:
        name = signal.Signals(signum).name
        raise RunInterruptedError(f"{name} while {what}; no run had started, nothing is lost: "
                                  "rerun the same command to continue", signal_name=name)

    previous = {s: signal.signal(s, _raise) for s in (signal.SIGTERM, signal.SIGINT)}
    try:
        yield
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)


def prepare_matrix_data(config: ExperimentConfig, out: Path | None, log: Callable[[str], None],
                        save_tokenizer: bool = True) -> PreparedData:
    """:func:`_prepare` with SIGTERM / SIGINT reported as an interruption (:func:`interruptible`).

    Raises:
        RunInterruptedError: SIGTERM / SIGINT arrived while the data was prepared.
        OELMError subclasses: data, tokenizer or ``init_from`` problems (see :func:`_prepare`).
    """
    with interruptible("preparing the data"):
        return _prepare(config, out, log, save_tokenizer)


def _prepare(config: ExperimentConfig, out: Path | None, log: Callable[[str], None],
             save_tokenizer: bool = True) -> PreparedData:
    """The shared data (with the pretrained model's tokenizer); every ``init_from`` checkpoint
    is resolved here, and its tokenizer checked against this one, so a missing or mismatched
    one is an error before any run starts. oelm's GPT's tokenizer is saved as
    ``<out>/tokenizer.json`` (``save_tokenizer``: the driver only), so that a fine-tuning config
    can name it (``task.tokenizer``)."""
    tokenizer = None
    if config.model.pretrained:
        tokenizer = load_tokenizer(config.model.pretrained, trust_remote_code=config.model.trust_remote_code)
    log(f"preparing data: {config.task.dataset} ...")
    data = prepare_data(config, tokenizer)
    if out is not None:
        bind_data(out, data)
    log(f"data: {data.summary}")
    unchecked = []
    for m in config.methods:
        for seed in config.seeds_of(m):
            checkpoint = resolve_init_from(config, m.name, seed)
            if checkpoint is not None and data.tokenizer_record and not check_init_tokenizer(checkpoint, data.tokenizer_record):
                unchecked.append(checkpoint)
    if unchecked:
        log(f"init_from: {len(unchecked)} checkpoint(s) (e.g. {unchecked[0]}) record no tokenizer (a bare safetensors file, "
            "or written by an oelm before it recorded one), so oelm cannot check that task.tokenizer is the pretraining's")
    tokenizer = MatrixFolder(out).tokenizer if out is not None else None
    if save_tokenizer and tokenizer is not None and config.model.gpt and is_main_process() and not tokenizer.is_file():
        try:
            write_tokenizer(data.tokenizer, tokenizer)
        except OSError as exc:  # a full disk (tokenizers' own error mapped by oelm.io.disk_writes), no permission
            raise OELMError(f"cannot write {tokenizer} ({exc.strerror or exc}); free disk space (or fix "
                            "the folder's permissions) then rerun the same command; no run has started") from None
    return data


def write_plan(out: Path, config: ExperimentConfig, selection: Selection | None = None) -> None:
    """``plan.json``: every planned run at ``selection`` (None: nothing selected yet; grown grids'
    sweep runs included) for ``oelm monitor``, final runs of methods whose selection is not final
    yet listed as pending without a learning rate, on each method's seeds."""
    selection = selection or Selection()
    runs = [{"name": r.name, "method": r.method, "seed": r.seed, "learning_rate": r.learning_rate, "stage": r.stage}
            for r in plan_runs(config, selection.selected, selection.grids)]
    for m in config.methods:
        if len(config.learning_rate_candidates(m)) > 1 and m.name not in selection.selected:
            runs += [{"name": None, "method": m.name, "seed": s, "learning_rate": None, "stage": "final"}
                     for s in config.seeds_of(m)]
    _write_json(MatrixFolder(out).plan, {"name": config.name, "runs": runs})


def write_selection(out: Path, config: ExperimentConfig, selection: Selection, log: Callable[[str], None],
                    announced: set[str]) -> None:
    """Write ``sweep.json`` (swept methods whose sweep is complete) and the updated ``plan.json``,
    logging each method's selection once (``announced``: methods already logged; updated).

    ``sweep.json`` lists swept methods only (two or more candidates). ``selected_at_grid_edge``: per
    swept method ``"low"`` / ``"high"`` when the selected rate is the smallest / largest rate of its
    grid, grown rates included (a wider grid could move the result), null when it is interior or
    nothing was selected (every sweep run failed); see :func:`oelm.records.grid_edge`.
    ``grid_growth`` (only when a grid grew): per method ``experiment.json``'s record of each growth
    of the config's grid, then each automatic growth (:func:`oelm.matrix.plan.growth_entry`), one
    log line each (``announced`` holds ``"<method>#<k>"`` for the k-th growth logged)."""
    folder = MatrixFolder(out)
    before = _selected_before(out, log)
    _log_growth(config, selection, log, announced)
    for name in sorted(selection.complete - announced, key=[m.name for m in config.methods].index):
        choice = selection.selected.get(name)
        if choice is None:
            log(f"[{name}] every sweep run failed; no learning rate selected, no final runs")
        else:
            log(f"[{name}] selected learning rate {choice:g} (mean best validation over seeds {config.sweep_seed_list()})")
            if name in before and not math.isclose(before[name], choice, rel_tol=1e-9):
                log(f"[{name}] selection moved from {before[name]:g} to {choice:g} (its grid grew): final runs at "
                    f"{before[name]:g} are superseded (kept on disk, left out of the comparison)")
        if selection.edges.get(name):
            grown = len(selection.growth.get(name, []))
            capped = (f" (after {grown} automatic growth(s): max_grid_growth {config.max_grid_growth})" if grown else
                      " (not grown: its final runs existed before max_grid_growth allowed it)" if config.max_grid_growth else "")
            log(f"[{name}] {grid_edge_note(selection.grids[name], selection.edges[name])}{capped}")
        announced.add(name)
    growth = dict(_experiment(out).get("grid_growth") or {})  # the config's grid grown by hand first
    for name, steps in selection.growth.items():
        growth[name] = [*growth.get(name, []), *steps]
    if selection.summary or selection.growth:
        _write_json(folder.sweep, sweep_file(config.sweep_seed_list(), selection.selected, selection.edges,
                                             selection.summary, growth))
    write_plan(out, config, selection)


def _log_growth(config: ExperimentConfig, selection: Selection, log: Callable[[str], None], announced: set[str]) -> None:
    """One line per automatic growth of a grid not logged yet (``announced``: updated)."""
    for name, steps in selection.growth.items():
        for k, g in enumerate(steps, 1):
            if f"{name}#{k}" in announced:
                continue
            means = ", ".join(f"{v['learning_rate']:g}: "
                              + ("failed" if v["best_validation"] is None else f"{v['best_validation']:.6g}")
                              for v in g["validation"])
            word = "highest" if g["edge"] == "high" else "lowest"
            log(f"[{name}] selected learning rate {g['selected']:g} is the {word} of its grid {format_rates(g['from'])} "
                f"(mean best validation over seeds {config.sweep_seed_list()}: {means}): the grid grows to "
                f"{format_rates(g['to'])} on validation, before any final run ({k} of max_grid_growth {config.max_grid_growth})")
            announced.add(f"{name}#{k}")
