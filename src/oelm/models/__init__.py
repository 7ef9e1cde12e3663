"""Models trained with OELM: a small GPT (decoder-only transformer) with separate q/k/v/o projections.

Pretrained Hugging Face checkpoints are loaded by :mod:`oelm.models.pretrained`.
"""

from oelm.models.gpt import *  # noqa: F401,F403 - re-export; the public names are listed once, in gpt.__all__
from oelm.models.gpt import __all__  # noqa: F401
