"""The ``SentenceTransformer`` adapter methods, extended to medadapt heads and adapter folders: :func:`install`
wraps them so a medadapt head config, head name or adapter folder goes to :mod:`.api` / :mod:`.files`, anything
else to the original (PEFT) method. Above both modules, so neither needs the other to dispatch.
"""

from __future__ import annotations

import functools

from sentence_transformers import SentenceTransformer

from medadapt.adapters.api import (_peft_loaded, adapter_locations, adapter_names, add_adapter, get_adapter,
                                   set_active)
from medadapt.adapters.files import is_adapter_folder, load_adapter
from medadapt.adapters.types import adapter_type_of
from medadapt.errors import ConfigError

__all__ = ["install"]

_METHODS = ("add_adapter", "set_adapter", "enable_adapters", "disable_adapters", "active_adapters",
            "active_adapter", "load_adapter", "delete_adapter", "get_adapter_state_dict")


def _wrap(name: str, original):
    """The ``SentenceTransformer`` method ``name``: medadapt heads here, everything else to ``original``."""

    def ours(model, value) -> bool:
        if name == "add_adapter":
            return adapter_type_of(value) is not None
        if name == "load_adapter":
            return value is not None and is_adapter_folder(value)
        values = value if isinstance(value, (list, tuple)) else [value]
        mine = adapter_names(model)
        return bool(values) and all(v in mine for v in values)

    if name in ("add_adapter", "load_adapter", "set_adapter", "delete_adapter", "get_adapter_state_dict"):
        @functools.wraps(original)
        def method(self, *args, **kwargs):
            key = {"add_adapter": "adapter_config", "load_adapter": "peft_model_id"}.get(name, "adapter_name")
            value = args[0] if args else kwargs.get(key, kwargs.get("adapter_name"))
            if name == "get_adapter_state_dict" and value is None:
                value = next(iter(self.active_adapters()), None)
            if not ours(self, value):
                if name in ("set_adapter", "delete_adapter", "get_adapter_state_dict") and not _peft_loaded(self):
                    raise ConfigError(f"no adapter named {value!r} (adapters: {adapter_names(self) or 'none'})")
                return original(self, *args, **kwargs)
            rest = list(args[1:])
            if name == "add_adapter":
                return add_adapter(self, value, *rest, **{k: v for k, v in kwargs.items() if k != key})
            if name == "load_adapter":
                return load_adapter(self, value, *rest, **{k: v for k, v in kwargs.items() if k != key})
            if name == "set_adapter":
                names = list(value) if isinstance(value, (list, tuple)) else [value]
                return set_active(self, names)
            if name == "delete_adapter":
                for n in (value if isinstance(value, (list, tuple)) else [value]):
                    for _, stack in list(adapter_locations(self)):
                        if n in stack.heads:
                            stack.remove(n)
                return None
            head = get_adapter(self, value)  # get_adapter_state_dict
            return {k: v for k, v in head.state_dict().items()}
        return method

    if name in ("enable_adapters", "disable_adapters"):
        @functools.wraps(original)
        def toggle(self, *args, **kwargs):
            stacks = list(adapter_locations(self))
            if not stacks and not _peft_loaded(self):
                raise ConfigError("the model has no adapters")
            for _, stack in stacks:
                stack.enabled = name == "enable_adapters"
            if _peft_loaded(self):
                return original(self, *args, **kwargs)
            return None
        return toggle

    @functools.wraps(original)
    def active(self, *args, **kwargs):  # active_adapters / active_adapter
        mine = [n for _, stack in adapter_locations(self) for n in stack.active]
        peft = list(original(self)) if _peft_loaded(self) and name == "active_adapters" else []
        if name == "active_adapter":
            if mine:
                return mine[0]
            if _peft_loaded(self):
                return original(self, *args, **kwargs)
            raise ConfigError("the model has no active adapter")
        return mine + [p for p in peft if p not in mine]
    return active


def install() -> None:
    """Extend ``SentenceTransformer``'s adapter methods to medadapt heads (idempotent)."""
    if getattr(SentenceTransformer, "_medadapt_adapters_installed", False):
        return
    for name in _METHODS:
        original = getattr(SentenceTransformer, name)
        setattr(SentenceTransformer, name, _wrap(name, original))
    SentenceTransformer._medadapt_adapters_installed = True
