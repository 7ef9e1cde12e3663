"""One training loop for every method, model and device (Hugging Face Accelerate underneath).

The loop is deliberately plain: AdamW over ``requires_grad`` parameters only (frozen tensors
never enter the optimizer, so weight decay cannot move them; fused on CUDA and CPU), linear
warmup then linear, cosine, constant or warmup-stable-decay (``transformers``' schedulers),
gradient accumulation, gradient clipping, optional bf16/fp16 autocast and ``torch.compile``
(``training.compile``: true/"default", "reduce-overhead", "max-autotune"), validation every N
steps and at the end, optional early stopping on the validation metric, the best weights chosen
on validation only, a test split evaluated once with those best weights. Everything it measures
goes to ``metrics.jsonl`` (one JSON object per line) and TensorBoard. One process or many
(``accelerate launch`` / ``torchrun``: DDP, or FSDP through Accelerate's plugin); only rank 0
writes files.

Modules, one job each: :mod:`~oelm.training.loop` (:func:`train`, top-down),
:mod:`~oelm.training.engine` (the fixed parts: :func:`build_engine`, optimizer, schedule,
step counts), :mod:`~oelm.training.step` (:func:`optimizer_step`, the warm-up),
:mod:`~oelm.training.evaluation` (:func:`evaluate`, validations, early stopping),
:mod:`~oelm.training.checkpoint` (checkpoints, resume, best weights), :mod:`~oelm.training.rng`,
:mod:`~oelm.training.faults` (NaN, OOM, full disk, stop signals), :mod:`~oelm.training.metrics_log`,
:mod:`~oelm.training.run_timing` (epoch clock, ``TrainResult.timing``, MFU),
:mod:`~oelm.training.precision` (the one reader of ``mixed_precision``) and
:mod:`~oelm.training.state`. ``oelm.train`` re-exports the public names.

Loaders:
    ``train_loader`` / ``eval_loader`` / ``test_loader`` yield dict batches (``input_ids``,
    ``attention_mask``, ``labels``, ...) of the *per-process micro-batch* size; the model's
    ``forward(**batch)`` returns ``.loss`` and ``.logits``. The test split is evaluated once,
    after training, with the best-on-validation weights; it never influences selection. The
    training order is a function of (the seed of the train loader's ``torch.Generator``, epoch).
    On several processes Accelerate shards every loader, left on the host (tokens are counted
    there); on CUDA the loaders pin memory and batches are copied with ``non_blocking=True``.
    Workers and prefetch are the loader's (``training.num_workers``).

Steps and cadence:
    One optimizer step consumes ``gradient_accumulation_steps`` micro-batches per process (global
    batch ``batch_size x gradient_accumulation_steps x processes``; an epoch is
    ``len(loader) // gradient_accumulation_steps`` steps). ``warmup_steps`` longer than the
    planned steps is refused before the first step. Validation runs every ``eval_every`` steps
    and once at the end. A scheduled validation fewer than ``eval_every / 2`` steps before the
    last step is left to the end-of-training one (two validations a step apart evaluated nearly
    the same weights: e.g. 37 steps, ``eval_every`` 18, validations at 36 and 37); the
    end-of-training one is skipped when the last step was validated already (an early stop). Validation sums are reduced over processes (each example once,
    ``gather_for_metrics``), so every rank selects the same best step. Before the clock starts,
    ``timing_warmup_passes`` forward+backward passes on a fixed batch are run and undone; with
    ``compile`` the compilation happens there (``compile_seconds``, outside every step time).

Host syncs:
    None per step in fp32/bf16: the loss sum and the gradient norm's finiteness stay on the
    device and are read at log steps (``log_every``) and before checkpoints; NaN/Inf therefore
    stops the run within ``log_every`` steps. fp16's ``GradScaler`` hands its inf flag to the
    fused AdamW (no sync); only a non-fused optimizer makes it read the flag every step.
    :func:`evaluate` sums on the device and reads once per evaluation. Left: the GPU step
    timer's events are read at log steps (:mod:`oelm.runtime.timing`); several processes all-reduce the
    stop flag at log steps and the early-stopping flag after a validation.

Checkpoints and resume:
    Every ``checkpoint_every`` optimizer steps (default: after every validation) and on
    SIGTERM/SIGINT, ``checkpoints/step-<N>/`` is written atomically (temp dir, fsync,
    ``manifest.json`` with the sha256 of every file written last, rename): weights, best-so-far
    weights, a final run's best-so-far validation predictions (``best_predictions.npz``),
    optimizer, scheduler, gradient-scaler and RNG states, the running loss and step
    times (``state.pt``, ``weights_only``), and ``trainer_state.json`` (:class:`TrainState`,
    the data seeds, Python/NumPy RNG states, the ``metrics.jsonl`` byte offset). On several
    processes rank 0 writes it with every rank's RNG states; each rank restores its own. The
    batch size, accumulation, number of processes, learning rate and planned steps are the
    resume identity: a checkpoint of other settings is refused, and so is one of another
    ``format`` (written by an older or newer oelm: one line naming both formats). The newest ``keep_checkpoints``
    are kept; all are removed when the run finishes. With ``resume`` (default) a run continues
    from the newest intact checkpoint (failing ones are skipped with a warning), cutting
    ``metrics.jsonl`` back to that point. On CPU in fp32 in one process the resumed run's metrics
    and weights are bit-identical to an uninterrupted run's (tested); on GPU or in bf16/fp16 they
    are equal up to the kernels' non-determinism.

Early stopping:
    With ``early_stopping_patience = P`` the run stops right after the validation that makes P
    in a row without an improvement (better than the last counted value by more than
    ``early_stopping_min_delta``) and ends as at its last planned step: the last steps' loss is
    logged, an ``early_stop`` record written, the best weights saved and tested once. The
    schedule is not re-planned. The count is part of :class:`TrainState` (survives a resume).

Faults:
    NaN/Inf loss or gradient norm (:class:`TrainingDivergedError`, kind ``nan``), out of memory
    (kind ``oom``, naming the batch size to lower) and a full disk (kind ``disk_full``, while
    writing a checkpoint, the metrics or the best weights: the message names the file) end the
    run as a :class:`~oelm.errors.RunFaultError`; a checkpoint is never written from non-finite
    weights. A SIGTERM/SIGINT finishes the current step, saves a checkpoint and raises
    :class:`~oelm.errors.RunInterruptedError`; one during the final evaluation lets the run
    finish (``TrainResult.stop_signal``).

Timing (``TrainResult.timing``):
    ``total_seconds`` (after the warm-up, summed over resumes), ``setup_seconds`` (this process,
    before the run's clock: engine, warm-up passes, trackers), ``resumed_seconds`` (the run's clock
    in earlier processes of a resumed run), ``train_seconds``, ``validation_seconds`` (a final run
    keeps per-example outcomes meanwhile), ``checkpoint_seconds``, ``best_weights_seconds``,
    ``test_seconds``, ``predictions_seconds`` (the best validation's predictions kept, and
    ``predictions.npz`` written after the clock stopped), ``data_seconds``,
    ``data_stall_seconds`` (the device idle, waiting for a batch), ``num_workers`` (the training
    loader's worker processes), ``per_epoch_seconds``, ``per_step_ms`` {median, mean, p10, p90, n}, ``step_ms``,
    ``process_start_steps``, ``tokens_per_second``, ``samples_per_second``, ``warmup_seconds``,
    ``compile`` / ``compile_mode`` / ``compile_seconds``, ``num_processes``,
    ``gradient_accumulation_steps``, ``mfu`` (:func:`oelm.runtime.environment.mfu_record`) and
    ``gpu_telemetry``; see :mod:`oelm.runtime.timing` for how steps are timed.
"""

from oelm.training.engine import (
    Engine, build_engine, build_optimizer, check_warmup, make_scheduler, optimizer_steps_per_epoch, planned_total_steps,
    use_fused_adamw,
)
from oelm.training.evaluation import evaluate
from oelm.training.faults import TrainingDivergedError
from oelm.training.loop import train
from oelm.training.precision import Precision, autocast_context
from oelm.training.state import TrainResult, TrainState, higher_is_better
from oelm.training.step import optimizer_step

__all__ = [
    "Engine", "Precision", "TrainResult", "TrainState", "TrainingDivergedError", "autocast_context", "build_engine",
    "build_optimizer", "check_warmup", "evaluate", "higher_is_better", "make_scheduler", "optimizer_step", "optimizer_steps_per_epoch",
    "planned_total_steps", "train", "use_fused_adamw",
]
