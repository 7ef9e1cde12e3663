"""The configuration of oelm's GPT (:mod:`oelm.models.gpt`): :class:`GPTConfig`, the presets, and
:func:`gpt_config` (a preset with overrides).

Errors: :class:`oelm.errors.ConfigError` (a ``ValueError``) for an invalid field, an unknown key,
or an unknown preset; the message names the field, key or preset and the valid ones.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, ClassVar

from oelm.errors import ConfigError

__all__ = ["GPTConfig", "PRESETS", "gpt_config"]


_POSITIVE_INTS = (
    "vocab_size",
    "context_length",
    "num_layers",
    "num_heads",
    "hidden_size",
    "intermediate_size",
    "num_labels",
)


@dataclass
class GPTConfig:
    """Hyper-parameters of :class:`oelm.models.gpt.GPTModel` and its heads. Validated on construction.

    Raises:
        ConfigError: a size is not a positive int, ``hidden_size`` is not divisible by
            ``num_heads``, ``dropout`` is not a number in [0, 1), ``layer_norm_eps`` is not a
            number > 0, ``bias``/``tie_word_embeddings`` is not a bool, or ``pad_token_id`` is
            outside [0, vocab_size).
    """

    vocab_size: int = 50304  # GPT-2's 50257 rounded up to a multiple of 64 (faster matmuls)
    context_length: int = 512  # max sequence length; learned position embeddings
    num_layers: int = 6
    num_heads: int = 8
    hidden_size: int = 512
    intermediate_size: int = 2048  # d_ff of the MLP, usually 4 * hidden_size
    dropout: float = 0.0  # embeddings, attention probabilities, residual branches
    bias: bool = True  # biases in linears and layer norms
    layer_norm_eps: float = 1e-5
    num_labels: int = 2  # used by GPTForSequenceClassification only
    pad_token_id: int | None = None  # lets the classifier find the last real token without a mask
    tie_word_embeddings: bool = True  # lm_head shares the token-embedding matrix
    model_type: ClassVar[str] = "oelm-gpt"  # the architecture registry's key (oelm.architectures)

    def __post_init__(self) -> None:
        for name in _POSITIVE_INTS:
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
                raise ConfigError(f"GPTConfig.{name} must be a positive int, got {value!r}")
        if self.hidden_size % self.num_heads != 0:
            raise ConfigError(
                f"GPTConfig.hidden_size={self.hidden_size} is not divisible by "
                f"num_heads={self.num_heads}; pick hidden_size as a multiple of num_heads"
            )
        for name in ("dropout", "layer_norm_eps"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                raise ConfigError(f"GPTConfig.{name} must be a number, got {type(value).__name__} {value!r}")
        if not 0.0 <= float(self.dropout) < 1.0:
            raise ConfigError(f"GPTConfig.dropout must be in [0, 1), got {self.dropout!r}")
        if not float(self.layer_norm_eps) > 0.0:
            raise ConfigError(f"GPTConfig.layer_norm_eps must be > 0, got {self.layer_norm_eps!r}")
        for name in ("bias", "tie_word_embeddings"):
            if not isinstance(getattr(self, name), bool):
                raise ConfigError(f"GPTConfig.{name} must be true or false, got {getattr(self, name)!r}")
        if self.pad_token_id is not None and (
            isinstance(self.pad_token_id, bool)
            or not isinstance(self.pad_token_id, int)
            or not 0 <= self.pad_token_id < self.vocab_size
        ):
            raise ConfigError(
                f"GPTConfig.pad_token_id must be None or an int in [0, vocab_size={self.vocab_size}), "
                f"got {self.pad_token_id!r}"
            )

    @property
    def head_dim(self) -> int:
        """Width of one attention head, ``hidden_size // num_heads``."""
        return self.hidden_size // self.num_heads

    def to_dict(self) -> dict[str, Any]:
        """Plain dict of every field (YAML/JSON friendly)."""
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> GPTConfig:
        """Build from a dict such as :meth:`to_dict` returns; missing keys take the defaults.

        Raises:
            ConfigError: a key is not a GPTConfig field (named in the message), or a value
                fails validation.
        """
        _check_keys(data, "GPTConfig")
        return cls(**data)

    def replace(self, **overrides: Any) -> GPTConfig:
        """A copy with ``overrides`` applied (and re-validated); this config is not modified.

        Raises:
            ConfigError: an override key is not a GPTConfig field (named in the message), or a
                value fails validation.
        """
        _check_keys(overrides, "GPTConfig override")
        return dataclasses.replace(self, **overrides)


def _check_keys(keys: Any, where: str) -> None:
    valid = [f.name for f in dataclasses.fields(GPTConfig)]
    unknown = sorted(k for k in keys if k not in valid)
    if unknown:
        raise ConfigError(
            f"unknown {where} key(s) {', '.join(map(repr, unknown))}; valid keys: {', '.join(valid)}"
        )


PRESETS: dict[str, GPTConfig] = {
    # The original OELM project's model.
    "gpt-medium-512": GPTConfig(
        context_length=512, num_layers=6, num_heads=8, hidden_size=512, intermediate_size=2048
    ),
    # Small enough to train on a laptop CPU.
    "gpt-tiny": GPTConfig(
        context_length=256, num_layers=4, num_heads=4, hidden_size=128, intermediate_size=512
    ),
}


def gpt_config(preset: str, **overrides: Any) -> GPTConfig:
    """A fresh copy of ``PRESETS[preset]`` with ``overrides`` applied (and re-validated).

    Raises:
        ConfigError: unknown preset (the message lists the valid ones), unknown override key
            (named), or an override that fails validation.
    """
    if preset not in PRESETS:
        raise ConfigError(f"unknown GPT preset {preset!r}; valid presets: {', '.join(PRESETS)}")
    return PRESETS[preset].replace(**overrides)
