"""The run's progress bar: before the first log step there is no train loss yet (it is read from
the device at log steps only), so a validation's postfix shows the validation value and no
``loss=nan``; from the first log step on it shows the logged loss."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

from _tiny_matrix import TINY_GPT

SRC = Path(__file__).resolve().parents[1] / "src"


def test_progress_bar_never_shows_a_nan_loss(tmp_path, data_dir):
    # Every update drawn: tqdm reads its TQDM_* defaults once, when it is imported, so the run is
    # a fresh process started with TQDM_MININTERVAL=0 (setting it in this process changes nothing:
    # at ~90 steps/s the default 0.1 s refresh interval skips every state that showed the validation).
    config = tmp_path / "bar.yaml"
    config.write_text(
        "name: bar\n"
        "task: {dataset: sst2, tokenizer: bpe-512, train_samples: 96, validation_samples: 32, max_length: 32}\n"
        f"model: {TINY_GPT}\n"
        "methods: [{name: baseline, learning_rate: 1.0e-3}]\nseeds: [0]\n"
        "training: {max_steps: 6, batch_size: 16, eval_every: 2, log_every: 4, progress_bar: true, tensorboard: false}\n")
    env = {**os.environ, "TQDM_MININTERVAL": "0", "OELM_DATA_DIR": str(data_dir),
           "PYTHONPATH": os.pathsep.join([str(SRC), os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.run([sys.executable, "-m", "oelm", "run", str(config), "--output-dir", str(tmp_path / "out")],
                          env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    err = proc.stderr
    postfixes = re.findall(r"\[[^\]]*?, ([^\]]*)\]", err)
    assert any("val=" in p for p in postfixes), err[-2000:]
    assert any("loss=" in p for p in postfixes), err[-2000:]
    assert "nan" not in err
