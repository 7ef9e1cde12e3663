"""OELM as a PEFT method: ``get_peft_model(model, OELMPeftConfig(method="oelm_freeze"))``.

``import oelm`` registers OELM with PEFT when PEFT is imported (before or after it; ``import oelm``
alone never imports PEFT: ``pip install oelm[peft]``; tested with PEFT 0.21.2), through this
module, whose import registers. Then the PEFT calls work as for LoRA::

    import oelm.peft                        # the documented name of this module, oelm.integrations.peft
    from peft import PeftModel, get_peft_model

    model = get_peft_model(base, oelm.peft.OELMPeftConfig(method="oelm_freeze", seed=0))
    model.print_trainable_parameters()      # everything but the frozen orthogonal Q/K trains
    ...                                     # train (Trainer, your loop)
    model.save_pretrained(out)              # adapter_config.json + the trained tensors only
    model = PeftModel.from_pretrained(fresh_base, out, is_trainable=True)   # Q/K regenerated, checked
    plain = model.merge_and_unload()        # the base architecture again (fused Q/K/V fused back)

What OELM is in PEFT's terms. A LoRA adapter adds small trained matrices to a frozen base; OELM
instead changes the base in place (:func:`oelm.apply_oelm`: Q/K orthogonalized per head and
frozen, fused Q/K/V split) and trains *everything else*. So the "adapter" PEFT saves is every
tensor of the model except the frozen ones (PEFT's ``save_pretrained`` stores only what trained,
as oelm's lean checkpoints do); the frozen Q/K are regenerated from the recorded method and seed
on load, and checked against the sha256 record that ``save_pretrained`` writes into
``adapter_config.json`` (``frozen``: a record that lacks a frozen tensor, an emptied one included,
is refused). ``merge_and_unload`` is :func:`oelm.merge_and_unload`. ``unload`` and disabling the
adapter are refused: OELM keeps no copy of the original Q/K.

Registration: PEFT 0.21's ``register_peft_method`` accepts only names of its own ``PeftType``
enum, which has no OELM entry; :func:`register` calls it when a PEFT version has one, and
otherwise makes the same four entries in PEFT's mappings under the strings ``"OELM"`` and
``"OELM_LORA"``, the way PEFT supports out-of-tree methods with a string ``peft_type``
(huggingface/peft#2634, #2635). PEFT has no entry points for such methods, so ``oelm/__init__``
waits for the first ``import peft`` (a one-shot ``sys.meta_path`` finder) and imports this module then.

Frozen orthogonal Q/K *plus LoRA* on V/O (PEFT's mixed adapters take only its own LoRA-family
types, so this is a two-step recipe, tested in ``tests/test_peft.py`` and
``tests/test_adapter_recipe.py``). Step 2 takes :class:`OELMLoraConfig` (every ``LoraConfig``
field), so the adapter records the base's OELM recipe and a reload checks it, or applies it to a
fresh base::

    oelm.apply_oelm(base, "oelm_freeze", seed=0)                       # 1. Q/K orthogonal, frozen
    model = get_peft_model(base, oelm.peft.OELMLoraConfig(target_modules=["value", "attention.output.dense"]))  # 2. LoRA
    model.save_pretrained(out)                                         # the LoRA adapter + the OELM recipe
    model = PeftModel.from_pretrained(fresh_base, out)                 # the recorded step 1, checked, then LoRA
"""

from __future__ import annotations

import copy
import re
from dataclasses import dataclass, field
from typing import Any, Optional

import torch
from peft import LoraConfig, LoraModel, PeftConfig, get_peft_model
from peft.tuners.tuners_utils import BaseTuner, BaseTunerLayer
from torch import nn

from oelm.checkpoint.common import check_frozen, mismatch_causes, oelm_config_from, regenerate
from oelm.errors import CheckpointError, ConfigError
from oelm.integrations.lora import LORA_KEYS, lora_target_message, lora_target_problems
from oelm.method.apply import apply_oelm
from oelm.method.checkpoint_record import RECIPE_FORMAT, own_layout, recipe_of, tensor_sha256
from oelm.method.marks import treated_modules
from oelm.method.config import METHODS, OELMConfig, get_method
from oelm.method.merge import merge_and_unload
from oelm.method.parameters import ParameterReport, parameter_report

__all__ = ["OELM_PEFT_TYPE", "OELM_LORA_PEFT_TYPE", "OELMPeftConfig", "OELMModel", "OELMLoraConfig", "OELMLoraModel",
           "register", "add_lora"]

OELM_PEFT_TYPE = "OELM"
OELM_LORA_PEFT_TYPE = "OELM_LORA"


@dataclass
class OELMPeftConfig(PeftConfig):
    """The PEFT config of an OELM method (``peft_type="OELM"``); ``metadata["help"]`` documents each field.

    Raises:
        ConfigError: unknown method, a seed that is not a non-negative int or None, a field of the
            wrong type, a ``frozen`` record that is not ``{name: {dtype, shape, sha256}}`` (a
            damaged adapter_config.json: one line naming the field).
    """

    method: str = field(default="oelm_freeze", metadata={"help": f"An OELM method name: {', '.join(METHODS)}."})
    seed: Optional[int] = field(
        default=0, metadata={"help": "Seed of the method's random draws; the frozen Q/K are regenerated from it on load."}
    )
    target_modules: Optional[dict] = field(
        default=None,
        metadata={"help": "For a model no oelm registry entry knows: {'query': 'q_proj', 'key': 'k_proj'} or "
                          "{'qkv': 'c_attn', 'layout': 'qkv_conv1d'} (see oelm.apply_oelm)."},
    )
    num_heads: Optional[int] = field(default=None, metadata={"help": "Query heads, with target_modules, when the config has none."})
    frozen: Optional[dict] = field(
        default=None,
        metadata={"help": "Written by save_pretrained: {name: {dtype, shape, sha256}} of every frozen tensor, "
                          "checked when the adapter is loaded."},
    )
    torch_version: Optional[str] = field(default=None, metadata={"help": "Written by save_pretrained: torch's version."})

    def __post_init__(self) -> None:
        super().__post_init__()
        self.peft_type = OELM_PEFT_TYPE
        if not isinstance(self.method, str):
            raise ConfigError(f"OELMPeftConfig.method must be a method name ({', '.join(METHODS)}), got {self.method!r}")
        get_method(self.method)  # unknown name -> ConfigError naming the closest one
        if self.seed is not None and (isinstance(self.seed, bool) or not isinstance(self.seed, int) or self.seed < 0):
            raise ConfigError(f"OELMPeftConfig.seed must be None or a non-negative int, got {self.seed!r}")
        problem = _field_problem(self)
        if problem:
            raise ConfigError(f"OELMPeftConfig.{problem}; if it came from an adapter's adapter_config.json, the file is "
                              "damaged: save the adapter again from the trained model (model.save_pretrained)")

    @classmethod
    def from_pretrained(cls, pretrained_model_name_or_path: str, subfolder: str | None = None,
                        **kwargs: Any) -> "OELMPeftConfig":
        """PEFT's ``from_pretrained`` (an adapter's ``adapter_config.json``), the folder kept on the
        instance (``_read_from``, not a field): a config read from a file must carry its ``frozen``
        record when loaded, one made in this process (Trainer's resume loads into it) need not."""
        config = super().from_pretrained(pretrained_model_name_or_path, subfolder=subfolder, **kwargs)
        vars(config)["_read_from"] = str(pretrained_model_name_or_path)
        return config

    def oelm_config(self) -> OELMConfig:
        """The :class:`~oelm.method.OELMConfig` this applies: the named method with ``seed``."""
        return get_method(self.method).replace(seed=self.seed)


_SHA256 = re.compile(r"^[0-9a-f]{64}$")


def _record_problem(frozen: Any) -> str | None:
    """Why ``frozen`` is not a ``{name: {"dtype": str, "shape": [int, ...], "sha256": 64 hex}}`` record, or None."""
    if not isinstance(frozen, dict):
        return f"is a {type(frozen).__name__}, not a mapping of tensor names"
    for name, rec in frozen.items():
        shape = rec.get("shape") if isinstance(rec, dict) else None
        if not (isinstance(rec, dict) and isinstance(rec.get("dtype"), str) and isinstance(shape, list)
                and all(isinstance(n, int) and not isinstance(n, bool) and n >= 0 for n in shape)
                and isinstance(rec.get("sha256"), str) and _SHA256.match(rec["sha256"])):
            return f"entry {name!r} is {rec!r}, not {{'dtype': str, 'shape': [int, ...], 'sha256': 64 hex digits}}"
    return None


def _field_problem(config: "OELMPeftConfig") -> str | None:
    """The first field of ``config`` (besides method and seed) whose type does not fit, as a clause."""
    if config.target_modules is not None and not isinstance(config.target_modules, dict):
        return f"target_modules must be None or a mapping, got {config.target_modules!r}"
    heads = config.num_heads
    if heads is not None and (isinstance(heads, bool) or not isinstance(heads, int) or heads < 1):
        return f"num_heads must be None or a positive int, got {heads!r}"
    if config.torch_version is not None and not isinstance(config.torch_version, str):
        return f"torch_version must be None or a str, got {config.torch_version!r}"
    problem = None if config.frozen is None else _record_problem(config.frozen)
    return None if problem is None else f"frozen {problem}"


def _tuner_of(model: nn.Module) -> "OELMModel":
    return model if isinstance(model, OELMModel) else model.base_model


def _frozen_names(model: nn.Module) -> set[str]:
    """Names (relative to ``model``: a PeftModel or the tuner) of the parameters OELM froze."""
    tuner = _tuner_of(model)
    frozen = {id(p) for n, p in tuner.model.named_parameters() if n in tuner.oelm_frozen}
    return {n for n, p in model.named_parameters(remove_duplicate=False) if id(p) in frozen}


class OELMModel(BaseTuner):
    """The PEFT tuner of :class:`OELMPeftConfig` (built by ``get_peft_model``, not by hand).

    Injection is :func:`oelm.apply_oelm` with the config's method and seed; ``oelm_frozen`` holds
    the names of the parameters it froze. One OELM adapter per model: a second would mix two
    methods on the same weights.
    """

    prefix = "oelm_"
    tuner_layer_cls = BaseTunerLayer
    target_module_mapping: dict[str, list[str]] = {}

    def inject_adapter(self, model: nn.Module, adapter_name: str, autocast_adapter_dtype: bool = True,
                       low_cpu_mem_usage: bool = False, state_dict: dict | None = None) -> None:
        config = self.peft_config[adapter_name]
        if len(self.peft_config) > 1:
            raise ValueError(f"an OELM model has one adapter; got {sorted(self.peft_config)}")
        report = apply_oelm(model, config.oelm_config(), target_modules=config.target_modules, num_heads=config.num_heads)
        self.oelm_frozen = tuple(n for n, p in model.named_parameters() if not p.requires_grad)
        self.targeted_module_names = sorted({p["module"] for p in report.projections})
        if config.inference_mode:
            for p in model.parameters():
                p.requires_grad_(False)

    def _create_and_replace(self, *args: Any, **kwargs: Any) -> None:  # pragma: no cover - inject_adapter is overridden
        raise NotImplementedError("OELM changes the model in place (oelm.apply_oelm); it replaces no module")

    def _mark_only_adapters_as_trainable(self, model: nn.Module) -> None:
        """OELM's trainable set is everything but the frozen Q/K; apply_oelm already set it."""

    @classmethod
    def _get_adapter_state_dict(cls, model: nn.Module, config: OELMPeftConfig, adapter_name: str,
                                state_dict: dict[str, torch.Tensor], unwanted_adapter_names: list[str]) -> dict[str, torch.Tensor]:
        """What PEFT saves: every tensor but the frozen ones (a tied weight once). Records the frozen
        tensors' sha256 in ``config.frozen``, which PEFT writes to ``adapter_config.json`` next."""
        state_dict = own_layout(model, state_dict)  # the treated base's hook wrote the stock layout: its names again
        frozen = _frozen_names(model)
        params = dict(model.named_parameters(remove_duplicate=False))
        first = {id(p): n for n, p in reversed(list(params.items()))}  # the first name of each tensor
        keep = {k: v for k, v in state_dict.items() if k not in frozen and (k not in params or first[id(params[k])] == k)}
        config.frozen = {n: {"dtype": str(params[n].dtype), "shape": list(params[n].shape), "sha256": tensor_sha256(params[n])}
                         for n in sorted(frozen) if first[id(params[n])] == n}
        config.torch_version = torch.__version__
        return keep

    @classmethod
    def _remove_adapter_name_from_key(cls, key: str, adapter_name: str) -> str:
        return key  # OELM's tensors are the model's own: no adapter name in their keys

    @classmethod
    def _remap_adapter_state_dict_for_load(cls, model: nn.Module, config: OELMPeftConfig, adapter_name: str,
                                           state_dict: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """Before PEFT loads the saved tensors: the regenerated frozen tensors must match the record.

        ``config`` is the one read from the adapter's file (``PeftModel.from_pretrained``), or the live
        one when ``load_adapter`` loads into an existing adapter (Trainer's resume): without a record
        then (made in this process, never saved) nothing is checked, as the live model's frozen
        tensors are its own and the file holds none.

        Raises:
            CheckpointError: the record names a tensor the model does not freeze, or lacks one it
                freezes (an emptied or removed record of a file included).
            CheckpointMismatchError: a regenerated tensor differs (named, with the likely causes).
        """
        recorded, frozen, read_from = config.frozen or {}, _frozen_names(model), vars(config).get("_read_from")
        missing, unknown = sorted(frozen - set(recorded)), sorted(set(recorded) - frozen)
        if missing and (read_from is not None or recorded):  # a config made here (Trainer's resume) has no record yet
            what = "no frozen tensors" if not recorded else f"no entry for {len(missing)} of them ({missing[0]!r} ...)"
            raise CheckpointError(
                f"{read_from or '.'}/adapter_config.json's 'frozen' record has {what}, but {config.method!r} froze "
                f"{len(frozen)}: nothing "
                "checks that this base regenerates the Q/K the adapter was trained with (the record was emptied or "
                "edited). Fix: save the adapter again from the trained model (model.save_pretrained)")
        if unknown:
            raise CheckpointError(f"adapter_config.json records frozen tensor(s) {unknown[:5]} that this model "
                                  f"with {config.method!r} does not freeze; load it onto the base it was trained from")
        if recorded:
            params = dict(model.named_parameters(remove_duplicate=False))
            causes = mismatch_causes(None, config.oelm_config(), config.torch_version)
            check_frozen(params, recorded, config.oelm_config(), causes)
        return state_dict

    def _unload_and_optionally_merge(self, merge: bool = True, progressbar: bool = False, safe_merge: bool = False,
                                     adapter_names: list[str] | None = None) -> nn.Module:
        if not merge:
            raise ValueError(
                "OELM changed the base weights in place (orthogonalized Q/K) and keeps no copy of the original ones, "
                "so unload() cannot give the original base back; use merge_and_unload() for the trained plain model"
            )
        return merge_and_unload(self.model)

    def _enable_adapter_layers(self, enabled: bool = True) -> None:
        if not enabled:
            raise ValueError("OELM cannot be disabled: it changed the base weights in place and keeps no copy of "
                             "the original Q/K (disable_adapter, disable_adapter_layers)")

    def set_adapter(self, adapter_name: str | list[str], inference_mode: bool = False) -> None:
        if adapter_name not in (self.active_adapter, [self.active_adapter]):
            raise ValueError(f"an OELM model has one adapter ({self.active_adapter!r}), got {adapter_name!r}")


# ---------------------------------------------------------------- frozen orthogonal Q/K + LoRA


@dataclass
class OELMLoraConfig(LoraConfig):
    """PEFT's ``LoraConfig`` for a model that went through :func:`oelm.apply_oelm` (step 2 of the
    frozen-Q/K-plus-LoRA recipe; ``peft_type="OELM_LORA"``): every LoRA field as in ``LoraConfig``,
    and ``oelm``, the OELM recipe of the base the adapter trains on, recorded by ``get_peft_model``
    (while the method's frozen flags are still set: LoRA then freezes the whole base) and written
    to ``adapter_config.json``::

        {"module": "" (the module apply_oelm ran on, in the base model), "recipe": {...}}

    where ``recipe`` is :func:`oelm.method.checkpoint_record.recipe_of` that module (method config
    and seed, sha256 of every frozen tensor, split fused modules). ``PeftModel.from_pretrained``
    then checks the base against it before LoRA goes in (:class:`OELMLoraModel`): a fresh base gets
    the recorded method and seed applied, a base that went through ``apply_oelm`` must be the same
    method at the same module, and every frozen tensor must have its recorded sha256. A stock
    ``LoraConfig`` adapter cannot carry this: PEFT runs no oelm code when it saves or loads one.

    Raises:
        ConfigError: an ``oelm`` entry that is not ``{"module": str, "recipe": an oelm-recipe with a
            frozen record}`` (a damaged adapter_config.json: one line naming the field; a record that
            lacks a tensor the method freezes is refused on load).
    """

    oelm: Optional[dict] = field(
        default=None,
        metadata={"help": "Written by get_peft_model: {'module': where apply_oelm ran, 'recipe': the OELM recipe "
                          "(method, seed, frozen tensors' sha256)}, checked when the adapter is loaded."},
    )

    def __post_init__(self) -> None:
        super().__post_init__()
        self.peft_type = OELM_LORA_PEFT_TYPE
        if self.oelm is None:
            return
        entry, recipe = self.oelm, self.oelm.get("recipe") if isinstance(self.oelm, dict) else None
        problem = ("is not a mapping" if not isinstance(entry, dict) else
                   "has no 'module' name" if not isinstance(entry.get("module"), str) else
                   f"has no {RECIPE_FORMAT} 'recipe'" if not isinstance(recipe, dict) or recipe.get("format") != RECIPE_FORMAT
                   else "has no 'oelm_config' mapping" if not isinstance(recipe.get("oelm_config"), dict) else None)
        record = None if problem else _record_problem(recipe["frozen"])
        problem = problem or (None if record is None else f"frozen {record}")
        if problem:
            raise ConfigError(f"OELMLoraConfig.oelm {problem}; if it came from an adapter's adapter_config.json, the "
                              "file is damaged: save the adapter again from the trained model (model.save_pretrained)")


class OELMLoraModel(LoraModel):
    """PEFT's LoRA tuner for :class:`OELMLoraConfig` (built by ``get_peft_model`` /
    ``PeftModel.from_pretrained``): before LoRA goes in, a new adapter records the base's OELM
    recipe, a loaded one checks (or applies) it (:func:`_base_fits_the_recipe`)."""

    def inject_adapter(self, model: nn.Module, adapter_name: str, autocast_adapter_dtype: bool = True,
                       low_cpu_mem_usage: bool = False, state_dict: dict | None = None) -> None:
        config = self.peft_config[adapter_name]
        if config.oelm is None:  # a second adapter shares the first one's record: LoRA has frozen the whole base since
            known = [c.oelm for name, c in self.peft_config.items() if name != adapter_name and getattr(c, "oelm", None)]
            config.oelm = copy.deepcopy(known[0]) if known else _recipe_entry(model)
        else:
            _base_fits_the_recipe(model, config.oelm)
        super().inject_adapter(model, adapter_name, autocast_adapter_dtype=autocast_adapter_dtype,
                               low_cpu_mem_usage=low_cpu_mem_usage, state_dict=state_dict)


def _recipe_entry(model: nn.Module) -> dict[str, Any]:
    """``{"module", "recipe"}`` of the one module of ``model`` that went through ``apply_oelm``.

    Raises:
        ConfigError: no module of ``model`` went through ``apply_oelm``.
    """
    treated = treated_modules(model)
    if not treated:
        raise ConfigError(f"OELMLoraConfig is for a model that went through oelm.apply_oelm, and no module of this "
                          f"{type(model).__name__} did. Fix: oelm.apply_oelm(model, 'oelm_freeze', seed=0) first, or "
                          "peft.LoraConfig for LoRA alone")
    name, module = treated[0]
    return {"module": name, "recipe": recipe_of(module)}


def _base_fits_the_recipe(model: nn.Module, entry: dict[str, Any]) -> None:
    """Check ``model`` (the base ``PeftModel.from_pretrained`` got) against an adapter's recorded
    recipe: a base with no OELM anywhere gets the recorded method and seed applied at the recorded
    module; one that went through ``apply_oelm`` must have the recorded method there; then every
    recorded frozen tensor must have its recorded dtype, shape and sha256.

    Raises:
        CheckpointError: the recorded module is missing, the base carries another method or
            carries it elsewhere (one line naming both and the fix), or the record lacks a tensor
            the method froze (an emptied record).
        CheckpointMismatchError: a frozen tensor differs (named, with the likely causes).
    """
    where, recipe = entry["module"], entry["recipe"]
    config = oelm_config_from(recipe, "adapter_config.json")
    treated = treated_modules(model)
    fix = "load it onto a fresh base model (the adapter applies its recorded method) or one treated exactly so"
    if not treated:
        try:
            target = model.get_submodule(where)
        except AttributeError:
            raise CheckpointError(f"adapter_config.json's OELM recipe was applied to module {where!r}, which this "
                                  f"{type(model).__name__} lacks; load the adapter onto the base it was trained on") from None
        regenerate(target, config, recipe.get("architecture"), "adapter_config.json")
        origin = "regenerated by"
    else:
        name, target = treated[0]
        if name != where or target.oelm_config.to_dict() != config.to_dict():
            raise CheckpointError(
                f"the adapter was trained on a base with {config.method!r} (seed {config.seed}) applied at {where!r}, "
                f"but this base went through apply_oelm with {target.oelm_config.method!r} (seed "
                f"{target.oelm_config.seed}) at {name!r}; {fix}")
        origin = "of this base for"
    params = dict(target.named_parameters())
    unknown = sorted(set(recipe["frozen"]) - set(params))
    if unknown:
        raise CheckpointError(f"adapter_config.json records frozen tensor(s) {unknown[:3]} that this base's "
                              f"{type(target).__name__} does not have; load the adapter onto the base it was trained on")
    missing = sorted(n for n, p in params.items() if not p.requires_grad and n not in recipe["frozen"])
    if missing:  # the method's frozen flags, before LoRA freezes the whole base
        raise CheckpointError(
            f"adapter_config.json's OELM recipe has no 'frozen' entry for {len(missing)} tensor(s) {config.method!r} "
            f"froze ({missing[0]!r} ...): nothing checks that this base has the Q/K the adapter was trained with (the "
            "record was emptied or edited). Fix: save the adapter again from the trained model (model.save_pretrained)")
    causes = mismatch_causes(None, config, recipe.get("versions", {}).get("torch"))
    check_frozen(params, recipe["frozen"], config, causes, origin)


def add_lora(model: nn.Module, lora: dict[str, Any], report: ParameterReport | None = None) -> tuple[nn.Module, ParameterReport]:
    """Step 2 of the frozen-Q/K-plus-LoRA recipe: PEFT's LoRA (:class:`OELMLoraConfig` ``(**lora)``,
    so the adapter records the OELM recipe; ``LoraConfig`` for a model no ``apply_oelm`` touched) on
    a model ``apply_oelm`` already changed. LoRA freezes every base parameter (the frozen Q/K stay frozen)
    and trains its matrices and ``modules_to_save``. Returns the PEFT model and its parameter
    report (``report``'s method name and Q/K projections kept).

    Raises:
        ConfigError: a field LoraConfig does not know, a value it refuses, or a ``target_modules`` /
            ``modules_to_save`` entry that names no module of ``model`` (the message names it).
    """
    unknown = sorted(set(lora) - LORA_KEYS)
    if unknown:
        raise ConfigError(f"lora: unknown field(s) {unknown}; allowed: {sorted(LORA_KEYS)}")
    # a model that went through apply_oelm gets OELMLoraConfig: the adapter then records its OELM recipe
    config_cls = OELMLoraConfig if treated_modules(model) else LoraConfig
    try:  # a copy: PEFT extends modules_to_save in place (SEQ_CLS adds classifier, score), and a matrix reuses `lora`
        config = config_cls(**copy.deepcopy(lora))
    except (TypeError, ValueError) as exc:
        raise ConfigError(f"lora: {exc}") from None
    names = [name for name, _ in model.named_modules()]
    problems = lora_target_problems(lora, names)
    if problems:  # PEFT refuses only a target_modules that matches nothing at all
        raise ConfigError(lora_target_message(problems, names, type(model).__name__))
    wrapped = get_peft_model(model, config)
    new = parameter_report(wrapped, method=report.method if report is not None else "")
    new.projections = report.projections if report is not None else []
    return wrapped, new


def register() -> None:
    """Register OELM and OELM+LoRA with PEFT (idempotent; run when this module is imported, which
    ``import oelm`` arranges for the first ``import peft``): PEFT's own ``register_peft_method``
    when its ``PeftType`` has the name, else the same mapping entries under the strings ``"OELM"``
    and ``"OELM_LORA"`` (see the module docstring)."""
    from peft.mapping import PEFT_TYPE_TO_CONFIG_MAPPING, PEFT_TYPE_TO_PREFIX_MAPPING, PEFT_TYPE_TO_TUNER_MAPPING
    from peft.utils import PeftType, register_peft_method

    for name, config_cls, model_cls in ((OELM_PEFT_TYPE, OELMPeftConfig, OELMModel),
                                        (OELM_LORA_PEFT_TYPE, OELMLoraConfig, OELMLoraModel)):
        if PEFT_TYPE_TO_CONFIG_MAPPING.get(name) is config_cls:
            continue
        if name in PeftType.__members__:
            register_peft_method(name=name.lower(), config_cls=config_cls, model_cls=model_cls, prefix=model_cls.prefix)
            continue
        PEFT_TYPE_TO_CONFIG_MAPPING[name] = config_cls
        PEFT_TYPE_TO_TUNER_MAPPING[name] = model_cls
        PEFT_TYPE_TO_PREFIX_MAPPING[name] = model_cls.prefix


register()
