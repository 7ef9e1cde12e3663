"""A small decoder-only transformer (GPT-2 style) with separate q/k/v/o attention projections.

Read top-down: CausalSelfAttention -> MLP -> Block -> GPTModel -> the two heads
(GPTForCausalLM, GPTForSequenceClassification) -> the builder. The hyper-parameters
(GPTConfig) and the presets live in :mod:`oelm.models.gpt_configuration` (still importable
from here). Layer norms are ``nn.LayerNorm(..., bias=config.bias)`` (bias is optional in
torch >= 2.1), so no custom class.

Notation used in shape comments: B batch, T sequence length, C = hidden_size,
nh = num_heads, hs = head_dim = C / nh, F = intermediate_size, V = vocab_size.

One block (pre-LayerNorm residual, as in GPT-2)::

    x = x + Attn(LN_1(x))          Attn(x) = concat_h softmax(Q_h K_h^T / sqrt(hs) + M) V_h  W_o
    x = x + MLP(LN_2(x))           MLP(x)  = GELU(x W_fc + b_fc) W_proj + b_proj

with Q = x W_q, K = x W_k, V = x W_v (each C x C) and M the causal (and padding) mask. The
query/key projections are the separate ``q_proj`` / ``k_proj`` linears on purpose: OELM
re-initialises exactly these two head-wise orthogonal and freezes them, so they must not be
fused into one ``c_attn`` matrix as in GPT-2.

Padding: ``attention_mask`` is ``[B, T]`` with 1 for a real token and 0 for padding. Padded
keys are never attended to, and position ids count real tokens only
(``cumsum(attention_mask) - 1``), so a left-padded row gives the same hidden states at its
real tokens as the unpadded row; right padding never matters to earlier tokens (causality).

Errors: :class:`oelm.errors.ConfigError` (a ``ValueError``) for an invalid config, an unknown
preset/override/task, or an input longer than ``context_length``; ``ValueError`` for inputs
of the wrong rank or mismatched mask shape.
"""

from __future__ import annotations

import math
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint
from transformers.modeling_outputs import CausalLMOutput, SequenceClassifierOutput

from oelm.architectures.flops import model_flops_per_token
from oelm.errors import ConfigError
from oelm.models.gpt_configuration import PRESETS, GPTConfig, gpt_config  # PRESETS: re-exported from here
from oelm.models.loss import causal_lm_loss  # defined there beside the chunked loss; still importable from here

__all__ = [
    "GPTConfig",
    "PRESETS",
    "gpt_config",
    "CausalSelfAttention",
    "MLP",
    "Block",
    "GPTModel",
    "GPTForCausalLM",
    "GPTForSequenceClassification",
    "causal_lm_loss",
    "build_gpt",
    "TASKS",
]


def _attention_mask_4d(attention_mask: torch.Tensor, T: int) -> torch.Tensor:
    """Combine the causal mask with a key padding mask into one boolean SDPA ``attn_mask``.

    Args:
        attention_mask: ``[B, T]``, nonzero = real token, 0 = padding.
        T: sequence length.

    Returns:
        ``[B, 1, T, T]`` bool, True where query i may attend key j: ``j <= i`` and key j is
        real. Every query may also attend itself, so a pad query with no real key before it
        (left padding) never has an all-False row: backends disagree on a softmax over
        nothing (torch 2.13 on CPU returns zeros, older or fused kernels NaN, which would then
        reach the gradients). Those rows belong to pad positions and are ignored downstream.
    """
    device = attention_mask.device
    causal = torch.ones(T, T, dtype=torch.bool, device=device).tril()  # (T, T)
    keep = attention_mask.bool()[:, None, None, :]  # (B, 1, 1, T) over keys
    diag = torch.eye(T, dtype=torch.bool, device=device)  # (T, T)
    return causal & (keep | diag)  # (B, 1, T, T)


class CausalSelfAttention(nn.Module):
    """Multi-head causal self-attention with separate query, key, value and output projections.

    ``y = softmax(Q K^T / sqrt(hs) + M) V`` per head, heads concatenated, then ``o_proj``.
    Attributes ``q_proj, k_proj, v_proj, o_proj`` are ``nn.Linear(C, C, bias=config.bias)``;
    head h of the query (key) projection is rows ``h*hs:(h+1)*hs`` of ``q_proj.weight``.

    Input ``x`` is ``[B, T, C]``; optional ``attention_mask`` ``[B, T]`` (1 token, 0 pad).
    Output is ``[B, T, C]``.

    With a fixed attention map (:meth:`set_fixed_attention`, the ``fixed_attention`` method) the
    scores are ``fixed_logits[h, :T, :T]`` instead of ``Q_h K_h^T / sqrt(hs)``:
    ``y = softmax(R_h + M) V`` with the same causal/padding mask; ``q_proj``/``k_proj`` are not used.
    """

    def __init__(self, config: GPTConfig):
        super().__init__()
        C = config.hidden_size
        self.num_heads = config.num_heads
        self.head_dim = config.head_dim
        self.context_length = config.context_length
        self.dropout = config.dropout
        self.q_proj = nn.Linear(C, C, bias=config.bias)
        self.k_proj = nn.Linear(C, C, bias=config.bias)
        self.v_proj = nn.Linear(C, C, bias=config.bias)
        self.o_proj = nn.Linear(C, C, bias=config.bias)
        self.resid_dropout = nn.Dropout(config.dropout)
        self.register_parameter("fixed_logits", None)  # (nh, context_length, context_length) once set

    @torch.no_grad()
    def set_fixed_attention(self, generator: torch.Generator | None = None, std: float = 1.0) -> None:
        """Use a frozen, input-independent random attention map from now on (Synthesizer "Random",
        Tay et al., ICML 2021, with the map fixed).

        Adds the parameter ``fixed_logits`` ([num_heads, context_length, context_length], N(0, std^2)
        drawn on the CPU in float32 from ``generator``, ``requires_grad=False``) on the device and in
        the dtype of ``v_proj.weight``. Its rows are the attention scores of each query position over
        the key positions (sequence positions, not token positions); the causal and padding masks
        still apply, so the map's upper triangle is never used.
        """
        nh, L = self.num_heads, self.context_length
        draw = torch.randn(nh, L, L, generator=generator, dtype=torch.float32) * float(std)
        weight = self.v_proj.weight
        self.fixed_logits = nn.Parameter(draw.to(device=weight.device, dtype=weight.dtype), requires_grad=False)

    def _fixed_attention(self, v: torch.Tensor, attention_mask: torch.Tensor | None, dropout_p: float) -> torch.Tensor:
        """``softmax(R + M) V`` per head: v ``(B, nh, T, hs)`` -> ``(B, nh, T, hs)``."""
        T = v.shape[2]
        if attention_mask is None:
            mask = torch.ones(T, T, dtype=torch.bool, device=v.device).tril()  # (T, T), broadcast
        else:
            mask = _attention_mask_4d(attention_mask, T)  # (B, 1, T, T)
        scores = self.fixed_logits[:, :T, :T].to(v.dtype).masked_fill(~mask, float("-inf"))  # (B|1, nh, T, T)
        probs = F.dropout(torch.softmax(scores, dim=-1), p=dropout_p, training=dropout_p > 0)
        return probs @ v  # (B, nh, T, hs)

    def forward(self, x: torch.Tensor, attention_mask: torch.Tensor | None = None) -> torch.Tensor:
        B, T, C = x.shape
        nh, hs = self.num_heads, self.head_dim
        dropout_p = self.dropout if self.training else 0.0
        if self.fixed_logits is not None:
            v = self.v_proj(x).view(B, T, nh, hs).transpose(1, 2)  # (B, nh, T, hs)
            y = self._fixed_attention(v, attention_mask, dropout_p).transpose(1, 2).contiguous().view(B, T, C)
            return self.resid_dropout(self.o_proj(y))
        q = self.q_proj(x).view(B, T, nh, hs).transpose(1, 2)  # (B, nh, T, hs)
        k = self.k_proj(x).view(B, T, nh, hs).transpose(1, 2)  # (B, nh, T, hs)
        v = self.v_proj(x).view(B, T, nh, hs).transpose(1, 2)  # (B, nh, T, hs)
        if attention_mask is None:
            # Fast path: SDPA builds the causal mask itself (and can pick a fused kernel).
            y = F.scaled_dot_product_attention(q, k, v, dropout_p=dropout_p, is_causal=True)
        else:
            mask = _attention_mask_4d(attention_mask, T)  # (B, 1, T, T), broadcast over heads
            y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=dropout_p)
        # y: (B, nh, T, hs)
        y = y.transpose(1, 2).contiguous().view(B, T, C)  # (B, T, C): heads side by side
        return self.resid_dropout(self.o_proj(y))


class MLP(nn.Module):
    """Position-wise feed-forward: ``proj(GELU(fc(x)))`` then dropout; ``[B, T, C] -> [B, T, C]``.

    ``fc`` is ``Linear(C, F)``, ``proj`` is ``Linear(F, C)``.
    """

    def __init__(self, config: GPTConfig):
        super().__init__()
        self.fc = nn.Linear(config.hidden_size, config.intermediate_size, bias=config.bias)
        self.act = nn.GELU()
        self.proj = nn.Linear(config.intermediate_size, config.hidden_size, bias=config.bias)
        self.dropout = nn.Dropout(config.dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.act(self.fc(x))  # (B, T, F)
        return self.dropout(self.proj(h))  # (B, T, C)


class Block(nn.Module):
    """Pre-LayerNorm transformer block: ``x + attn(ln_1(x))``, then ``x + mlp(ln_2(x))``."""

    def __init__(self, config: GPTConfig):
        super().__init__()
        self.ln_1 = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps, bias=config.bias)
        self.attn = CausalSelfAttention(config)
        self.ln_2 = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps, bias=config.bias)
        self.mlp = MLP(config)

    def forward(self, x: torch.Tensor, attention_mask: torch.Tensor | None = None) -> torch.Tensor:
        x = x + self.attn(self.ln_1(x), attention_mask)  # (B, T, C)
        x = x + self.mlp(self.ln_2(x))  # (B, T, C)
        return x


def _init_weights(module: nn.Module) -> None:
    """GPT-2 init: linear and embedding weights ~ N(0, 0.02), biases 0, layer norms (1, 0)."""
    if isinstance(module, nn.Linear):
        nn.init.normal_(module.weight, mean=0.0, std=0.02)
        if module.bias is not None:
            nn.init.zeros_(module.bias)
    elif isinstance(module, nn.Embedding):
        nn.init.normal_(module.weight, mean=0.0, std=0.02)
    elif isinstance(module, nn.LayerNorm):
        if module.weight is not None:
            nn.init.ones_(module.weight)
        if module.bias is not None:
            nn.init.zeros_(module.bias)


class _GPTBase(nn.Module):
    """Parameter counting and FLOP arithmetic shared by GPTModel and its heads."""

    config: GPTConfig

    def _backbone(self) -> GPTModel:
        return self.transformer  # type: ignore[attr-defined]

    def get_input_embeddings(self) -> nn.Embedding:
        """The token-embedding table ``wte`` (``[V, C]``)."""
        return self._backbone().wte

    def _embedding_tables(self) -> list[nn.Parameter]:
        """Parameters that are only looked up, never multiplied with activations."""
        backbone = self._backbone()
        return [backbone.wte.weight, backbone.wpe.weight]

    def num_parameters(self, exclude_embeddings: bool = False) -> int:
        """Number of parameters; a tensor shared by two modules (tied embeddings) counts once.

        With ``exclude_embeddings=True`` the lookup tables (token and position embeddings)
        are left out, except that a token-embedding matrix tied to ``lm_head`` is kept: it is
        the output projection, a real matmul per token. This is the ``N`` of
        :meth:`flops_per_token`.
        """
        excluded = {id(p) for p in self._embedding_tables()} if exclude_embeddings else set()
        # parameters() already yields a shared tensor once
        return sum(p.numel() for p in self.parameters() if id(p) not in excluded)

    def activation_checkpointing_enable(
        self,
        activation_checkpointing_kwargs: dict[str, Any] | None = None,
        every_n_layers: int = 1,
        offload: bool = False,
    ) -> None:
        """Recompute each block's activations in the backward pass instead of storing them.

        Same signature as Hugging Face ``PreTrainedModel.activation_checkpointing_enable``, so
        ``Trainer(args=TrainingArguments(activation_checkpointing=True))`` can turn it on. Only in
        training mode; gradients equal those without checkpointing (tested to 1e-6).

        Args:
            activation_checkpointing_kwargs: passed to ``torch.utils.checkpoint.checkpoint``;
                default ``{"use_reentrant": False}``. Keep it non-reentrant: the reentrant variant
                computes no parameter gradients inside a block whose input does not require grad.
            every_n_layers: checkpoint blocks ``0, n, 2n, ...`` only.

        Raises:
            ConfigError: ``every_n_layers < 1`` or ``offload=True`` (not supported here).
        """
        if isinstance(every_n_layers, bool) or not isinstance(every_n_layers, int) or every_n_layers < 1:
            raise ConfigError(f"every_n_layers must be a positive int, got {every_n_layers!r}")
        if offload:
            raise ConfigError("offload=True is not supported by oelm's GPT; use offload=False")
        backbone = self._backbone()
        backbone.gradient_checkpointing = True
        backbone._checkpoint_kwargs = dict(activation_checkpointing_kwargs or {"use_reentrant": False})
        backbone._checkpoint_every = every_n_layers

    def activation_checkpointing_disable(self) -> None:
        """Store activations again (the default)."""
        self._backbone().gradient_checkpointing = False

    def gradient_checkpointing_enable(self, gradient_checkpointing_kwargs: dict[str, Any] | None = None, **kwargs: Any) -> None:
        """Alias of :meth:`activation_checkpointing_enable` (the older Hugging Face name)."""
        self.activation_checkpointing_enable(gradient_checkpointing_kwargs, **kwargs)

    def gradient_checkpointing_disable(self) -> None:
        """Alias of :meth:`activation_checkpointing_disable`."""
        self.activation_checkpointing_disable()

    @property
    def is_activation_checkpointing(self) -> bool:
        """Whether activation checkpointing is on."""
        return self._backbone().gradient_checkpointing

    def flops_per_token(self, seq_len: int) -> float:
        """Training FLOPs (forward + backward) per token at sequence length ``seq_len``.

        ``6 N + 12 L C T`` from PaLM (Chowdhery et al., 2022, appendix B): each of the ``N``
        matmul parameters costs 2 FLOPs forward and 4 backward per token, and attention's
        ``Q K^T`` and ``P V`` add ``2 * 2 * L * C * T`` forward, times 3 with the backward.
        ``N = num_parameters(exclude_embeddings=True)``; ``L = num_layers``, ``C = hidden_size``,
        ``T = seq_len``. The formula ignores the causal mask's saved work (it counts full
        ``T x T`` attention, as PaLM and nanoGPT's MFU do), and counts frozen weights like
        trainable ones. It is :func:`oelm.architectures.flops.model_flops_per_token` (the same count for any
        model), with the context length checked here.

        Raises:
            ValueError: ``seq_len`` is not in ``[1, context_length]``.
        """
        if not 1 <= int(seq_len) <= self.config.context_length:
            raise ValueError(
                f"seq_len must be in [1, context_length={self.config.context_length}], got {seq_len}"
            )
        return model_flops_per_token(self, int(seq_len))


class GPTModel(_GPTBase):
    """Token + position embeddings, ``num_layers`` blocks, final LayerNorm.

    ``forward(input_ids [B, T] long, attention_mask [B, T] | None) -> hidden states [B, T, C]``.

    Raises:
        ConfigError: ``T > context_length``.
        ValueError: ``input_ids`` is not 2-D, or ``attention_mask`` has a different shape.
    """

    def __init__(self, config: GPTConfig):
        super().__init__()
        self.config = config
        self.wte = nn.Embedding(config.vocab_size, config.hidden_size)
        self.wpe = nn.Embedding(config.context_length, config.hidden_size)
        self.drop = nn.Dropout(config.dropout)
        self.h = nn.ModuleList([Block(config) for _ in range(config.num_layers)])
        self.ln_f = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps, bias=config.bias)
        self.gradient_checkpointing = False  # see activation_checkpointing_enable
        self._checkpoint_kwargs: dict[str, Any] = {"use_reentrant": False}
        self._checkpoint_every = 1

        self.apply(_init_weights)
        # Each block adds two branches (attention, MLP) to the residual stream, so at init the
        # stream is a sum of 2L roughly independent terms and its variance grows with depth.
        # Scaling the std of the layers that write into it by 1/sqrt(2L) keeps that variance
        # independent of L (GPT-2 paper, Radford et al. 2019, section 2.3).
        residual_std = 0.02 / math.sqrt(2 * config.num_layers)
        for block in self.h:
            nn.init.normal_(block.attn.o_proj.weight, mean=0.0, std=residual_std)
            nn.init.normal_(block.mlp.proj.weight, mean=0.0, std=residual_std)

    def _backbone(self) -> GPTModel:
        return self

    def forward(
        self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None
    ) -> torch.Tensor:
        if input_ids.dim() != 2:
            raise ValueError(f"input_ids must be [batch, seq_len], got shape {tuple(input_ids.shape)}")
        B, T = input_ids.shape
        if T > self.config.context_length:
            raise ConfigError(
                f"sequence length {T} exceeds context_length={self.config.context_length}; "
                "truncate the inputs (max_length) or build the model with a larger context_length"
            )
        if attention_mask is None:
            pos = torch.arange(T, device=input_ids.device)  # (T,)
        else:
            if attention_mask.shape != input_ids.shape:
                raise ValueError(
                    f"attention_mask shape {tuple(attention_mask.shape)} != input_ids shape {(B, T)}"
                )
            # Count real tokens only, so left padding does not shift the positions.
            pos = (attention_mask.long().cumsum(-1) - 1).clamp(min=0)  # (B, T)
        x = self.drop(self.wte(input_ids) + self.wpe(pos))  # (B, T, C)
        for i, block in enumerate(self.h):
            if self.gradient_checkpointing and self.training and i % self._checkpoint_every == 0:
                x = checkpoint(block, x, attention_mask, **self._checkpoint_kwargs)  # (B, T, C), recomputed in backward
            else:
                x = block(x, attention_mask)  # (B, T, C)
        return self.ln_f(x)  # (B, T, C)


class GPTForCausalLM(_GPTBase):
    """GPTModel plus a language-modelling head ``lm_head: Linear(C, V, bias=False)``.

    With ``tie_word_embeddings`` the head's weight *is* ``transformer.wte.weight``.

    ``forward(input_ids [B, T], attention_mask [B, T] | None, labels [B, T] | None)`` returns
    ``CausalLMOutput(loss, logits [B, T, V])``. Labels follow the Hugging Face convention:
    pass the input ids; the shift happens here (``logits[:, t]`` predicts ``labels[:, t+1]``),
    positions labelled ``-100`` are ignored, and the loss is the mean cross-entropy over the
    remaining tokens. ``attention_mask`` does not mask the loss: label pads with ``-100``.
    """

    def __init__(self, config: GPTConfig):
        super().__init__()
        self.config = config
        self.transformer = GPTModel(config)
        self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        if config.tie_word_embeddings:
            self.lm_head.weight = self.transformer.wte.weight
        else:
            _init_weights(self.lm_head)

    def _embedding_tables(self) -> list[nn.Parameter]:
        # A tied wte is also the output projection, so it stays in the FLOP count.
        return [p for p in super()._embedding_tables() if p is not self.lm_head.weight]

    def forward(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        labels: torch.Tensor | None = None,
    ) -> CausalLMOutput:
        x = self.transformer(input_ids, attention_mask)  # (B, T, C)
        logits = self.lm_head(x)  # (B, T, V)
        loss = None
        if labels is not None:
            loss = causal_lm_loss(logits, labels)
        return CausalLMOutput(loss=loss, logits=logits)


class GPTForSequenceClassification(_GPTBase):
    """GPTModel (still causal) plus ``score: Linear(C, num_labels)`` on the last real token.

    The pooled vector of row b is ``hidden[b, last_b]`` where ``last_b`` is the last position
    with ``attention_mask == 1``; without a mask, the last position whose token is not
    ``config.pad_token_id``; without either, position ``T - 1``. Works for right and left
    padding. Because attention is causal, only the last token has seen the whole text.

    ``forward(input_ids [B, T], attention_mask [B, T] | None, labels [B] | None)`` returns
    ``SequenceClassifierOutput(loss, logits [B, num_labels])``; loss is the mean
    cross-entropy (``ignore_index=-100``).
    """

    def __init__(self, config: GPTConfig):
        super().__init__()
        self.config = config
        self.transformer = GPTModel(config)
        self.score = nn.Linear(config.hidden_size, config.num_labels, bias=config.bias)
        _init_weights(self.score)

    def _last_token_index(
        self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None
    ) -> torch.Tensor:
        """``[B]`` index of each row's last real token (0 for a row with none)."""
        B, T = input_ids.shape
        if attention_mask is not None:
            keep = attention_mask.bool()  # (B, T)
        elif self.config.pad_token_id is not None:
            keep = input_ids != self.config.pad_token_id  # (B, T)
        else:
            return torch.full((B,), T - 1, dtype=torch.long, device=input_ids.device)
        pos = torch.arange(T, device=input_ids.device)  # (T,)
        return (keep.long() * pos).amax(dim=-1)  # (B,)

    def forward(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        labels: torch.Tensor | None = None,
    ) -> SequenceClassifierOutput:
        x = self.transformer(input_ids, attention_mask)  # (B, T, C)
        last = self._last_token_index(input_ids, attention_mask)  # (B,)
        pooled = x[torch.arange(x.size(0), device=x.device), last]  # (B, C)
        logits = self.score(pooled)  # (B, num_labels)
        loss = None
        if labels is not None:
            loss = F.cross_entropy(logits.float(), labels.reshape(-1).long(), ignore_index=-100)
        return SequenceClassifierOutput(loss=loss, logits=logits)


TASKS: dict[str, type[_GPTBase]] = {
    "causal_lm": GPTForCausalLM,
    "sequence_classification": GPTForSequenceClassification,
}


def build_gpt(
    preset_or_config: str | GPTConfig, task: str = "causal_lm", **overrides: Any
) -> GPTForCausalLM | GPTForSequenceClassification:
    """Build a freshly initialised model from a preset name or a GPTConfig.

    Example: ``build_gpt("gpt-tiny", "sequence_classification", num_labels=2, vocab_size=30522)``.

    Args:
        preset_or_config: a key of :data:`PRESETS` or a :class:`GPTConfig` (not modified).
        task: ``"causal_lm"`` or ``"sequence_classification"``.
        **overrides: GPTConfig fields to change.

    Raises:
        ConfigError: unknown task, preset or override key, or an invalid resulting config.
    """
    if task not in TASKS:
        raise ConfigError(f"unknown task {task!r}; valid tasks: {', '.join(TASKS)}")
    if isinstance(preset_or_config, GPTConfig):
        config = preset_or_config.replace(**overrides)
    elif isinstance(preset_or_config, str):
        config = gpt_config(preset_or_config, **overrides)
    else:
        raise ConfigError(
            f"build_gpt expects a preset name or a GPTConfig, got {type(preset_or_config).__name__}"
        )
    return TASKS[task](config)
