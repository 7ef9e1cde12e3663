"""Cross-entropy over a large vocabulary without an fp32 copy of the whole logits.

``F.cross_entropy(logits.float(), target)`` on bf16 logits ``[N, V]`` writes an fp32 copy of
all ``N x V`` values, keeps its log-softmax for the backward, and reads both again there: at
GPT-2's V = 50,304 and 8 x 1,024 tokens that is 1.6 GB of fp32 per copy. :func:`chunked_cross_entropy`
does the same math ``rows`` at a time, in fp32 only inside a chunk::

    forward:  lse_i = logsumexp(x_i)              (fp32, per chunk of rows)
              loss  = sum_i valid_i (lse_i - x_i[t_i]) / sum_i valid_i
    backward: dL/dx_i = valid_i (softmax(x_i) - onehot(t_i)) * grad / sum_i valid_i
              recomputed from the saved low-precision logits and lse (fp32, per chunk)

so it keeps only ``lse`` (``N`` floats) beside the logits the model already holds.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

__all__ = ["causal_lm_loss", "chunked_cross_entropy"]


class _ChunkedCrossEntropy(torch.autograd.Function):
    """Mean cross-entropy of ``logits [N, V]`` against ``target [N]``, chunk by chunk (see the module)."""

    @staticmethod
    def forward(ctx, logits: torch.Tensor, target: torch.Tensor, ignore_index: int, rows: int) -> torch.Tensor:
        valid = target != ignore_index  # (N,)
        safe = target.masked_fill(~valid, 0)  # (N,) a gatherable index where ignored
        lse = torch.empty(logits.shape[0], dtype=torch.float32, device=logits.device)  # (N,)
        total = torch.zeros((), dtype=torch.float32, device=logits.device)
        for s in range(0, logits.shape[0], rows):
            x = logits[s:s + rows].float()  # (n, V) fp32: one chunk at a time
            lse[s:s + rows] = torch.logsumexp(x, dim=-1)
            picked = x.gather(1, safe[s:s + rows, None]).squeeze(1)  # (n,)
            total += ((lse[s:s + rows] - picked) * valid[s:s + rows]).sum()
        count = valid.sum()
        ctx.rows = rows
        ctx.save_for_backward(logits, safe, valid, lse, count)
        return total / count  # 0/0 = NaN when every target is ignored, as F.cross_entropy's mean

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        logits, safe, valid, lse, count = ctx.saved_tensors
        rows = ctx.rows
        out = torch.empty_like(logits)  # (N, V) in the logits' dtype
        scale = grad.float() / count
        for s in range(0, logits.shape[0], rows):
            p = torch.exp(logits[s:s + rows].float() - lse[s:s + rows, None])  # (n, V) softmax, fp32
            p.scatter_add_(1, safe[s:s + rows, None], torch.full_like(lse[s:s + rows, None], -1.0))
            p.mul_(valid[s:s + rows, None] * scale)
            out[s:s + rows] = p
        return out, None, None, None


def chunked_cross_entropy(logits: torch.Tensor, target: torch.Tensor, ignore_index: int = -100,
                          rows: int | None = None) -> torch.Tensor:
    """``F.cross_entropy(logits.float(), target, ignore_index=ignore_index)`` (mean) without an
    fp32 copy of the whole ``logits``.

    Args:
        logits: ``[N, V]`` float (bf16, fp16 or fp32); its gradient comes back in its dtype.
        target: ``[N]`` long class ids; ``ignore_index`` entries count neither in the sum nor the mean.
        rows: rows per fp32 chunk; default ``max(1, 2**24 // V)`` (64 MiB of fp32 per chunk).

    Returns:
        A 0-d float32 tensor (NaN when every target is ignored).

    Raises:
        ValueError: ``logits`` is not 2-D, or ``target`` is not ``[N]``.
    """
    if logits.dim() != 2 or target.shape != logits.shape[:1]:
        raise ValueError(f"chunked_cross_entropy expects logits [N, V] and target [N], got {tuple(logits.shape)} "
                         f"and {tuple(target.shape)}")
    rows = rows or max(1, 2**24 // logits.shape[1])
    return _ChunkedCrossEntropy.apply(logits, target, ignore_index, rows)


def causal_lm_loss(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Mean next-token cross-entropy: ``logits[:, t]`` predicts ``labels[:, t+1]``, ``-100`` ignored.

    Args:
        logits: ``[B, T, V]`` (any float dtype; the loss is computed in float32: fp32 logits
            through ``F.cross_entropy``, bf16/fp16 ones by :func:`chunked_cross_entropy`,
            which upcasts a chunk of rows at a time instead of copying all ``B x T x V`` to fp32).
        labels: ``[B, T]`` long, usually the input ids (Hugging Face convention).

    Returns:
        A 0-d float32 tensor: the mean over every ``(b, t)``, ``t < T - 1``, whose
        ``labels[b, t+1] != -100``.

    The *labels* are shifted, not the logits: ``labels[:, 1:]`` padded with one ``-100`` at the
    end lines up with all ``T`` logit positions (the last is ignored). So a contiguous ``logits``
    is flattened without a copy (a view), where slicing ``logits[:, :-1]`` copied the whole ``[B, T-1, V]``
    tensor every step and its backward zero-filled a ``[B, T, V]`` gradient to scatter into
    (about 2 % of a CPU step at V = 4096). Same terms, same mean.
    """
    V = logits.size(-1)
    target = F.pad(labels[:, 1:], (0, 1), value=-100)  # (B, T): target of position t is labels[t+1]
    if logits.dtype == torch.float32:
        return F.cross_entropy(logits.reshape(-1, V), target.reshape(-1), ignore_index=-100)
    return chunked_cross_entropy(logits.reshape(-1, V), target.reshape(-1), ignore_index=-100)
