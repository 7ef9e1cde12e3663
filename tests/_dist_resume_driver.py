"""One tiny SST-2 classification run (oelm GPT, dropout 0.1) on every process of a
``torch.distributed.run`` launch (gloo on CPU); used by ``tests/test_distributed.py``.

    python -m torch.distributed.run --nproc_per_node=2 tests/_dist_resume_driver.py RUN_DIR [--sigterm-at N]

Classification batches are padded to their longest example, so the ranks' batches have
different shapes and their dropout draws a different number of random values: the ranks' RNG
states part after the first step. ``--sigterm-at N``: every rank sends itself SIGTERM during
training step N (the run stops after the next step the ranks agree on, saves a checkpoint and
this script exits 3). Each rank prints the steps its run (re)started at (``process_start_steps``).
Exit codes: 0 finished, 3 interrupted.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import _train_driver  # noqa: E402
from _reliability import sigterm_at  # noqa: E402

BASE = {
    "name": "distributed-resume-test",
    "task": {"dataset": "sst2", "train_samples": 48, "validation_samples": 8, "max_length": 32, "tokenizer": "bpe-384"},
    "model": {"gpt": "gpt-tiny", "gpt_overrides": {"hidden_size": 32, "num_layers": 2, "num_heads": 2,
                                                   "intermediate_size": 64, "dropout": 0.1}},
    "methods": [{"name": "baseline"}],
    "seeds": [0],
    # 48 examples / (batch 4 x 2 ranks): 6 steps an epoch, 10 steps = 2 epochs; a train line every step.
    "training": {"max_steps": 10, "batch_size": 4, "eval_batch_size": 8, "eval_every": 5, "log_every": 1,
                 "checkpoint_every": 100, "keep_checkpoints": 2, "learning_rate": 2e-3, "timing_warmup_steps": 1,
                 "timing_warmup_passes": 0, "progress_bar": False, "tensorboard": False},
}


def main(argv: list[str]) -> int:
    from oelm.errors import RunInterruptedError
    from oelm.training import train

    run_dir, rest = Path(argv[0]), argv[1:]
    config, data, model, (train_loader, val_loader, _) = _train_driver.build([], base=BASE)
    if rest[:1] == ["--sigterm-at"]:
        model.register_forward_hook(sigterm_at(int(rest[1])), with_kwargs=True)
    try:
        result = train(model, train_loader, val_loader, metric=data.metric, config=config.training,
                       learning_rate=config.training.learning_rate, run_dir=run_dir)
    except RunInterruptedError as exc:
        print(f"rank {os.environ.get('RANK')}: interrupted after step {exc.step}", flush=True)
        return 3
    print(f"rank {os.environ.get('RANK')}: started at steps {result.timing['process_start_steps']}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
