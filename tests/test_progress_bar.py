"""The run's progress bar: before the first log step there is no train loss yet (it is read from
the device at log steps only), so a validation's postfix shows the validation value and no
``loss=nan``; from the first log step on it shows the logged loss."""

from __future__ import annotations

import re

from oelm.cli import main
from _tiny_matrix import TINY_GPT


def test_progress_bar_never_shows_a_nan_loss(tmp_path, data_dir, capfd, monkeypatch):
    # every update drawn (tqdm reads TQDM_* defaults): at ~60 steps/s its 0.1 s refresh interval
    # could skip every state that showed the validation
    monkeypatch.setenv("TQDM_MININTERVAL", "0")
    config = tmp_path / "bar.yaml"
    config.write_text(
        "name: bar\n"
        "task: {dataset: sst2, tokenizer: bpe-512, train_samples: 96, validation_samples: 32, max_length: 32}\n"
        f"model: {TINY_GPT}\n"
        "methods: [{name: baseline, learning_rate: 1.0e-3}]\nseeds: [0]\n"
        "training: {max_steps: 6, batch_size: 16, eval_every: 2, log_every: 4, progress_bar: true, tensorboard: false}\n")
    assert main(["run", str(config), "--output-dir", str(tmp_path / "out")]) == 0
    err = capfd.readouterr().err
    postfixes = re.findall(r"\[[^\]]*?, ([^\]]*)\]", err)
    assert any("val=" in p for p in postfixes), err[-2000:]
    assert any("loss=" in p for p in postfixes), err[-2000:]
    assert "nan" not in err
