"""A tiny model and loader with the interface oelm's engine expects (``forward(**batch)`` returns
``.loss`` / ``.logits``), for tests of the engine's arithmetic that need no data."""

from __future__ import annotations

from types import SimpleNamespace

import torch
import torch.nn.functional as F
from torch import nn


class Tiny(nn.Module):
    """forward(**batch) -> .loss/.logits, as the engine expects (input_ids are float features here)."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(4, 3)

    def forward(self, input_ids: torch.Tensor, labels: torch.Tensor, attention_mask: torch.Tensor | None = None):
        logits = self.lin(input_ids)
        return SimpleNamespace(loss=F.cross_entropy(logits.float(), labels), logits=logits)


def tiny_loader(n: int = 8, batch_size: int = 2) -> torch.utils.data.DataLoader:
    g = torch.Generator().manual_seed(0)
    rows = [{"input_ids": torch.randn(4, generator=g), "attention_mask": torch.ones(4, dtype=torch.long),
             "labels": torch.tensor(i % 3)} for i in range(n)]
    return torch.utils.data.DataLoader(rows, batch_size=batch_size)
