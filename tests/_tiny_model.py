"""A tiny model and loader with the interface oelm's engine expects (``forward(**batch)`` returns
``.loss`` / ``.logits``), for tests of the engine's arithmetic that need no data; and a tiny decoder
with its own module names and no Hugging Face config (:class:`TinyCustomLM`), for the tests of
models no registry entry knows."""

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


class TinyBlock(nn.Module):
    def __init__(self, hidden: int, heads: int, kv_heads: int, fused: bool):
        super().__init__()
        self.heads, self.kv_heads, self.head_dim = heads, kv_heads, hidden // heads
        kv = kv_heads * self.head_dim
        self.attn = nn.Module()
        if fused:
            self.attn.wqkv = nn.Linear(hidden, hidden + 2 * kv)
        else:
            self.attn.wq, self.attn.wk, self.attn.wv = nn.Linear(hidden, hidden), nn.Linear(hidden, kv), nn.Linear(hidden, kv)
        self.attn.wo = nn.Linear(hidden, hidden)
        self.mlp = nn.Sequential(nn.Linear(hidden, 2 * hidden), nn.GELU(), nn.Linear(2 * hidden, hidden))
        self.fused = fused

    def forward(self, x):  # (B, T, hidden)
        B, L, H = x.shape
        if self.fused:
            q, k, v = self.attn.wqkv(x).split([H, self.kv_heads * self.head_dim, self.kv_heads * self.head_dim], -1)
        else:
            q, k, v = self.attn.wq(x), self.attn.wk(x), self.attn.wv(x)
        q = q.view(B, L, self.heads, self.head_dim).transpose(1, 2)  # (B, nh, T, hd)
        k = k.view(B, L, self.kv_heads, self.head_dim).transpose(1, 2)  # (B, nkv, T, hd)
        v = v.view(B, L, self.kv_heads, self.head_dim).transpose(1, 2)
        y = nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
        x = x + self.attn.wo(y.transpose(1, 2).reshape(B, L, H))
        return x + self.mlp(x)


class TinyCustomLM(nn.Module):
    """A decoder no registry entry knows: no Hugging Face config, own module names (``blocks.N.attn.wq``
    / ``wk`` / ``wv`` / ``wo``, or a fused ``wqkv``), hidden size 32, 4 query heads, ``kv_heads`` key/value
    heads; seeded, so two instances are equal. ``forward(ids)``: ids (B, T) -> logits (B, T, vocab)."""

    def __init__(self, fused: bool = False, kv_heads: int = 2, vocab: int = 100, layers: int = 2):
        super().__init__()
        torch.manual_seed(0)
        self.embed = nn.Embedding(vocab, 32)
        self.blocks = nn.ModuleList(TinyBlock(32, 4, kv_heads, fused) for _ in range(layers))
        self.out = nn.Linear(32, vocab)

    def forward(self, ids):
        x = self.embed(ids)
        for b in self.blocks:
            x = b(x)
        return self.out(x)
