"""The names of oelm's Q/K init kinds, importable without torch.

A config's ``init:`` is checked against them in the config's keys-and-types pass, which runs
before torch loads (a typo is one line in a fraction of a second: :mod:`oelm.config`). The kinds
themselves (function, source, whether they draw random numbers) are the table
:data:`oelm.init.INITS`, which refuses on import to define other names or another order than
these: a new kind is added there and named here.
"""

from __future__ import annotations

from typing import Literal

__all__ = ["INIT_NAMES", "InitName"]

#: The init kinds of :data:`oelm.init.INITS`, in its order (the docs list them so).
INIT_NAMES: tuple[str, ...] = ("none", "orthogonalize", "orthogonalize_rescaled", "polar", "random_orthogonal",
                               "global_orthogonal", "normal", "mimetic")
#: ``Literal`` of :data:`INIT_NAMES`: the type of ``OELMConfig.init`` and of a config's ``init:``.
InitName = Literal[INIT_NAMES]  # type: ignore[valid-type]
