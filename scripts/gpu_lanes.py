"""A matrix's runs side by side on one GPU, as many at once as a short measurement finds fastest.

    python scripts/gpu_lanes.py CONFIG --output-dir OUT [--lanes auto|N] [--deadline UNIX_TIME] [key=value ...]

Part ``scale`` of ``scripts/gpu_check.sh`` runs the original's IMDB matrix (scripts/gpu_scale_imdb.yaml,
9 runs) this way on a GPU machine without Ray. It uses oelm's batch-system primitives
(docs/scaling.md, "Batch systems"): ``oelm plan`` lists the ready runs, each lane trains one with
``oelm run CONFIG --only NAME`` (a process of its own, as a batch job would), and ``oelm run
--collect`` writes the comparison from what finished.

**How many lanes** (``--lanes auto``): a small GPU model leaves the GPU idle between its kernel
launches, so runs side by side can finish the matrix sooner; whether they do is measured, not
assumed. ``K`` worker processes (``--max-lanes``, default 4) each build the config's model (oelm's
builder, the config's batch and ``max_length``, random token ids, AdamW, bf16 autocast where the
config trains in bf16) and take a few warm-up steps; then, in timed phases of ``--phase-s`` seconds,
1, 2, ..., K of them train at once (the others wait), and 1 again last (drift check). Each
phase gives the aggregate optimizer steps per second ``X(k)``. With ``R`` ready runs, a run under
``k`` lanes takes ``k / X(k)`` per step and the pool needs ``ceil(R / k)`` rounds, so the predicted
matrix time is ``ceil(R / k) * k / X(k)`` (per run work cancels); the smallest wins, ties to fewer
lanes (runs alone are timing-grade). The table and the choice are printed and kept in
``OUT/lanes.json``. The measurement leaves out what differs between runs and the stand-in step
(data loading, validation, checkpoint writes, the engine's bookkeeping): it ranks arrangements of
GPU work, and the runs' own step times say what each run met.

**The deadline** (``--deadline``, default ``$GPU_CHECK_DEADLINE``): no run starts within
``--reserve-s`` seconds (default 60) of it; at that point running runs get SIGTERM (oelm saves a
checkpoint and stops: the same command later continues them), and ``--collect`` still runs.
Exit status: 0 when every run finished and the comparison was written, 124 when the deadline
stopped runs, 1 otherwise.
"""

from __future__ import annotations

import argparse
import json
import math
import multiprocessing as mp
import os
import signal
import subprocess
import sys
import time
from pathlib import Path


def oelm(*args: str) -> list[str]:
    return [sys.executable, "-m", "oelm", *args]


def ready_runs(config: str, out: Path, overrides: list[str]) -> list[str]:
    """Names of the runs ``oelm plan`` says are ready now."""
    res = subprocess.run(oelm("plan", config, "--output-dir", str(out), *overrides), capture_output=True, text=True)
    if res.returncode != 0:
        raise SystemExit(f"gpu-lanes: oelm plan failed: {(res.stderr.strip().splitlines() or ['?'])[-1]}")
    return [json.loads(line)["name"] for line in res.stdout.splitlines() if line.startswith("{")]


def start_preparation(config: str, overrides: list[str]) -> subprocess.Popen:
    """Tokenize the config's data once into oelm's caches (a process of its own, every core the
    tokenizer wants), so the runs started later read the cache instead of each tokenizing it."""
    code = ("import sys; from oelm.config import load_config; from oelm.matrix.data import prepare_data; "
            "prepare_data(load_config(sys.argv[1], sys.argv[2:]))")
    return subprocess.Popen([sys.executable, "-c", code, config, *overrides], env={**os.environ, "TOKENIZERS_PARALLELISM": "true"})


# -- the measurement ----------------------------------------------------------------------------


def _probe_worker(index: int, config: str, overrides: list[str], device: str, phases: list[int], phase_s: float,
                  barrier, rates, errors) -> None:
    """One lane of the measurement: the config's model, trained on random ids in the phases where it is active."""
    try:
        import torch

        from oelm.config import load_config
        from oelm.matrix.model import build_model

        cfg = load_config(config, overrides)
        torch.manual_seed(index)
        model, _ = build_model(cfg, None, task_type="classification", num_labels=2)
        dev = torch.device(device)
        model.to(dev).train()
        if dev.type == "cpu":
            torch.set_num_threads(1)
        params = [p for p in model.parameters() if p.requires_grad]
        opt = torch.optim.AdamW(params, lr=1e-4, fused=dev.type == "cuda")
        batch, length = cfg.training.batch_size, cfg.task.max_length
        vocab = model.config.vocab_size
        ids = torch.randint(0, vocab, (batch, length), device=dev)
        mask = torch.ones_like(ids)
        labels = torch.randint(0, 2, (batch,), device=dev)
        bf16 = cfg.training.mixed_precision == "bf16"

        def step() -> None:
            with torch.autocast(dev.type, dtype=torch.bfloat16, enabled=bf16):
                loss = model(input_ids=ids, attention_mask=mask, labels=labels).loss
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
            if dev.type == "cuda":
                torch.cuda.synchronize(dev)

        for _ in range(3):  # warm-up: kernels chosen, allocator and optimizer state in place
            step()
    except Exception as exc:  # reported by the driver in one line; the barrier lets the others go on
        errors.put(f"lane {index}: {type(exc).__name__}: {exc}")
        barrier.abort()
        return
    for p, active in enumerate(phases):
        barrier.wait()
        begin = time.monotonic()
        count = 0
        if index < active:
            while time.monotonic() - begin < phase_s:
                step()
                count += 1
            rates[p * MAX_LANES + index] = count / (time.monotonic() - begin)  # the last step may run past phase_s
        else:
            time.sleep(phase_s)
    barrier.wait()


MAX_LANES = 8  # the shared table's width


def measure_lanes(config: str, overrides: list[str], device: str, max_lanes: int, phase_s: float) -> list[dict]:
    """``[{"lanes": k, "steps_per_s": X(k)}, ...]`` for k = 1..max_lanes, then 1 again (drift).

    Raises:
        RuntimeError: a lane failed (its error, one line), or did not reach the first phase within
            3 minutes or a later one within 30 s past its end.
    """
    phases = [*range(1, max_lanes + 1), 1]
    ctx = mp.get_context("spawn")  # each lane its own process and CUDA context, as the runs will have
    barrier = ctx.Barrier(max_lanes + 1)
    rates = ctx.Array("d", len(phases) * MAX_LANES)
    errors = ctx.Queue()
    workers = [ctx.Process(target=_probe_worker, args=(i, config, overrides, device, phases, phase_s, barrier, rates, errors),
                           daemon=True) for i in range(max_lanes)]
    for w in workers:
        w.start()
    try:
        for i in range(len(phases) + 1):  # the first wait also covers the lanes' start and warm-up
            barrier.wait(timeout=180 if i == 0 else 30 + 3 * phase_s)
    except Exception:  # BrokenBarrierError: a lane failed (its message is queued) or timed out
        for w in workers:
            w.join(timeout=5)
            if w.is_alive():
                w.kill()
        message = errors.get(timeout=5) if not errors.empty() else "a lane did not reach the next phase in time"
        raise RuntimeError(message) from None
    for w in workers:
        w.join(timeout=60)
    return [{"lanes": k, "steps_per_s": sum(rates[p * MAX_LANES + i] for i in range(k))} for p, k in enumerate(phases)]


def choose_lanes(table: list[dict], runs: int) -> tuple[int, list[dict]]:
    """The lane count with the shortest predicted matrix time ``ceil(runs / k) * k / X(k)`` (ties:
    fewer lanes), and the predictions. ``X(k)`` is the measured aggregate steps/s with ``k`` lanes;
    where k was measured twice (1: first and last), the lower figure counts."""
    rate: dict[int, float] = {}
    for row in table:
        rate[row["lanes"]] = min(rate.get(row["lanes"], math.inf), row["steps_per_s"])
    predictions = []
    for k in sorted(rate):
        if k > max(1, runs) or rate[k] <= 0:
            continue
        predictions.append({"lanes": k, "steps_per_s": rate[k], "relative_time": math.ceil(runs / k) * k / rate[k]})
    if not predictions:
        return 1, predictions
    best = min(predictions, key=lambda p: (round(p["relative_time"], 9), p["lanes"]))
    return best["lanes"], predictions


# -- the pool -----------------------------------------------------------------------------------


def run_pool(config: str, out: Path, overrides: list[str], lanes: int, stop_at: float, logs: Path) -> list[dict]:
    """Train the ready runs, ``lanes`` at a time, each ``oelm run --only NAME`` in its own process
    (log: ``logs/NAME.log``); new runs that become ready are taken up. At ``stop_at`` (Unix time)
    no run starts and running ones get SIGTERM (30 s to save a checkpoint, then SIGKILL)."""
    logs.mkdir(parents=True, exist_ok=True)
    running: dict[str, tuple[subprocess.Popen, float]] = {}
    done: list[dict] = []
    tried: set[str] = set()
    queue = ready_runs(config, out, overrides)
    replan = False  # a run finished: others may be ready (asked of `oelm plan` once no lane trains)
    while True:
        queue = [n for n in queue if n not in tried]
        # `oelm plan` takes the output folder's exclusive lock, which the `--only` runs hold shared
        # while they train: ask it only when no lane trains (else it fails "in use by another oelm run")
        if replan and not running and not queue and time.time() < stop_at:
            queue = [n for n in ready_runs(config, out, overrides) if n not in tried]
            replan = False
        while queue and len(running) < lanes and time.time() < stop_at:
            name = queue.pop(0)
            tried.add(name)
            with (logs / f"{name}.log").open("w") as log:
                proc = subprocess.Popen(oelm("run", config, "--output-dir", str(out), "--only", name, *overrides),
                                        stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
            running[name] = (proc, time.time())
            print(f"gpu-lanes: {name} started ({len(running)} running)", flush=True)
        if not running:
            break
        time.sleep(0.5)
        if time.time() >= stop_at:
            for name, (proc, _) in running.items():
                if proc.poll() is None:
                    print(f"gpu-lanes: {name} stopped at the deadline (SIGTERM: it saves a checkpoint)", flush=True)
                    proc.send_signal(signal.SIGTERM)
            limit = time.time() + 30
            for name, (proc, _) in running.items():
                try:
                    proc.wait(timeout=max(0.1, limit - time.time()))
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()
        for name, (proc, began) in list(running.items()):
            if proc.poll() is not None:
                stopped = time.time() >= stop_at
                done.append({"name": name, "exit_status": proc.returncode, "seconds": round(time.time() - began, 1),
                             "stopped_at_deadline": stopped and proc.returncode != 0})
                print(f"gpu-lanes: {name} exited {proc.returncode} after {time.time() - began:.0f} s", flush=True)
                del running[name]
                replan = replan or not stopped
    return done


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("config")
    p.add_argument("overrides", nargs="*", help="key=value overrides, as for `oelm run` (passed to every run)")
    p.add_argument("--output-dir", type=Path, required=True)
    p.add_argument("--lanes", default="auto", help="runs at once: a number, or auto (measured; default)")
    p.add_argument("--max-lanes", type=int, default=4, help="auto: the most lanes measured (default 4)")
    p.add_argument("--phase-s", type=float, default=3.0, help="auto: seconds per measured phase (default 3)")
    p.add_argument("--device", default="auto", help="auto: the measurement on cuda when torch sees a GPU, else cpu")
    p.add_argument("--deadline", type=float, default=float(os.environ.get("GPU_CHECK_DEADLINE") or 0),
                   help="Unix time by which everything, --collect included, must be done (default $GPU_CHECK_DEADLINE; 0: none)")
    p.add_argument("--reserve-s", type=float, default=60.0, help="seconds kept for stopping runs and --collect (default 60)")
    args = p.parse_intermixed_args(argv)  # overrides and options in any order
    if args.lanes != "auto" and not (args.lanes.isdigit() and 1 <= int(args.lanes) <= MAX_LANES):
        p.error(f"--lanes must be auto or 1..{MAX_LANES}, got {args.lanes!r}")
    if not 1 <= args.max_lanes <= MAX_LANES:
        p.error(f"--max-lanes must be 1..{MAX_LANES}, got {args.max_lanes}")
    out = args.output_dir.resolve()
    stop_at = args.deadline - args.reserve_s if args.deadline > 0 else math.inf
    record: dict = {"config": args.config, "overrides": args.overrides}
    runs = ready_runs(args.config, out, args.overrides)
    print(f"gpu-lanes: {len(runs)} runs ready: {' '.join(runs)}", flush=True)
    began = time.time()
    preparation = start_preparation(args.config, args.overrides) if runs else None
    if args.lanes == "auto" and len(runs) > 1:
        import torch

        device = args.device if args.device != "auto" else ("cuda" if torch.cuda.is_available() else "cpu")
        try:
            table = measure_lanes(args.config, args.overrides, device, min(args.max_lanes, len(runs)), args.phase_s)
        except RuntimeError as exc:
            print(f"gpu-lanes: the lane measurement failed ({exc}); 1 lane", flush=True)
            table = []
        lanes, predictions = choose_lanes(table, len(runs))
        record["measurement"] = {"device": device, "phase_s": args.phase_s, "seconds": round(time.time() - began, 1),
                                 "phases": table, "predictions": predictions}
        for row in predictions:
            print(f"gpu-lanes: {row['lanes']} lane(s): {row['steps_per_s']:.2f} steps/s together; predicted matrix time "
                  f"{row['relative_time']:.1f} (relative)", flush=True)
        print(f"gpu-lanes: {lanes} lane(s) chosen (measured in {time.time() - began:.0f} s; "
              f"drift: 1 lane {table[0]['steps_per_s']:.2f} first, {table[-1]['steps_per_s']:.2f} last steps/s)"
              if table else f"gpu-lanes: {lanes} lane", flush=True)
    else:
        lanes = 1 if args.lanes == "auto" else int(args.lanes)
    record["lanes"] = lanes
    if preparation is not None:
        prepared = preparation.wait()
        print(f"gpu-lanes: data prepared (exit {prepared}) {time.time() - began:.0f} s after the start", flush=True)
    record["runs"] = run_pool(args.config, out, args.overrides, lanes, stop_at, out / "lane-logs")
    res = subprocess.run(oelm("run", args.config, "--output-dir", str(out), "--collect", *args.overrides))
    record["collect_exit_status"] = res.returncode
    (out / "lanes.json").write_text(json.dumps(record, indent=1))
    if any(r["stopped_at_deadline"] for r in record["runs"]) or ready_runs(args.config, out, args.overrides):
        print("gpu-lanes: the deadline stopped the matrix; the same command continues it", flush=True)
        return 124
    return 0 if res.returncode == 0 and all(r["exit_status"] == 0 for r in record["runs"]) else 1


if __name__ == "__main__":
    sys.exit(main())
