"""Which modules of a tree went through :func:`oelm.apply_oelm`, seen from any module of it.

PyTorch modules do not know their parents, so ``apply_oelm(model.bert)`` cannot mark the model
that holds ``bert``. Instead the marks go down the tree, where every later call can find them:

* the module ``apply_oelm`` ran on carries ``oelm_config`` (with the rest of
  :data:`oelm.method.OELM_ATTRIBUTES`): a *treated* module;
* each of its submodules carries :data:`PART_OF_ATTRIBUTE`, ``(method, name inside the treated
  module)``: a plain tuple in the instance ``__dict__``, so it survives ``copy.deepcopy``, pickling
  and ``torch.save(model)`` with the tree it describes (a weak reference would not pickle, a
  reference to the treated module would make a deep copy of one layer copy the whole model).

So a holder finds a treated module among its own ``named_modules()`` (:func:`treated_modules`), and
a part of a treated tree finds its mark on itself (:func:`part_of`); :func:`treated_line` and
:func:`part_line` say what a refusal names, and :func:`oelm.merge_and_unload` removes both kinds of
mark (:func:`unmark`). A mark outlives its tree only with a part taken out of it (a layer kept after
its model is gone): that part still holds the treated weights, and is refused like one.
:func:`refuse_wrapper` names the wrapper a call got instead of the model (DistributedDataParallel,
DataParallel, FSDP, ``torch.compile``).
"""

from __future__ import annotations

from torch import nn

from oelm.errors import OELMError

__all__ = ["PART_OF_ATTRIBUTE", "mark_parts", "part_of", "treated_modules", "unmark", "refuse_wrapper", "part_line",
           "treated_line"]

#: The instance attribute on every submodule of a treated module: ``(method, name inside it)``.
PART_OF_ATTRIBUTE = "oelm_part_of"

#: The child under which a wrapper keeps the model: DistributedDataParallel / DataParallel / FSDP
#: (``module``; FSDP's own name ``_fsdp_wrapped_module``), ``torch.compile`` (``_orig_mod``).
_WRAPPER_CHILDREN = ("module", "_orig_mod", "_fsdp_wrapped_module")


def mark_parts(model: nn.Module, method: str) -> None:
    """Mark every submodule of ``model`` (the module ``apply_oelm`` just ran on) as a part of it."""
    for name, sub in model.named_modules(remove_duplicate=False):
        if name:
            vars(sub)[PART_OF_ATTRIBUTE] = (method, name)


def part_of(model: nn.Module) -> tuple[str, str] | None:
    """``(method, name of model inside the treated module)`` when ``model`` is a part of a treated tree."""
    mark = vars(model).get(PART_OF_ATTRIBUTE)
    return mark if isinstance(mark, tuple) and len(mark) == 2 else None


def treated_modules(model: nn.Module) -> list[tuple[str, nn.Module]]:
    """``(name, module)`` of every module of ``model``'s tree (``model`` itself as ``""``) that
    went through ``apply_oelm`` (carries ``oelm_config``), outermost first."""
    return [(n, m) for n, m in model.named_modules() if vars(m).get("oelm_config") is not None]


def unmark(model: nn.Module) -> None:
    """Remove :data:`PART_OF_ATTRIBUTE` from every module of ``model``'s tree."""
    for sub in model.modules():
        vars(sub).pop(PART_OF_ATTRIBUTE, None)


def refuse_wrapper(model: nn.Module, func: str) -> None:
    """Refuse a DistributedDataParallel / DataParallel / FSDP / ``torch.compile`` wrapper with one
    line: changing modules inside it would leave the wrapper's own records of them (DDP's gradient
    buckets, the compiled graph and its guards) pointing at modules that are gone.

    Raises:
        OELMError: ``model`` is such a wrapper (named, with ``unwrap it first: model.module / model._orig_mod``).
    """
    child = next((c for c in _WRAPPER_CHILDREN if c in model._modules), None)
    if isinstance(model, (nn.parallel.DistributedDataParallel, nn.DataParallel)) or child in _WRAPPER_CHILDREN[1:]:
        inner = type(model._modules[child]).__name__ if child else "model"
        raise OELMError(
            f"oelm.{func} got {type(model).__name__}, a wrapper around a {inner}: unwrap it first: model.module / "
            f"model._orig_mod (here model.{child or 'module'}), call oelm.{func} on it, then wrap it again"
        )


def part_line(model: nn.Module) -> str | None:
    """"<Class> is part of a model that went through apply_oelm ('<method>'), as its '<name>'", or
    None when ``model`` is not a part of a treated tree."""
    mark = part_of(model)
    if mark is None:
        return None
    return f"{type(model).__name__} is part of a model that went through apply_oelm ({mark[0]!r}), as its {mark[1]!r}"


def treated_line(model: nn.Module) -> str | None:
    """"<Class>[.<name> (<Class>)] already went through apply_oelm ('<method>')" for the outermost
    treated module of ``model``'s tree (``model`` itself included), or None when there is none."""
    treated = treated_modules(model)
    if not treated:
        return None
    name, inner = treated[0]
    method = getattr(inner.oelm_config, "method", inner.oelm_config)
    what = type(model).__name__ + (f".{name} ({type(inner).__name__})" if name else "")
    return f"{what} already went through apply_oelm ({method!r})"
