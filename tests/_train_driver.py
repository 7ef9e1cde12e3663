"""Runs one tiny real training run (oelm GPT on TinyStories) into a run dir; used by the
resume, fault and determinism tests, in a fresh process each time.

    python tests/_train_driver.py RUN_DIR OUT_JSON [--step-sleep S] [key=value ...]

Writes OUT_JSON with the run's performance, history and the sha256 of every weight tensor
(of the best weights saved in RUN_DIR/checkpoint/model.safetensors and of the final
in-memory model). Exit codes: 0 finished, 3 interrupted (RunInterruptedError), 4 run fault
(RunFaultError; ``fault`` in OUT_JSON).
"""

from __future__ import annotations

import hashlib
import json
import sys
import time
from pathlib import Path

from oelm.errors import RunFaultError, RunInterruptedError

BASE = {
    "name": "reliability-test",
    "task": {"dataset": "tinystories", "train_samples": 40, "validation_samples": 8, "block_size": 32, "tokenizer": "bpe-384"},
    "model": {"gpt": "gpt-tiny", "gpt_overrides": {"hidden_size": 32, "num_layers": 2, "num_heads": 2,
                                                   "intermediate_size": 64, "dropout": 0.1}},
    "methods": [{"name": "oelm_freeze"}],
    "seeds": [0],
    "training": {"max_steps": 90, "batch_size": 8, "eval_batch_size": 32, "eval_every": 20, "log_every": 3,
                 "checkpoint_every": 7, "keep_checkpoints": 2, "learning_rate": 2e-3, "timing_warmup_steps": 2,
                 "progress_bar": False, "tensorboard": False},
}


def tensor_digests(state: dict) -> dict[str, str]:
    """sha256 of every tensor's raw bytes (with dtype and shape)."""
    out = {}
    for name, t in sorted(state.items()):
        t = t.detach().cpu().contiguous()
        h = hashlib.sha256(f"{t.dtype}{tuple(t.shape)}".encode())
        h.update(t.view(-1).view(__import__("torch").uint8).numpy().tobytes() if t.numel() else b"")
        out[name] = h.hexdigest()
    return out


def build(overrides: list[str], base: dict = BASE):
    """(config, data, model, loaders) exactly as the experiment runner builds one run
    (``base``: the config the overrides apply to)."""
    from accelerate.utils import set_seed

    from oelm.config import config_from_dict, parse_overrides
    from oelm.config.reading import merge as _merge
    from oelm.matrix.data import make_loaders as _loaders, prepare_data
    from oelm.matrix.model import build_model
    from oelm.method import apply_oelm

    config = config_from_dict(_merge(base, parse_overrides(overrides)))
    data = prepare_data(config)
    seed = config.seeds[0]
    set_seed(seed)
    model, _ = build_model(config, data)
    apply_oelm(model, config.methods[0].oelm_config(), seed=seed)
    return config, data, model, _loaders(data, config.training, seed)


def main(argv: list[str]) -> int:
    run_dir, out_json = Path(argv[0]), Path(argv[1])
    rest = argv[2:]
    sleep = 0.0
    if rest[:1] == ["--step-sleep"]:
        sleep, rest = float(rest[1]), rest[2:]
    from safetensors.torch import load_file

    from oelm.training import train

    config, data, model, (train_loader, val_loader, test_loader) = build(rest)
    if sleep:  # throttle (test only) so a killer can hit chosen steps; changes no number
        model.register_forward_pre_hook(lambda m, a, k: time.sleep(sleep) if m.training else None, with_kwargs=True)
    try:
        result = train(model, train_loader, val_loader, metric=data.metric, config=config.training,
                       learning_rate=config.training.learning_rate, run_dir=run_dir, test_loader=test_loader)
    except RunInterruptedError as exc:
        out_json.write_text(json.dumps({"interrupted": {"step": exc.step, "signal": exc.signal_name}}))
        return 3
    except RunFaultError as exc:
        out_json.write_text(json.dumps({"fault": {"kind": exc.kind, "step": exc.step, "message": str(exc)}}))
        return 4
    out = {
        "performance": {"best_validation": result.best_validation, "best_step": result.best_step,
                        "final_validation": result.final_validation, "final_train_loss": result.final_train_loss,
                        "steps": result.steps, "test": result.test},
        "history": [{k: v for k, v in r.items() if k not in ("elapsed_seconds", "step_ms", "train_wall_seconds")} for r in result.history],
        "saved_weights": tensor_digests(load_file(str(run_dir / "checkpoint" / "model.safetensors"))),
        "model_weights": tensor_digests(model.state_dict()),
        "timing": result.timing,
    }
    out_json.write_text(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
