"""Random-number-generator states of a run: captured into checkpoints, restored on resume,
and the per-epoch data-order seed (so a resumed run draws exactly the batches of an
uninterrupted one)."""

from __future__ import annotations

import random
import warnings
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

if TYPE_CHECKING:
    from oelm.training.engine import Engine

__all__ = ["capture_rng", "epoch_seed", "gather_rng", "rank_rng", "restore_rng"]


def epoch_seed(base_seed: int, epoch: int) -> int:
    """Seed of one epoch's data order: a function of (loader seed, epoch) only, so a resumed
    run draws exactly the batches of an uninterrupted one."""
    return int(np.random.SeedSequence([base_seed, epoch]).generate_state(1, dtype=np.uint64)[0] >> 1)


def capture_rng() -> tuple[dict[str, Any], dict[str, torch.Tensor | list[torch.Tensor]]]:
    """(JSON part: Python and NumPy states, tensor part: torch CPU and CUDA states)."""
    version, internal, gauss = random.getstate()
    np_name, np_keys, np_pos, np_has_gauss, np_gauss = np.random.get_state()
    json_part = {
        "python": [version, list(internal), gauss],
        "numpy": [np_name, np_keys.tolist(), int(np_pos), int(np_has_gauss), float(np_gauss)],
    }
    tensors: dict[str, Any] = {"torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        tensors["cuda"] = torch.cuda.get_rng_state_all()
    return json_part, tensors


def restore_rng(json_part: dict[str, Any], tensors: dict[str, Any]) -> None:
    """Inverse of :func:`capture_rng`."""
    version, internal, gauss = json_part["python"]
    random.setstate((version, tuple(internal), gauss))
    np_name, np_keys, np_pos, np_has_gauss, np_gauss = json_part["numpy"]
    np.random.set_state((np_name, np.asarray(np_keys, dtype=np.uint32), np_pos, np_has_gauss, np_gauss))
    torch.set_rng_state(tensors["torch"])
    if "cuda" in tensors and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(tensors["cuda"])


def gather_rng(engine: "Engine", rng: tuple[dict[str, Any], dict[str, Any]]) -> list[tuple[dict[str, Any], dict[str, Any]]]:
    """Every rank's :func:`capture_rng` states, in rank order (a collective: all ranks call it).

    The ranks start from one seed but part as soon as they draw different numbers of random
    values (dropout on classification batches padded to different lengths), so a checkpoint
    keeps each rank's own."""
    gathered: list[Any] = [None] * engine.world_size
    torch.distributed.all_gather_object(gathered, rng)
    return gathered


def rank_rng(engine: "Engine", st: dict[str, Any], tensors: dict[str, Any],
             ckpt_dir: Path) -> tuple[dict[str, Any], dict[str, Any]]:
    """This process's RNG states from a checkpoint: its own (``rng_ranks``, written by a run on
    several processes), else rank 0's (``rng``: the only ones of a one-process checkpoint, and
    of a multi-process one written before per-rank states were kept; a warning says so)."""
    rank, world = engine.accelerator.process_index, engine.world_size
    json_ranks, tensor_ranks = st.get("rng_ranks") or [], tensors.get("rng_ranks") or []
    stored = min(len(json_ranks), len(tensor_ranks))
    if world > 1 and stored < world and engine.is_main:
        held = f"ranks 0-{stored - 1}" if stored else "rank 0 only (written before checkpoints kept every rank's)"
        warnings.warn(f"checkpoint {ckpt_dir} holds the RNG states of {held}: ranks {max(stored, 1)}-{world - 1} "
                      "resume with rank 0's, so their random draws (dropout) differ from an uninterrupted run's",
                      RuntimeWarning, stacklevel=3)
    return (json_ranks[rank], tensor_ranks[rank]) if rank < stored else (st["rng"], tensors["rng"])
