"""``executor.parallel: auto``: how many runs side by side, and how many threads each, measured on
the machine the matrix finds, with the matrix's own model and data.

Whether lanes pay depends on the model and the processor: a small, dispatch-bound model (gpt-tiny)
steps about as fast on one thread as on two, so two one-thread runs side by side do twice the work;
a MiniLM step on the 2-core development machine runs 1.2-1.6x faster on two threads, and two runs
side by side slow each other down (shared caches and memory bandwidth), so one run at a time with
every thread wins there (docs/scaling.md, "The demo in lanes"). So the choice is measured, not assumed:

1. one probe with ``cores`` threads, then ``cores`` probes at once, one thread each, each in a
   Ray task on this machine: build the first planned run's model, time a few optimizer steps on
   its training batches and a few validation batches (the first step of each is not timed);
2. per arrangement, the predicted matrix time: ``ceil(runs / lanes) x (steps x step time +
   validation batches x batch time)`` of a run;
3. the faster arrangement wins; a tie (within 5%) goes to one lane, which keeps step times
   timing-grade.
"""

from __future__ import annotations

import math
import statistics
import time
from dataclasses import dataclass
from typing import Any

__all__ = ["LaneChoice", "probe_run_seconds", "choose_lanes"]

#: Optimizer steps and validation batches timed per probe (after one untimed of each). The median of
#: 12 steps: a fresh process's first few steps run slower (gpt-tiny on 2 threads: 0.49-0.62 s a
#: step over 4 steps, 0.36 s over 16, 0.345 s in the real run), and that bias must not pick the lanes.
PROBE_STEPS = 12
PROBE_EVAL_BATCHES = 4


@dataclass(frozen=True)
class LaneChoice:
    """The arrangement ``parallel: auto`` picked: ``lanes`` runs at once, ``threads`` each, and
    the predicted matrix seconds of every arrangement measured (``{"1x2": s, "2x1": s}``: lanes x threads)."""

    lanes: int
    threads: int
    predicted_seconds: dict[str, float]

    def describe(self) -> str:
        options = ", ".join(f"{k} lanes x threads: {v:.0f} s" for k, v in self.predicted_seconds.items())
        return f"parallel auto: {self.lanes} lane(s) x {self.threads} thread(s) (measured; predicted {options})"


def probe_run_seconds(config: dict[str, Any], task: dict[str, Any], threads: int) -> dict[str, float]:
    """Seconds of one optimizer step and of one validation batch of ``task``'s run with ``threads``
    torch threads, in this process: the run's model, optimizer (AdamW over trainable parameters),
    training and validation batches. Also returns the run's planned steps and validation batches.

    Returns:
        ``{"step": s, "eval_batch": s, "steps": n, "eval_batches": n}``.
    """
    import torch

    from oelm.config import config_from_dict
    from oelm.data.prepare import make_loaders
    from oelm.matrix.assemble import build_run_model
    from oelm.matrix.plan import RunTask
    from oelm.matrix.run_one import _total_steps, prepared_data

    torch.set_num_threads(threads)
    cfg = config_from_dict(config, source="(matrix config)")
    run = RunTask.from_dict(task).run
    entry = next(m for m in cfg.methods if m.name == run.method)
    data = prepared_data(cfg, log=lambda _: None)
    model, _, _, _ = build_run_model(cfg, entry, run.seed, data)
    training = cfg.training_for(entry)
    train_loader, val_loader, _ = make_loaders(data, training, run.seed)
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=run.learning_rate)
    model.train()
    steps = []
    for i, batch in zip(range(PROBE_STEPS + 1), train_loader):
        t0 = time.perf_counter()
        model(**batch).loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        steps.append(time.perf_counter() - t0)
    model.eval()
    evals = []
    with torch.no_grad():
        for i, batch in zip(range(PROBE_EVAL_BATCHES + 1), val_loader):
            t0 = time.perf_counter()
            model(**batch)
            evals.append(time.perf_counter() - t0)
    total = _total_steps(training, train_loader)
    per_eval = training.eval_every or max(1, math.ceil(total / (training.evals_per_epoch * training.epochs)))
    evaluations = math.ceil(total / per_eval) + 1 + int(training.eval_at_start)
    return {"step": statistics.median(steps[1:] or steps), "eval_batch": statistics.median(evals[1:] or evals),
            "steps": total, "eval_batches": evaluations * len(val_loader)}


def choose_lanes(measured: dict[int, list[dict[str, float]]], runs: int, cores: int) -> LaneChoice:
    """The arrangement with the shortest predicted matrix time (module docstring).

    Args:
        measured: lanes -> the probes that ran side by side in that arrangement (``cores // lanes``
            threads each): :func:`probe_run_seconds` results.
        runs: runs the matrix trains.
    """
    predicted = {}
    for lanes, probes in sorted(measured.items()):
        run_seconds = statistics.median(p["steps"] * p["step"] + p["eval_batches"] * p["eval_batch"] for p in probes)
        predicted[f"{lanes}x{max(1, cores // lanes)}"] = math.ceil(runs / lanes) * run_seconds
    one = predicted.get(f"1x{cores}")
    best = min(predicted, key=predicted.get)
    if one is not None and predicted[best] >= 0.95 * one:
        best = f"1x{cores}"
    lanes, threads = map(int, best.split("x"))
    return LaneChoice(lanes, threads, predicted)
