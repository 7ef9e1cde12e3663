"""DataLoader workers (``training.num_workers``): what ``"auto"`` resolves to, and that workers
change no batch (real SST-2 sentences, oelm's GPT tokenizer path)."""

from __future__ import annotations

import pytest
import torch

from oelm.config import ExperimentConfig, TrainingConfig
from oelm.matrix.data import AUTO_MAX_WORKERS, loader_workers, make_loaders, prepare_data


def test_auto_workers_are_none_on_cpu_and_a_few_per_gpu_process():
    assert TrainingConfig().num_workers == "auto"
    assert loader_workers("auto", cuda=False, cores=64) == 0  # CPU: the cores run the model
    assert loader_workers("auto", cuda=True, cores=16, local_processes=1) == AUTO_MAX_WORKERS == 4
    assert loader_workers("auto", cuda=True, cores=16, local_processes=8) == 1  # 2 cores each, one for the loop
    assert loader_workers("auto", cuda=True, cores=2, local_processes=1) == 1
    assert loader_workers("auto", cuda=True, cores=4, local_processes=8) == 0
    assert loader_workers(3, cuda=False) == 3 and loader_workers(0, cuda=True, cores=16) == 0  # a number is kept


def test_auto_reads_the_launchers_local_process_count(monkeypatch):
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "4")
    assert loader_workers("auto", cuda=True, cores=16) == 3


@pytest.mark.parametrize("value", [-1, True, 2.5, "many"])
def test_a_bad_worker_count_is_refused(value):
    with pytest.raises(ValueError, match="num_workers"):
        TrainingConfig(num_workers=value)


def _batches(loader) -> list[dict[str, torch.Tensor]]:
    return [dict(b) for b in loader]


def test_two_workers_give_the_same_batches_in_the_same_order(data_dir):
    config = ExperimentConfig.model_validate({
        "name": "workers", "task": {"dataset": "sst2", "tokenizer": "bpe-512", "train_samples": 96, "validation_samples": 40,
                                    "max_length": 32},
        "model": {"gpt": "gpt-tiny"}, "methods": [{"name": "baseline", "learning_rate": 1e-3}],
        "training": {"batch_size": 16, "eval_batch_size": 16, "group_by_length": True, "num_workers": 0},
    })
    data = prepare_data(config)
    plain = make_loaders(data, config.training, seed=3)
    with_workers = make_loaders(data, config.training.model_copy(update={"num_workers": 2}), seed=3)
    assert [dl.num_workers for dl in with_workers[:2]] == [2, 2]
    assert with_workers[0].persistent_workers and not with_workers[1].persistent_workers
    for a, b in zip(plain[:2], with_workers[:2]):
        first, second = _batches(a), _batches(b)
        assert len(first) == len(second) > 1
        for x, y in zip(first, second):
            assert x.keys() == y.keys() and all(torch.equal(x[k], y[k]) for k in x)
